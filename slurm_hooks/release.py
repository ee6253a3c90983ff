"""The releaser: started detached by `medic-prolog` after it refused a node, and by
medic-healthd after it requeued a resilient job off a faulty node.

Slurm requeues a job whose prolog failed but holds it (Reason=launch_failed_requeued_held,
Priority=0), and delays any requeued job by cred_expire + 1 s (BeginTime); once that has
passed, nothing wakes the main scheduler, so the job waits for the next backfill cycle too
(bf_interval, 30 s by default). This waits (bounded) for the job to come back PENDING with
one more restart than `--restarts`, releases it if held, and makes it eligible now; the
faulty node is drained, so the job lands elsewhere. It waits REVOKE_GRACE after the requeue
first: a node of the old allocation refuses credentials issued in the second it revoked the
old one. A job held for any other reason, already running, or never requeued is left alone.

    python -m slurm_hooks.release --job 1234 --restarts 0
"""

from __future__ import annotations

import argparse
import sys
import time

from medic_core.config import ConfigError, load_config
from medic_core.settings import HookSettings
from medic_core.slurm import JobInfo, SlurmClient, SlurmError

# Once here the job will not be held for the prolog failure any more. RUNNING is not among
# them: the job still RUNs (Reason=Prolog) while the prolog that started us finishes.
FINAL_STATES = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
     "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)  # fmt: skip


def held_by_prolog_failure(job: JobInfo) -> bool:
    """squeue --json says state_reason "JobHeldUser" with this description; scontrol says
    Reason=launch_failed_requeued_held."""
    text = f"{job.reason} {job.description}".lower().replace("_", " ")
    return job.state == "PENDING" and "launch failed requeued held" in text


# Slurm's cred.c: a credential is revoked when `cred->ctime <= j->revoked`, both time_t
# (whole seconds): a new one issued in the second of the revocation would be refused.
REVOKE_GRACE = 2.0


def requeued_for_later(job: JobInfo, restarts_before: int | None) -> bool:
    """Requeued since the releaser was started (one more restart) and waiting on the
    BeginTime Slurm gives every requeued job."""
    return (
        restarts_before is not None
        and job.state == "PENDING"
        and job.restart_count > restarts_before
        and not job.held
        and job.reason == "BeginTime"
    )


def release_when_held(
    client: SlurmClient,
    job_id: str,
    wait: float,
    poll: float = 0.25,
    restarts_before: int | None = None,
) -> tuple[str, str]:
    """(action, one line): action is "released", "made_eligible" or "left_alone"."""
    started = time.monotonic()
    deadline = started + wait
    while time.monotonic() < deadline:
        try:
            jobs = client.jobs([job_id])
        except SlurmError as exc:
            return "left_alone", f"job {job_id}: cannot read it: {exc}"
        if not jobs:
            return "left_alone", f"job {job_id}: gone"
        job = jobs[0]
        if held_by_prolog_failure(job):
            client.release(job_id)
            client.start_now(job_id)
            return "released", f"job {job_id}: released after Medic refused its node"
        waited = time.monotonic() - started
        if requeued_for_later(job, restarts_before) and waited >= REVOKE_GRACE:
            client.start_now(job_id)
            return "made_eligible", f"job {job_id}: requeued by Medic, made eligible now"
        if job.state in FINAL_STATES:
            return "left_alone", f"job {job_id}: {job.state}, nothing to release"
        again = restarts_before is not None and job.restart_count > restarts_before
        if again and job.state == "RUNNING":
            return "left_alone", f"job {job_id}: running again"
        time.sleep(poll)  # waiting on slurmctld; there is no event to wait on
    return "left_alone", f"job {job_id}: not held within {wait:g}s, left alone"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_hooks.release")
    parser.add_argument("--job", required=True)
    parser.add_argument(
        "--restarts", type=int, help="the job's restart count before Medic requeued it"
    )
    args = parser.parse_args(argv)
    try:
        config = load_config()
        settings = HookSettings.from_config(config)
    except ConfigError as exc:
        print(f"medic release: {exc}", file=sys.stderr)
        return 2
    from remediation.actions import record_event, slurm_client

    action, message = release_when_held(
        slurm_client(config, settings, actor="releaser"),
        args.job,
        settings.release_wait,
        restarts_before=args.restarts,
    )
    print(message)
    record_event(
        config,
        {
            "kind": "job_action",
            "source": "release",
            "target": f"job:{args.job}",
            "message": message,
            "evidence": {"job_id": args.job, "action": action},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The releaser: started detached by `medic-prolog` after it refused a node.

Slurm requeues a job whose prolog failed but holds it (Reason=launch_failed_requeued_held,
Priority=0) and delays it by cred_expire. This waits (bounded) for the hold, then releases
the job and makes it eligible now; the refusing node is drained, so the job lands
elsewhere. A job held for any other reason, or already running, is left alone.

    python -m slurm_hooks.release --job 1234
"""

from __future__ import annotations

import argparse
import sys
import time

from medic_core.config import ConfigError, load_config
from slurm_hooks.settings import HookSettings
from slurm_hooks.slurm import JobInfo, SlurmClient, SlurmError

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


def release_when_held(client: SlurmClient, job_id: str, wait: float, poll: float = 0.25) -> str:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            jobs = client.jobs([job_id])
        except SlurmError as exc:
            return f"job {job_id}: cannot read it: {exc}"
        if not jobs:
            return f"job {job_id}: gone"
        job = jobs[0]
        if held_by_prolog_failure(job):
            client.release(job_id)
            client.start_now(job_id)
            return f"job {job_id}: released after Medic refused its node"
        if job.state in FINAL_STATES:
            return f"job {job_id}: {job.state}, nothing to release"
        time.sleep(poll)  # waiting on slurmctld; there is no event to wait on
    return f"job {job_id}: not held within {wait:g}s, left alone"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_hooks.release")
    parser.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    try:
        config = load_config()
        settings = HookSettings.from_config(config)
    except ConfigError as exc:
        print(f"medic release: {exc}", file=sys.stderr)
        return 2
    from slurm_hooks.actions import record_event, slurm_client

    message = release_when_held(slurm_client(config, settings), args.job, settings.release_wait)
    print(message)
    record_event(
        config,
        {
            "kind": "job_action",
            "source": "release",
            "target": f"job:{args.job}",
            "message": message,
            "evidence": {"job_id": args.job},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

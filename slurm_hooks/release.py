"""The releaser: started detached by `medic-prolog` after it refused a node, and by
medic-healthd after it requeued a resilient job off a faulty node.

Slurm requeues a job whose prolog failed but holds it (Reason=launch_failed_requeued_held,
Priority=0), and delays any requeued job by cred_expire + 1 s (BeginTime); once that has
passed, nothing wakes the main scheduler, so the job waits for the next backfill cycle too
(bf_interval, 30 s by default). This waits (bounded) for the job to come back PENDING with
one more restart than `--restarts`, releases it if held, and makes it eligible now; the
faulty node is drained, so the job lands elsewhere. It makes it eligible only once
slurmctld's clock has left the second in which the job was requeued: a node of the old
allocation refuses a credential issued in the second it revoked the old one, and slurmd
then kills the job. A job held for any other reason, already running, or never requeued is
left alone.

    python -m slurm_hooks.release --job 1234 --restarts 0
"""

from __future__ import annotations

import argparse
import sys
import time

from medic_core.config import ConfigError, load_config
from medic_core.settings import HookSettings
from medic_core.slurm import CliSlurm, JobInfo, SlurmClient, SlurmError

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


# Slurm's cred.c: a credential is revoked when `cred->ctime <= j->revoked`, both slurmctld's
# time_t (whole seconds): a new one issued in the second of the revocation is refused and the
# job killed. The revocation is stamped while slurmctld handles the requeue, so once its
# clock reads a later second than it did after the requeue, a new credential is safe.
# Without slurmctld's clock (sdiag failed), this much of our own: a second and skew to spare.
REVOKE_GRACE = 2.0


class RevocationSecond:
    """Has slurmctld's clock left the second it read when the job was seen requeued?
    `second`: that second, read earlier (the releaser's first act after a requeue)."""

    def __init__(self, client: SlurmClient, second: int | None = None) -> None:
        self.client = client
        self.seen_at = time.monotonic()
        self.second = second if second is not None else self._controller_second()

    def _controller_second(self) -> int | None:
        try:
            return self.client.controller_time()
        except SlurmError:
            return None

    def passed(self) -> bool:
        if self.second is None:
            return time.monotonic() - self.seen_at >= REVOKE_GRACE
        now = self._controller_second()
        if now is None:
            return time.monotonic() - self.seen_at >= REVOKE_GRACE
        return now > self.second

    def wait(self, deadline: float, poll: float) -> bool:
        """Until it has passed or the deadline (monotonic); False: the deadline came first.
        The first look is at the local clock's next second, where slurmctld's usually is."""
        if self.second is not None and int(time.time()) <= self.second:
            time.sleep(max(0.0, min(1.0 - time.time() % 1.0 + 0.01, deadline - time.monotonic())))
        while not self.passed():
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)  # slurmctld's clock: there is no event to wait on
        return True


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
    poll: float = 0.1,
    restarts_before: int | None = None,
    requeued_second: int | None = None,
    after_requeue: bool = False,
) -> tuple[str, str]:
    """(action, one line): action is "released", "made_eligible" or "left_alone".
    `after_requeue`: Medic's daemon requeued the job (it is never held); otherwise the prolog
    refused it, and a requeued job is taken as not held only after REVOKE_GRACE: Slurm shows
    it requeued (BeginTime) a moment before it holds it. `requeued_second`: slurmctld's clock
    read after the requeue, when the caller had one."""
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
            RevocationSecond(client).wait(deadline, poll)
            client.start_now(job_id)
            return "released", f"job {job_id}: released after Medic refused its node"
        settled = after_requeue or time.monotonic() - started >= REVOKE_GRACE
        if requeued_for_later(job, restarts_before) and settled:
            if not RevocationSecond(client, requeued_second).wait(deadline, poll):
                break
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
    parser.add_argument(
        "--requeued", action="store_true", help="Slurm has requeued the job already"
    )
    args = parser.parse_args(argv)
    # slurmctld's second now, before the imports below (a loaded node takes ~0.3-1 s over
    # them): the requeue was before it, so the wait for a later second can begin at once.
    requeued_second = RevocationSecond(CliSlurm()).second if args.requeued else None
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
        requeued_second=requeued_second,
        after_requeue=args.requeued,
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

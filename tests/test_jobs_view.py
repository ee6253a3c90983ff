"""`medic jobs` counts what the decision core counts (issue 25, point 7): the restarts Medic
charged (the job's ledger in its AdminComment), beside Slurm's own restart count, which a
prolog refusal raises too; the budget allowed is the tag capped by max_restarts."""

from __future__ import annotations

from cli.admin import job_json
from medic_core.slurm import JobInfo
from remediation.decide import Ledger


def job(restart_count: int, admin_comment: str = "") -> JobInfo:
    return JobInfo("7", "train", "alice", "RUNNING", "None", "n2", True, restart_count,
                   "medic:resilient=50", admin_comment)  # fmt: skip


def test_a_job_refused_at_launch_shows_nothing_charged_and_slurms_count_apart() -> None:
    shown = job_json(job(restart_count=1), 50, [], max_restarts=20)
    assert (shown["restarts_used"], shown["slurm_restarts"]) == (0, 1)
    assert (shown["restarts_asked"], shown["restarts_allowed"]) == (50, 20)


def test_a_requeue_medic_charged_is_counted_from_the_ledger() -> None:
    ledger = Ledger(1, ("run0",)).text()
    shown = job_json(job(2, f"medic: requeued off n1 (gpu.xid.79) {ledger}"), 50, [], None)
    assert (shown["restarts_used"], shown["slurm_restarts"], shown["restarts_allowed"]) == (
        1,
        2,
        50,
    )

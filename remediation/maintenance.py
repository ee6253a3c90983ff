"""A planned maintenance window (`medic maintenance`): a Slurm maintenance reservation
(flags MAINT,IGNORE_JOBS) on the nodes from the window's start for its duration, so Slurm
starts no job there that would still run at the start; and, `lead` seconds before it, the
resilient jobs on those nodes requeued (they restart elsewhere from their last checkpoint).
Jobs that are not resilient are left to finish or to the admin, and named.

`due_requeues` is pure: the jobs on the window's nodes in, what to requeue and what to
name out; the CLI (cli/maintenance.py) gathers the facts and carries them out."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from medic_core.resilient import parse_resilient
from medic_core.slurm import JobInfo, SlurmClient, SlurmError
from remediation.sweep.slurm import SweepSlurm

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class WindowPlan:
    requeue: tuple[str, ...]  # resilient, requeueable jobs on the window's nodes
    left: tuple[tuple[str, str], ...]  # (job, why not requeued): its owner's or the admin's


def due_requeues(jobs: Sequence[JobInfo]) -> WindowPlan:
    """Which jobs on the window's nodes Medic requeues before the start: running (or
    suspended) jobs tagged `medic:resilient=N` that Slurm may requeue; each other job is
    named with why it stays."""
    requeue: list[str] = []
    left: list[tuple[str, str]] = []
    for job in sorted({j.job_id: j for j in jobs}.values(), key=lambda j: j.job_id):
        if parse_resilient(job.comment) is None:
            left.append((job.job_id, "not resilient (no medic:resilient tag)"))
        elif not job.requeue:
            left.append((job.job_id, "not requeueable (--no-requeue)"))
        elif job.state not in ("RUNNING", "SUSPENDED"):
            left.append((job.job_id, f"{job.state.lower()}: not running"))
        else:
            requeue.append(job.job_id)
    return WindowPlan(tuple(requeue), tuple(left))


class MaintenanceSlurm(SweepSlurm):
    """The maintenance reservation beyond the common client."""

    def create_window(
        self, name: str, nodes: str, start_in: int, minutes: int, user: str = "root"
    ) -> None:
        """`start_in`: seconds from now (Slurm's `now+N`: no clock or time zone of ours)."""
        self._run(
            "scontrol", "create", "reservation", f"reservationname={name}",
            f"nodes={nodes}", f"starttime=now+{max(0, start_in)}", f"duration={minutes}",
            f"users={user}", "flags=MAINT,IGNORE_JOBS",
        )  # fmt: skip


def requeue_before(
    client: SlurmClient, nodes: Sequence[str], name: str
) -> tuple[WindowPlan, list[tuple[str, str]]]:
    """Requeue the resilient jobs on `nodes` (their AdminComment says why, first); the plan,
    and the requeues Slurm refused (job, its message)."""
    jobs = [j for node in nodes for j in client.jobs_on(node)]
    plan = due_requeues(jobs)
    failed: list[tuple[str, str]] = []
    for job_id in plan.requeue:
        try:
            client.set_admin_comment(job_id, f"medic: requeued before maintenance {name}")
            client.requeue(job_id)
        except SlurmError as exc:
            failed.append((job_id, str(exc)))
            continue
        with contextlib.suppress(SlurmError):  # else it starts after cred_expire: it stands
            client.start_now(job_id)  # eligible at once (Slurm's BeginTime on a requeue)
    return plan, failed

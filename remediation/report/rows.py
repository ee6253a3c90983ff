"""`medic report`'s rows in: the records the store (and the checkpoint helper) keeps, as
remediation.report_store reads them, and the names of the records they carry. Pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from remediation.report.durations import seconds

# Job actions (remediation.decide, remediation.actions) that end a resilient job's run.
REQUEUED = "requeued"
NOT_REQUEUED = ("requeue_failed", "budget_spent", "left")
INTERRUPTING = (REQUEUED, *NOT_REQUEUED)
RMA_RUNG = 4  # remediation.policy.Rung.RMA
REBOOT = "reboot"
# What the ladder adds to a reboot step's output when it sees the new boot (it then ends the
# step): remediation.ladder.REBOOT_SEEN.
REBOOT_SEEN = "new boot seen"


@dataclass(frozen=True)
class FaultSeen:
    """A fault event of a node (a check's, an XID, a kernel-log match)."""

    node: str
    at: dt.datetime  # recorded: Medic knew
    fault_class: str
    fault_at: dt.datetime | None = None  # when it happened, if the sensor said


@dataclass(frozen=True)
class JobAction:
    """A job_action event naming a job: what Medic did with the job for a fault."""

    job_id: str
    node: str
    at: dt.datetime
    action: str  # requeued, requeue_failed, budget_spent, left, not_resilient, cap
    fault_class: str
    known_at: dt.datetime | None = None  # the daemon's answer began (evidence known_at)
    fault_at: dt.datetime | None = None  # the sensor's time of the fault (evidence fault_at)


@dataclass(frozen=True)
class JobStart:
    """A gate event: the prolog let the job start on a node, or refused it."""

    job_id: str
    node: str
    at: dt.datetime
    allowed: bool


@dataclass(frozen=True)
class JobEnd:
    """A job_summary event: the epilog ran for the job on a node."""

    job_id: str
    node: str
    at: dt.datetime


@dataclass(frozen=True)
class CheckpointMark:
    """The checkpoint helper's record: a commit (step saved) or a resume (step loaded)."""

    job_id: str
    at: dt.datetime
    kind: str  # "commit" or "resume"
    step: int | None  # a resume that found no checkpoint: None
    restart_count: int = 0
    duration_s: float | None = None  # a commit's: staging to manifest (None: not recorded)
    tier: str | None = None  # a resume's: where latest() found the step (local, durable)
    reload_s: float | None = None  # a resume's: latest() finding and verifying it


@dataclass(frozen=True)
class EpisodeRow:
    id: int
    node: str
    state: str
    fault_class: str
    opened_at: dt.datetime
    closed_at: dt.datetime | None  # needs_human: when it began to wait for a human
    failed_requalifications: int = 0
    rung: int = 0
    ticket_id: int | None = None
    target: str = ""  # the part: a GPU's index, an HCA port, "" for the host

    @property
    def went_to_rma(self) -> bool:
        return self.ticket_id is not None or self.rung >= RMA_RUNG


@dataclass(frozen=True)
class StepRow:
    episode_id: int
    rung: int
    action: str
    state: str  # intent, done, failed, interrupted
    started_at: dt.datetime
    ended_at: dt.datetime | None
    output: str = ""

    @property
    def took_s(self) -> float | None:
        """Measured duration: a reboot's only once its new boot was seen."""
        if self.ended_at is None or (self.action == REBOOT and REBOOT_SEEN not in self.output):
            return None
        return seconds(self.started_at, self.ended_at)


@dataclass(frozen=True)
class TicketRow:
    id: int
    node: str
    created_at: dt.datetime
    closed_at: dt.datetime | None


@dataclass(frozen=True)
class LemonRule:
    """The ladder's lemon rule ([remediation] lemon_*)."""

    episodes: int = 3
    days: float = 7.0
    failed_requalifications: int = 2


@dataclass(frozen=True)
class ReportInput:
    since: dt.datetime
    until: dt.datetime
    fleet_nodes: int  # nodes in the fleet (for node-hours)
    gpus_per_node: int
    faults: Sequence[FaultSeen] = ()
    actions: Sequence[JobAction] = ()
    starts: Sequence[JobStart] = ()
    ends: Sequence[JobEnd] = ()
    checkpoints: Sequence[CheckpointMark] = ()
    episodes: Sequence[EpisodeRow] = ()
    steps: Sequence[StepRow] = ()
    tickets: Sequence[TicketRow] = ()
    lemon: LemonRule = field(default_factory=LemonRule)

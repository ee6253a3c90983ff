"""`medic report`'s figures out: a job's interruptions and ETTR, the fleet's episodes,
rungs, lemons and false ejections, and the Report that holds them. Pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from remediation.report.durations import Spread
from remediation.report_limits import CANNOT_KNOW

COMPONENTS = ("detection", "isolation", "scheduling", "restart")


@dataclass(frozen=True)
class Interruption:
    job_id: str
    node: str
    fault_class: str
    outcome: str  # requeued, or the action that left the job down
    fault_at: dt.datetime | None
    known_at: dt.datetime
    isolated_at: dt.datetime
    running_at: dt.datetime | None
    resumed_at: dt.datetime | None
    detection_s: float | None
    isolation_s: float
    scheduling_s: float | None
    restart_s: float | None
    wall_s: float  # first known point to the last: the sum of the known components
    lost_work_s: float | None  # computed since the last complete checkpoint, done again
    resumed_from_step: int | None
    recovered: bool  # the job runs again
    clock_skew: bool  # a point was earlier than the one before it
    also: tuple[str, ...] = ()  # further faults of the same outage, "node:fault_class"
    reload_s: float | None = None  # the part of restart_s spent reloading (latest())
    resumed_tier: str | None = None  # the tier it reloaded from (None: not recorded)

    @property
    def downtime_s(self) -> float:
        return self.wall_s


@dataclass(frozen=True)
class JobReport:
    job_id: str
    started_at: dt.datetime
    ended_at: dt.datetime
    wall_s: float
    down_s: float
    lost_work_s: float | None
    ettr: float | None  # productive / wall, in [0, 1]; None for no wall time
    ettr_is_upper_bound: bool  # restart or lost work unknown for an interruption
    interruptions: tuple[Interruption, ...]
    checkpoints: int = 0  # complete commits in the window (the checkpoint helper's)
    checkpoint_s: float | None = None  # their total duration, where their manifests say


@dataclass(frozen=True)
class ClassCount:
    fault_class: str
    episodes: int
    interruptions: int
    nodes: int


@dataclass(frozen=True)
class NodeFigures:
    node: str
    episodes: int
    interruptions: int
    jobs_touched: int
    out_of_service_s: float  # drained or repairing (episodes) or in RMA, overlaps once
    rma_s: float
    lemon: bool


@dataclass(frozen=True)
class RungFigures:
    rung: int
    action: str
    attempts: int
    worked: int  # re-qualification passed after it (not through an RMA)
    failed: int  # the step itself failed (its command, Slurm's refusal, a restart)
    p50_s: float | None  # over the measured steps
    p90_s: float | None
    not_repaired: int = 0  # done, but the ladder had to go on (next step, RMA, a human)
    pending: int = 0  # done, the episode still open (verifying, or waiting)
    measured: int = 0  # steps with a measured duration (p50, p90)


@dataclass(frozen=True)
class HumanWait:
    """An episode waiting for a human (needs_human): its node stays out until one acts."""

    episode_id: int
    node: str
    fault_class: str
    opened_at: dt.datetime
    waiting_since: dt.datetime


@dataclass(frozen=True)
class FalseEjection:
    episode_id: int
    node: str
    fault_class: str
    opened_at: dt.datetime
    closed_at: dt.datetime
    out_s: float


@dataclass(frozen=True)
class FleetReport:
    nodes: int
    gpus: int
    node_hours: float
    gpu_hours: float
    episodes: int
    interruptions: int
    mtbf_node_hours: float | None  # node-hours per episode
    mtbf_gpu_hours: float | None
    failure_rate_per_node_hour: float
    by_class: tuple[ClassCount, ...]
    by_node: tuple[NodeFigures, ...]
    lemons: tuple[NodeFigures, ...]
    out_of_service_s: float
    rma_s: float
    rungs: tuple[RungFigures, ...]
    false_ejections: tuple[FalseEjection, ...]
    waiting_for_human: tuple[HumanWait, ...] = ()


@dataclass(frozen=True)
class Report:
    since: dt.datetime
    until: dt.datetime
    jobs: tuple[JobReport, ...]
    components: Mapping[str, Spread]  # detection ... restart, wall, lost_work
    mttr_s: float | None  # mean wall time of the recovered interruptions
    fleet: FleetReport
    cannot_know: tuple[str, ...] = CANNOT_KNOW

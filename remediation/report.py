"""`medic report`'s arithmetic: rows the store already holds in, typed figures out.

Pure: no store, no clock, no Slurm. `remediation.report_store` reads the rows; `cli.report`
prints the result. Docs: docs/operator-guide.md, "medic report".

An interruption of a resilient job is a timeline of up to five points, each from a record
the store (or the checkpoint helper) keeps:

    fault_at     the fault itself            a sensor's own time, when its evidence has one
    known_at     Medic knew                  the fault's event (check, XID, kernel log) or
                                             the daemon's answer (job action's known_at);
                                             without either, the job action below
    isolated_at  drained and requeued        the job_action event "requeued"
    running_at   the job runs again          the first gate "allowed" of the job after it
    resumed_at   training resumed            the checkpoint helper's resume mark

The components (detection, isolation, scheduling, restart) are the gaps between consecutive
known points, so they always sum to the interruption's wall time. Restart is split once more:
its reload (the resume mark's reload_s: latest() finding and verifying the step, in the tier
the mark names) and the rest, the job's launch up to latest(). A point earlier than the
one before it (two nodes' clocks disagree) is moved up to it and the interruption flagged.
Lost work (time computed since the last complete checkpoint, replayed after the restart) is
not part of that wall time: the job did that work once already. It runs from the commit of
the step the next run resumed from (its resume mark's step; without one, the last commit
before the fault), or from the start of the run the fault ended when that is later, to the
fault (fault_at, else known_at). Commits and resume marks come from the checkpoint ledger,
which `prune()` never deletes (slurm_hooks.checkpoint), not from the surviving checkpoints.

A rung's outcome is measured, not requested: it WORKED when re-qualification passed after it
(the episode's last step, done, and the episode resolved by that verification, never by an
RMA); a done step after which the ladder went on (another step, RMA, a human) did NOT REPAIR.
A step's time runs from its intent to its end; a reboot's ends when the new boot was seen
(REBOOT_SEEN in its output), and one without that record has no measured time.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from remediation.policy import fault_family
from remediation.report_limits import CANNOT_KNOW

# Job actions (remediation.decide, remediation.actions) that end a resilient job's run.
REQUEUED = "requeued"
NOT_REQUEUED = ("requeue_failed", "budget_spent", "left")
INTERRUPTING = (REQUEUED, *NOT_REQUEUED)
# How far a gate or resume record may precede the requeue (clock skew between nodes) and
# still count as the job's next run rather than the run the fault ended.
SKEW_TOLERANCE = dt.timedelta(seconds=60)
# Prologs of one run start together: gates this close to a run's start are that run's.
RUN_BURST = dt.timedelta(seconds=10)
# How far back from a job action to look for the fault event that led to it.
FAULT_LOOKBACK = dt.timedelta(hours=1)
RESOLVED = "resolved"  # remediation.episodes.RESOLVED (kept here: this module imports no store)
WAITING_CAP = "waiting_cap"  # an episode whose node was never drained
NEEDS_HUMAN = "needs_human"  # remediation.episodes.NEEDS_HUMAN: its closed_at is when it began
RMA_RUNG = 4  # remediation.policy.Rung.RMA
REBOOT = "reboot"
# What the ladder adds to a reboot step's output when it sees the new boot (it then ends the
# step): remediation.ladder.REBOOT_SEEN.
REBOOT_SEEN = "new boot seen"

COMPONENTS = ("detection", "isolation", "scheduling", "restart")


# -- rows in -------------------------------------------------------------------------------


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


# -- figures out ---------------------------------------------------------------------------


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
class Spread:
    """Totals and percentiles of one duration over the interruptions that have it."""

    count: int
    total_s: float
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None


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


# -- the arithmetic ------------------------------------------------------------------------


def seconds(a: dt.datetime, b: dt.datetime) -> float:
    return (b - a).total_seconds()


def format_duration(value: float | None) -> str:
    """A duration as a person reads it, its unit fitted to its size: `-` (unknown), `0 s`,
    `643 ms`, `4.4 s`, `42 s`, `12 min 05 s`, `3 h 20 min`, `2 d 4 h`. The text and the HTML
    report both print durations with this."""
    if value is None or math.isnan(value):
        return "-"
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value == 0:
        return "0 s"
    if round(value * 1000) < 1000:
        return f"{sign}{value * 1000:.3g} ms" if value < 0.001 else f"{sign}{value * 1000:.0f} ms"
    if round(value, 1) < 10:
        return f"{sign}{value:.1f} s"
    whole = round(value)
    if whole < 60:
        return f"{sign}{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{sign}{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{sign}{days} d {hours} h"


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def spread(values: Iterable[float | None]) -> Spread:
    known = [v for v in values if v is not None]
    total = sum(known)
    return Spread(
        count=len(known),
        total_s=total,
        mean_s=total / len(known) if known else None,
        p50_s=percentile(known, 0.5),
        p90_s=percentile(known, 0.9),
    )


def _monotone(points: Sequence[dt.datetime | None]) -> tuple[list[dt.datetime | None], bool]:
    """Each known point moved up to the latest before it; True if any had to move."""
    out: list[dt.datetime | None] = []
    latest: dt.datetime | None = None
    skewed = False
    for point in points:
        if point is None:
            out.append(None)
            continue
        if latest is not None and point < latest:
            point, skewed = latest, True
        out.append(point)
        latest = point
    return out, skewed


def _gap(a: dt.datetime | None, b: dt.datetime | None) -> float | None:
    return seconds(a, b) if a is not None and b is not None else None


def _first_after(times: Sequence[dt.datetime], after: dt.datetime) -> dt.datetime | None:
    return next((t for t in times if t >= after), None)


def _run_started(
    gates: Sequence[dt.datetime],
    nodes: Sequence[str],
    known: dt.datetime,
    acted: dt.datetime,
    node: str,
) -> dt.datetime | None:
    """When the run a fault ended started: the last gate on the fault's node when Medic knew
    (that run was on it; a gate on another node may be the next run's, on a clock behind).
    Without gate nodes: the last gate before the requeue less the skew tolerance, or the
    job's first gate when that is all there is before the fault."""
    on_node = [g for g, n in zip(gates, nodes, strict=False) if n == node and g <= known]
    if on_node:
        return on_node[-1]
    earlier = [g for g in gates if g < acted - SKEW_TOLERANCE]
    if earlier:
        return earlier[-1]
    if gates and gates[0] <= known:
        return gates[0]
    return None


def _fault_for(
    faults_by_node: Mapping[str, Sequence[FaultSeen]], action: JobAction
) -> FaultSeen | None:
    """The newest event of the action's fault on its node at or before the action."""
    best = None
    for fault in faults_by_node.get(action.node, ()):
        if fault.at > action.at:
            break
        if fault.at >= action.at - FAULT_LOOKBACK and fault.fault_class == action.fault_class:
            best = fault
    return best


def interruptions_of(
    job_id: str,
    actions: Sequence[JobAction],
    gates: Sequence[dt.datetime],
    resumes: Sequence[CheckpointMark],
    commits: Sequence[CheckpointMark],
    faults_by_node: Mapping[str, Sequence[FaultSeen]],
    gate_nodes: Sequence[str] = (),
) -> list[Interruption]:
    """One job's interruptions. `actions` are its interrupting job actions, `gates` the
    times the prolog allowed it, `resumes` and `commits` its checkpoint marks: all oldest
    first. A job action while the previous outage is still on (the job not running again
    yet) is a further fault of that outage, not a new interruption; a requeue after a
    failed one (Slurm refused, the daemon tried again) is the same outage's recovery."""
    out: list[Interruption] = []
    have_checkpoints = bool(resumes or commits)
    for action in actions:
        if out and (out[-1].running_at is None or action.at <= out[-1].running_at):
            last = out[-1]
            also = last.also
            where = f"{action.node}:{action.fault_class}"
            if where not in also and (action.node, action.fault_class) != (
                last.node,
                last.fault_class,
            ):
                also = (*also, where)
            if last.outcome != REQUEUED and action.action == REQUEUED:
                retried = _interruption(
                    job_id, action, last.known_at, last.fault_at, gates, resumes, commits,
                    have_checkpoints, gate_nodes,
                )  # fmt: skip
                last = replace(retried, node=last.node, fault_class=last.fault_class)
            out[-1] = replace(last, also=also)
            continue
        fault = _fault_for(faults_by_node, action)
        knowns = [t for t in (fault.at if fault else None, action.known_at) if t is not None]
        known = min(knowns, default=action.at)
        fault_at = (fault.fault_at if fault else None) or action.fault_at
        found = _interruption(
            job_id, action, known, fault_at, gates, resumes, commits, have_checkpoints,
            gate_nodes,
        )  # fmt: skip
        out.append(found)
    return out


def _interruption(
    job_id: str,
    action: JobAction,
    known: dt.datetime,
    fault_at: dt.datetime | None,
    gates: Sequence[dt.datetime],
    resumes: Sequence[CheckpointMark],
    commits: Sequence[CheckpointMark],
    have_checkpoints: bool,
    gate_nodes: Sequence[str] = (),
) -> Interruption:
    run_started = _run_started(gates, gate_nodes, known, action.at, action.node)
    # The next run: a gate after Medic knew (a gate up to SKEW_TOLERANCE before the requeue
    # counts, on a node whose clock is behind), past the ended run's own burst of prologs
    # but never past the requeue (a fault in the run's first seconds).
    floor = action.at - SKEW_TOLERANCE
    if run_started is not None:
        floor = max(floor, min(run_started + RUN_BURST, action.at))
    running = _first_after(gates, floor) if action.action == REQUEUED else None
    mark = None
    if running is not None:  # not the ended run's own resume mark (before Medic knew)
        own = [i for i, r in enumerate(resumes) if r.at <= known]
        later = resumes[own[-1] + 1 :] if own else resumes
        mark = next((r for r in later if r.at >= running - SKEW_TOLERANCE), None)
    resumed = mark.at if mark is not None else None
    points, skewed = _monotone([fault_at, known, action.at, running, resumed])
    p_fault, p_known, p_isolated, p_running, p_resumed = points
    assert p_known is not None and p_isolated is not None
    known_points = [p for p in points if p is not None]
    lost, from_step = None, None
    if have_checkpoints:
        lost, from_step = _lost_work(fault_at or known, commits, resumes, run_started, mark)
    restart = _gap(p_running, p_resumed)
    return Interruption(
        job_id=job_id,
        node=action.node,
        fault_class=action.fault_class,
        outcome=action.action,
        fault_at=p_fault,
        known_at=p_known,
        isolated_at=p_isolated,
        running_at=p_running,
        resumed_at=p_resumed,
        detection_s=_gap(p_fault, p_known),
        isolation_s=seconds(p_known, p_isolated),
        scheduling_s=_gap(p_isolated, p_running),
        restart_s=restart,
        reload_s=_reload(restart, mark),
        resumed_tier=mark.tier if mark is not None else None,
        wall_s=seconds(known_points[0], known_points[-1]),
        lost_work_s=lost,
        resumed_from_step=from_step,
        recovered=p_running is not None,
        clock_skew=skewed,
    )


def _reload(restart: float | None, mark: CheckpointMark | None) -> float | None:
    """The resume's reload, never more than the restart it is part of (clock skew)."""
    if restart is None or mark is None or mark.reload_s is None:
        return None
    return min(max(0.0, mark.reload_s), restart)


def _lost_work(
    fault_at: dt.datetime,
    commits: Sequence[CheckpointMark],
    resumes: Sequence[CheckpointMark],
    run_started: dt.datetime | None,
    resumed: CheckpointMark | None = None,
) -> tuple[float | None, int | None]:
    """Seconds of work done since the checkpoint the next run resumed from (replayed after
    the restart), and that step. The step is the resume mark's (`resumed`: what the job
    loaded) when there is one, else the last commit before the fault; a mark that found no
    checkpoint means the job started over. Work counts from that step's commit, or from
    when this run resumed or started if later (a run that resumed and failed before its
    first commit); a step committed after the fault loses nothing; unknown when none of
    these is known."""
    committed = [c for c in commits if c.at <= fault_at]
    if resumed is not None:
        from_step = resumed.step
        # Its commit may follow the fault (the job ran on until it was stopped): nothing
        # done before the fault is done again then.
        mine = [c for c in commits if c.step == from_step and c.at <= resumed.at]
        last = mine[-1] if mine else None
        if last is None and committed and from_step is not None:
            last = committed[-1]  # a job from before the ledger: its pruned commits are gone
    else:
        last = committed[-1] if committed else None
        from_step = last.step if last else None
    starts = [r.at for r in resumes if r.at <= fault_at]
    if run_started is not None and run_started <= fault_at:
        starts.append(run_started)
    begin = max([*starts, *([last.at] if last else [])], default=None)
    if begin is None:
        return None, from_step
    return max(0.0, seconds(begin, fault_at)), from_step


def _job_report(
    job_id: str,
    interruptions: Sequence[Interruption],
    record_times: Sequence[dt.datetime],
    last_is_start: bool,
    since: dt.datetime,
    until: dt.datetime,
    commits: Sequence[CheckpointMark] = (),
) -> JobReport:
    """Wall time from the job's first record in the window to its last (to `until` when
    the last record is a start: it is still running, or its end went unrecorded); ETTR is
    what is left of it after the outages and the lost work."""
    times = sorted([*record_times, *(i.known_at for i in interruptions)])
    start = max(since, times[0])
    end = until if last_is_start else min(until, times[-1])
    end = max(end, start)
    wall = seconds(start, end)
    down = 0.0
    for i in interruptions:
        stop = i.resumed_at or i.running_at or end
        lo, hi = max(i.fault_at or i.known_at, start), min(stop, end)
        down += max(0.0, seconds(lo, hi))
    lost_values = [i.lost_work_s for i in interruptions]
    lost = None if any(v is None for v in lost_values) else sum(v or 0.0 for v in lost_values)
    upper = any(
        i.lost_work_s is None or (i.recovered and i.restart_s is None) for i in interruptions
    )
    ettr = None
    if wall > 0:
        productive = wall - down - (lost or 0.0)
        ettr = min(1.0, max(0.0, productive / wall))
    return JobReport(
        job_id=job_id,
        started_at=start,
        ended_at=end,
        wall_s=wall,
        down_s=down,
        lost_work_s=lost,
        ettr=ettr,
        ettr_is_upper_bound=upper,
        interruptions=tuple(interruptions),
        checkpoints=len(commits),
        checkpoint_s=_sum_known(c.duration_s for c in commits),
    )


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _in_window(at: dt.datetime, since: dt.datetime, until: dt.datetime) -> bool:
    return since <= at <= until


def build_report(data: ReportInput) -> Report:
    since, until = data.since, data.until
    faults_by_node: dict[str, list[FaultSeen]] = defaultdict(list)
    for f in sorted(data.faults, key=lambda f: f.at):
        faults_by_node[f.node].append(f)
    gates: dict[str, list[dt.datetime]] = defaultdict(list)
    gate_nodes: dict[str, list[str]] = defaultdict(list)
    for s in sorted(data.starts, key=lambda s: s.at):
        if s.allowed:
            gates[s.job_id].append(s.at)
            gate_nodes[s.job_id].append(s.node)
    ends: dict[str, list[dt.datetime]] = defaultdict(list)
    for e in data.ends:
        ends[e.job_id].append(e.at)
    resumes: dict[str, list[CheckpointMark]] = defaultdict(list)
    commits: dict[str, list[CheckpointMark]] = defaultdict(list)
    for c in sorted(data.checkpoints, key=lambda c: c.at):
        (resumes if c.kind == "resume" else commits)[c.job_id].append(c)
    by_job: dict[str, list[JobAction]] = defaultdict(list)
    for a in sorted(data.actions, key=lambda a: (a.at, a.node)):
        if a.action in INTERRUPTING and _in_window(a.at, since, until):
            by_job[a.job_id].append(a)

    jobs = []
    for job_id in sorted(by_job, key=lambda j: (by_job[j][0].at, j)):
        found = interruptions_of(
            job_id,
            by_job[job_id],
            gates[job_id],
            resumes[job_id],
            commits[job_id],
            faults_by_node,
            gate_nodes[job_id],
        )
        job_gates = [g for g in gates[job_id] if _in_window(g, since, until)]
        job_ends = [e for e in ends[job_id] if _in_window(e, since, until)]
        job_resumes = [r.at for r in resumes[job_id] if _in_window(r.at, since, until)]
        starts_ = [*job_gates, *job_resumes]
        records = [*starts_, *job_ends, *(a.at for a in by_job[job_id])]
        last_is_start = bool(starts_) and (not job_ends or max(starts_) > max(job_ends))
        last_is_start = last_is_start and max(starts_) >= max(records)
        job_commits = [c for c in commits[job_id] if _in_window(c.at, since, until)]
        jobs.append(_job_report(job_id, found, records, last_is_start, since, until, job_commits))

    every = [i for j in jobs for i in j.interruptions]
    recovered = [i for i in every if i.recovered]
    components = {
        "detection": spread(i.detection_s for i in recovered),
        "isolation": spread(i.isolation_s for i in recovered),
        "scheduling": spread(i.scheduling_s for i in recovered),
        "restart": spread(i.restart_s for i in recovered),
        "reload": spread(i.reload_s for i in recovered),  # part of restart, not added to wall
        "wall": spread(i.wall_s for i in recovered),
        "lost_work": spread(i.lost_work_s for i in every),
    }
    mttr = components["wall"].mean_s
    return Report(
        since=since,
        until=until,
        jobs=tuple(jobs),
        components=components,
        mttr_s=mttr,
        fleet=fleet_report(data, every),
    )


def _union_seconds(
    intervals: Iterable[tuple[dt.datetime, dt.datetime]], since: dt.datetime, until: dt.datetime
) -> float:
    """Seconds covered by the intervals inside the window, overlaps counted once."""
    clipped = sorted(
        (max(a, since), min(b, until)) for a, b in intervals if b > since and a < until
    )
    total = 0.0
    current: tuple[dt.datetime, dt.datetime] | None = None
    for a, b in clipped:
        if b <= a:
            continue
        if current is None or a > current[1]:
            if current is not None:
                total += seconds(*current)
            current = (a, b)
        else:
            current = (current[0], max(current[1], b))
    if current is not None:
        total += seconds(*current)
    return total


def _is_lemon(episodes: Sequence[EpisodeRow], rule: LemonRule, repaired: Collection[int]) -> bool:
    """The ladder's rule (remediation.policy.LemonScore) at any moment of the window, per
    part and fault family: `rule.episodes` episodes of one part (`target`) and one family
    that needed a repair (`repaired`: a rung's step ran, or an RMA ticket) and that no human
    closed, within `rule.days`, or `rule.failed_requalifications` failed re-qualifications
    among them. A link that came back by itself never counts toward a GPU's."""
    groups: dict[tuple[str, str], list[EpisodeRow]] = defaultdict(list)
    for e in episodes:
        if (e.id in repaired or e.went_to_rma) and e.state != HUMAN_CLOSED:
            groups[(e.target, fault_family(e.fault_class))].append(e)
    span = dt.timedelta(days=rule.days)
    n = rule.episodes
    for group in groups.values():
        if sum(e.failed_requalifications for e in group) >= rule.failed_requalifications:
            return True
        opened = sorted(e.opened_at for e in group)
        if any(opened[i + n - 1] - opened[i] <= span for i in range(len(opened) - n + 1)):
            return True
    return False


HUMAN_CLOSED = "closed"  # remediation.episodes.CLOSED: a human closed it (no fault, or fixed)


def fleet_report(data: ReportInput, interruptions: Sequence[Interruption]) -> FleetReport:
    since, until = data.since, data.until
    hours = max(0.0, seconds(since, until)) / 3600
    gpus = data.fleet_nodes * data.gpus_per_node
    node_hours, gpu_hours = data.fleet_nodes * hours, gpus * hours
    opened = [e for e in data.episodes if _in_window(e.opened_at, since, until)]
    # Out of service: every episode that overlaps the window (opened before it, still out).
    overlapping = [
        e
        for e in data.episodes
        if e.opened_at <= until and (e.closed_at is None or e.closed_at >= since)
    ]

    episodes_by_node: dict[str, list[EpisodeRow]] = defaultdict(list)
    for e in opened:
        episodes_by_node[e.node].append(e)
    # An episode needed a repair when a rung's step ran (the ladder's lemon rule counts no
    # other): a link re-checked until it came back did not.
    repaired = {s.episode_id for s in data.steps}
    out_intervals: dict[str, list[tuple[dt.datetime, dt.datetime]]] = defaultdict(list)
    for e in overlapping:
        if e.state != WAITING_CAP:  # a needs_human node stays out until a human acts
            end = until if e.state == NEEDS_HUMAN else (e.closed_at or until)
            out_intervals[e.node].append((e.opened_at, end))
    rma_intervals: dict[str, list[tuple[dt.datetime, dt.datetime]]] = defaultdict(list)
    for t in data.tickets:
        rma_intervals[t.node].append((t.created_at, t.closed_at or until))
    interruptions_by_node: dict[str, int] = defaultdict(int)
    for i in interruptions:
        interruptions_by_node[i.node] += 1
    jobs_by_node: dict[str, set[str]] = defaultdict(set)
    for a in data.actions:
        if _in_window(a.at, since, until):
            jobs_by_node[a.node].add(a.job_id)

    nodes = sorted(
        {*episodes_by_node, *interruptions_by_node, *out_intervals, *rma_intervals, *jobs_by_node}
    )
    figures = []
    for node in nodes:
        rma = _union_seconds(rma_intervals[node], since, until)
        out = _union_seconds([*out_intervals[node], *rma_intervals[node]], since, until)
        figures.append(
            NodeFigures(
                node=node,
                episodes=len(episodes_by_node[node]),
                interruptions=interruptions_by_node[node],
                jobs_touched=len(jobs_by_node[node]),
                out_of_service_s=out,
                rma_s=rma,
                lemon=_is_lemon(episodes_by_node[node], data.lemon, repaired),
            )
        )
    figures.sort(key=lambda f: (-f.episodes, -f.interruptions, -f.out_of_service_s, f.node))

    classes: dict[str, tuple[int, int, set[str]]] = {}
    for e in opened:
        n_ep, n_int, where = classes.get(e.fault_class, (0, 0, set()))
        classes[e.fault_class] = (n_ep + 1, n_int, where | {e.node})
    for i in interruptions:
        n_ep, n_int, where = classes.get(i.fault_class, (0, 0, set()))
        classes[i.fault_class] = (n_ep, n_int + 1, where | {i.node})
    by_class = sorted(
        (ClassCount(c, n_ep, n_int, len(where)) for c, (n_ep, n_int, where) in classes.items()),
        key=lambda c: (-c.episodes, -c.interruptions, c.fault_class),
    )

    episodes_by_id = {e.id: e for e in opened}
    steps_by_episode: dict[int, list[StepRow]] = defaultdict(list)
    for s in sorted(data.steps, key=lambda s: s.started_at):
        if s.episode_id in episodes_by_id:
            steps_by_episode[s.episode_id].append(s)
    rung_steps: dict[tuple[int, str], list[StepRow]] = defaultdict(list)
    outcomes: dict[tuple[int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for episode_id, steps in steps_by_episode.items():
        for n, s in enumerate(steps):
            rung_steps[(s.rung, s.action)].append(s)
            after = step_outcome(episodes_by_id[episode_id], s, n == len(steps) - 1)
            outcomes[(s.rung, s.action)][after] += 1
    rungs = []
    for key in sorted(rung_steps):
        steps = rung_steps[key]
        took = [t for t in (s.took_s for s in steps) if t is not None]
        counts = outcomes[key]
        rungs.append(
            RungFigures(
                rung=key[0],
                action=key[1],
                attempts=len(steps),
                worked=counts[WORKED],
                failed=counts[FAILED],
                p50_s=percentile(took, 0.5),
                p90_s=percentile(took, 0.9),
                not_repaired=counts[NOT_REPAIRED],
                pending=counts[PENDING],
                measured=len(took),
            )
        )
    waiting = tuple(
        HumanWait(e.id, e.node, e.fault_class, e.opened_at, e.closed_at or e.opened_at)
        for e in sorted(overlapping, key=lambda e: e.opened_at)
        if e.state == NEEDS_HUMAN
    )

    false_ejections = tuple(
        FalseEjection(
            episode_id=e.id,
            node=e.node,
            fault_class=e.fault_class,
            opened_at=e.opened_at,
            closed_at=e.closed_at,
            out_s=max(0.0, seconds(e.opened_at, e.closed_at)),
        )
        for e in sorted(opened, key=lambda e: e.opened_at)
        if e.closed_at is not None and is_false_ejection(e, steps_by_episode.get(e.id, ()))
    )
    count = len(opened)
    return FleetReport(
        nodes=data.fleet_nodes,
        gpus=gpus,
        node_hours=node_hours,
        gpu_hours=gpu_hours,
        episodes=count,
        interruptions=len(interruptions),
        mtbf_node_hours=node_hours / count if count else None,
        mtbf_gpu_hours=gpu_hours / count if count else None,
        failure_rate_per_node_hour=count / node_hours if node_hours else 0.0,
        by_class=tuple(by_class),
        by_node=tuple(figures),
        lemons=tuple(f for f in figures if f.lemon),
        out_of_service_s=sum(f.out_of_service_s for f in figures),
        rma_s=sum(f.rma_s for f in figures),
        rungs=tuple(rungs),
        false_ejections=false_ejections,
        waiting_for_human=waiting,
    )


WORKED, NOT_REPAIRED, FAILED, PENDING = "worked", "not_repaired", "failed", "pending"


def step_outcome(episode: EpisodeRow, step: StepRow, last: bool) -> str:
    """What re-qualification said after `step`. Only the episode's last step can have
    worked, and only when the episode resolved through the verification after it: an
    episode that went to RMA was resolved by the vendor's repair (its re-qualification
    after the ticket), not by any rung."""
    if step.state != "done":
        return FAILED
    if not last:
        return NOT_REPAIRED  # the verification after it failed: the ladder went on
    if episode.state == RESOLVED:
        return NOT_REPAIRED if episode.went_to_rma else WORKED
    if episode.state in (RMA_STATE, NEEDS_HUMAN, CLOSED_BY_HUMAN):
        return NOT_REPAIRED
    return PENDING


RMA_STATE = "rma"  # remediation.episodes.RMA
CLOSED_BY_HUMAN = "closed"  # remediation.episodes.CLOSED


def is_false_ejection(episode: EpisodeRow, steps: Sequence[StepRow]) -> bool:
    """Taken out, and re-qualification passed with no repair: resolved, no step that ran
    (a reboot Slurm refused never ran), no failed re-qualification (that confirmed the
    fault) and never an RMA (a lemon's, or one a rung sent it to)."""
    ran = [s for s in steps if not (s.action == REBOOT and s.state == "failed")]
    return (
        episode.state == RESOLVED
        and episode.closed_at is not None
        and not episode.went_to_rma
        and episode.failed_requalifications == 0
        and not ran
    )

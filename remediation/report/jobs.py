"""A resilient job's interruptions and its ETTR, from its records. Pure.

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
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from remediation.report.durations import seconds
from remediation.report.figures import Interruption, JobReport
from remediation.report.rows import REQUEUED, CheckpointMark, FaultSeen, JobAction

# How far a gate or resume record may precede the requeue (clock skew between nodes) and
# still count as the job's next run rather than the run the fault ended.
SKEW_TOLERANCE = dt.timedelta(seconds=60)
# Prologs of one run start together: gates this close to a run's start are that run's.
RUN_BURST = dt.timedelta(seconds=10)
# How far back from a job action to look for the fault event that led to it.
FAULT_LOOKBACK = dt.timedelta(hours=1)


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


def job_report(
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

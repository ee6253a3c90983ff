"""Is a job hung? Pure: a job's progress as the daemon saw it, a time and the settings in,
a verdict out (no files, no clock, no Slurm).

`observe` folds one heartbeat reading into a job's `Progress` (the steps it was seen to
advance to, with the job's own time of each step and the daemon's time it first saw it);
`evaluate` judges it: a job stalled for more than max(floor, factor x the median time of its
recent steps) is hung. A job that never reported, or has reported fewer than `min_steps`
steps since it (or the daemon) started, is not judged; a counter that goes backwards (a new
run of the job, or a job that counts again) starts its history over.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from medic_core.heartbeat import Beat


@dataclass(frozen=True)
class HangSettings:
    factor: float = 10.0  # k: stalled for k x the median step time
    floor: float = 60.0  # ...and never less than this many seconds
    window: int = 20  # the median is over this many recent steps
    min_steps: int = 3  # step times needed before a job is judged


@dataclass(frozen=True)
class Sample:
    step: int
    at: float  # the job's clock when it reported `step` (seconds, CLOCK_MONOTONIC)
    seen: float  # the daemon's clock when it first saw `step`
    busy: float | None = None  # seconds the node worked in `step`, when the job says


@dataclass(frozen=True)
class Progress:
    """A job's advances on this node, oldest first (at most max(window, min_steps) + 1
    kept: enough step times for the median and for the job to be judged at all)."""

    job_id: str
    samples: tuple[Sample, ...] = ()
    restarts: int = 0  # times the counter went backwards (history started over)

    @property
    def last(self) -> Sample | None:
        return self.samples[-1] if self.samples else None


class State(StrEnum):
    NO_HEARTBEAT = "no_heartbeat"  # never reported a step here
    STARTING = "starting"  # too few steps to know its pace
    ADVANCING = "advancing"
    HUNG = "hung"


@dataclass(frozen=True)
class Verdict:
    job_id: str
    state: State
    step: int | None = None
    stalled: float = 0.0  # seconds since its step last advanced (daemon's clock)
    median: float | None = None  # recent median seconds per step
    threshold: float | None = None  # seconds of stall that make a hang
    steps_timed: int = 0

    @property
    def hung(self) -> bool:
        return self.state is State.HUNG

    def describe(self) -> str:
        if self.state is State.HUNG:
            return (
                f"job {self.job_id} stopped at step {self.step}: no progress for "
                f"{self.stalled:.1f}s (threshold {self.threshold:.1f}s, median step "
                f"{self.median:.3f}s)"
            )
        return f"job {self.job_id}: {self.state.value}"


def observe(progress: Progress, beat: Beat | None, now: float, settings: HangSettings) -> Progress:
    """`progress` after one reading (`beat` None: nothing reported; ns 0: a run that has
    not reported its first step)."""
    if beat is None or beat.ns == 0:
        return progress
    sample = Sample(beat.step, beat.ns / 1e9, now, beat.busy_ns / 1e9 if beat.busy_ns else None)
    last = progress.last
    if last is None:
        return Progress(progress.job_id, (sample,), progress.restarts)
    if beat.step == last.step:
        return progress
    if beat.step < last.step:  # counting again: a new run, or the job reset its counter
        return Progress(progress.job_id, (sample,), progress.restarts + 1)
    kept = (*progress.samples, sample)[-(max(settings.window, settings.min_steps) + 1) :]
    return Progress(progress.job_id, kept, progress.restarts)


def step_times(samples: tuple[Sample, ...]) -> list[float]:
    """Seconds per step between consecutive samples, by the job's clock; a pair whose
    job time does not move forward is skipped (a clock the job wrote wrong)."""
    times = []
    for a, b in itertools.pairwise(samples):
        if b.at > a.at and b.step > a.step:
            times.append((b.at - a.at) / (b.step - a.step))
    return times


def evaluate(progress: Progress, now: float, settings: HangSettings) -> Verdict:
    last = progress.last
    if last is None:
        return Verdict(progress.job_id, State.NO_HEARTBEAT)
    stalled = max(0.0, now - last.seen)
    times = step_times(progress.samples)
    if len(times) < settings.min_steps:
        return Verdict(progress.job_id, State.STARTING, last.step, stalled, steps_timed=len(times))
    median = statistics.median(times[-settings.window :])
    threshold = max(settings.floor, settings.factor * median)
    state = State.HUNG if stalled > threshold else State.ADVANCING
    return Verdict(progress.job_id, state, last.step, stalled, median, threshold, len(times))


# --- stragglers: one node of a job slower than its others ---------------------------------


@dataclass(frozen=True)
class Pace:
    """A job's pace on one node: the median over its recent steps of the time the node
    worked (`basis` "busy", when the job reports it) or else of the step time ("step")."""

    job_id: str
    seconds: float
    basis: str
    steps: int


def pace(progress: Progress, settings: HangSettings) -> Pace | None:
    """None until the job has `min_steps` step times (as for a hang)."""
    times = step_times(progress.samples)
    if len(times) < settings.min_steps:
        return None
    recent = progress.samples[-settings.window :]
    busy = [s.busy for s in recent if s.busy is not None]
    if len(busy) == len(recent):
        return Pace(progress.job_id, statistics.median(busy), "busy", len(busy))
    window = times[-settings.window :]
    return Pace(progress.job_id, statistics.median(window), "step", len(window))


@dataclass(frozen=True)
class StragglerSettings:
    ratio: float = 1.25  # slower than the median of the job's other nodes by more than this
    repeats: int = 3  # in this many comparisons in a row


def repeat_straggler(job_ids: Collection[str], jobs_to_drain: int) -> bool:
    """Drain after the job? When the node was a straggler in `jobs_to_drain` different jobs
    (those the caller read, within its window): one slow job may be the job's own doing
    (its data, its placement), the same node slow in several is the node's."""
    return jobs_to_drain > 0 and len(set(job_ids)) >= jobs_to_drain


def slower_than_others(mine: Pace, others: Sequence[Pace], ratio: float) -> float | None:
    """How many times slower `mine` is than the median of the job's other nodes (same
    basis only), when more than `ratio`; None when not, or nothing to compare with."""
    same = [o.seconds for o in others if o.basis == mine.basis and o.seconds > 0]
    if not same:
        return None
    typical = statistics.median(same)
    times = mine.seconds / typical
    return times if times > ratio else None

"""Runs checks off the caller's thread, each with its own timeout counted from its own start.

A run's checks go through a few lanes (`parallel`; one per check when None): a lane is one
worker thread (healthd.workers: reused across runs) that runs checks one after another until
none is left. The caller's thread sleeps meanwhile, woken when the last lane runs out of
checks or at the deadline of a check in progress, not once per check: with every check at
10 s a round's hand-offs were a measurable share of the daemon's CPU (issue 15).

A check that raises or overruns yields UNKNOWN (never a hardware verdict) with the reason
in the evidence. An overrunning check keeps its thread (Python cannot kill a thread, and a
thread stuck in a hung filesystem cannot be interrupted anyway) and the checks queued behind
it in its lane go on in a new one; the runner remembers it and, until it returns, reports it
UNKNOWN "still hung since ..." instead of starting a second copy, so one hang costs one
thread, not one per interval.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import time
import traceback
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from healthd.checks import specs_for
from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    CheckSpec,
    Result,
    Status,
    Tier,
    fault,
)
from healthd.deadlines import Lane, Timekeeper
from healthd.workers import Worker, WorkerPool


class RunState(StrEnum):
    DONE = "done"
    ERROR = "error"  # gather or evaluate raised, or returned something that is not results
    TIMEOUT = "timeout"  # overran its timeout this run; its thread goes on
    HUNG = "hung"  # a previous run still has not returned; not started again
    UNAVAILABLE = "unavailable"  # the context lacks something the check needs


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    state: RunState
    results: tuple[Result, ...]
    seconds: float


@dataclass(frozen=True)
class RunReport:
    started: dt.datetime
    seconds: float
    outcomes: tuple[CheckOutcome, ...]

    @property
    def results(self) -> list[Result]:
        return [r for o in self.outcomes for r in o.results]

    @property
    def durations(self) -> dict[str, float]:
        return {o.name: o.seconds for o in self.outcomes}


class RunnerBusy(RuntimeError):
    """A run with a `wait` bound could not start in time."""


def _unknown(name: str, fault_class: str, message: str, **evidence: Any) -> Result:
    return fault(name, Status.UNKNOWN, fault_class, message, evidence=evidence)


@dataclass
class _Slot:
    """Where a worker thread leaves its answer."""

    done: threading.Event = field(default_factory=threading.Event)
    results: list[Result] | None = None
    error: BaseException | None = None
    phase: str = "gather"
    seconds: float = 0.0


@dataclass(eq=False)
class _Run:
    """One run's checks: those not started yet, and the answers (under the keeper's cond)."""

    to_start: deque[tuple[str, CheckConfig, float]]
    keeper: Timekeeper[_Slot]
    answered: dict[str, _Slot] = field(default_factory=dict)


@dataclass
class _Hung:
    worker: Worker
    since: dt.datetime
    started: float


class Runner:
    """Owns one instance of each check (their between-run state) and runs them.

    `run` is serialised by a lock: the daemon's scheduler, a prolog request and a manual
    `medic` request may arrive together, and a check's state must not be shared by two runs.
    A run may hold it for as long as its checks' timeouts (a deep check asked for through the
    socket: up to an hour); `reconfigure` and `hung` never wait for it.
    """

    def __init__(
        self,
        ctx: CheckContext,
        configs: Mapping[str, CheckConfig] | None = None,
        specs: Iterable[CheckSpec] | None = None,
    ) -> None:
        self.ctx = ctx
        # Without `specs`: the registry's checks and the site's command checks of `configs`
        # (those follow the configuration: `reconfigure` adds and drops them).
        self._follow_configs = specs is None
        self.specs = {s.name: s for s in (specs_for(configs or {}) if specs is None else specs)}
        self.configs = {
            name: (configs or {}).get(name) or spec.default_config()
            for name, spec in self.specs.items()
        }
        self._checks: dict[str, Check[Any, Any]] = {n: s.create() for n, s in self.specs.items()}
        self._hung: dict[str, _Hung] = {}
        self._workers = WorkerPool("check")
        self._lock = threading.Lock()  # one run at a time
        self._hung_lock = threading.Lock()  # the hung-check bookkeeping, held only briefly

    def reconfigure(self, configs: Mapping[str, CheckConfig]) -> None:
        """New per-check configuration; the check instances (their between-run state, such
        as the kernel log position) and the hung-check bookkeeping stay. It does not wait
        for a run in progress (a reload during an hour-long deep run takes effect at once):
        that run goes on with the configuration it started with, the next one has the new.
        A site command check added to the file starts (a fresh instance), one removed stops,
        one whose table changed gets its new spec (tiers, description)."""
        specs = self.specs
        if self._follow_configs:
            specs = {s.name: s for s in specs_for(configs)}
            checks = {
                name: self._checks[name]
                if name in self._checks and self.specs.get(name) == spec
                else spec.create()
                for name, spec in specs.items()
            }
            self._checks = checks
        self.configs = {
            name: configs.get(name) or spec.default_config() for name, spec in specs.items()
        }
        self.specs = specs

    def selected(self, names: Collection[str] | None = None, tier: Tier | None = None) -> list[str]:
        """Enabled checks this node runs, optionally only `names` and only those in `tier`."""
        specs, configs = self.specs, self.configs
        if names is not None:
            unknown = set(names) - set(specs)
            if unknown:
                raise KeyError(f"unknown checks: {', '.join(sorted(unknown))}")
        return [
            name
            for name, spec in specs.items()
            if (names is None or name in names)
            and (tier is None or tier in spec.tiers)
            and name in configs
            and configs[name].enabled
            and not (self.ctx.gpu_skip and spec.is_gpu_check)
        ]

    def not_here(self, name: str) -> str:
        """Why this node does not run check `name` at all (a GPU check on a CPU node:
        `CheckContext.gpu_skip`), or "". Such a check is left out, not reported UNKNOWN."""
        return self.ctx.gpu_skip if self.specs[name].is_gpu_check else ""

    def hung(self) -> dict[str, dt.datetime]:
        """Checks whose thread is still stuck in an earlier run, and since when."""
        with self._hung_lock:
            self._reap()
            return {name: h.since for name, h in self._hung.items()}

    def _reap(self) -> None:
        """Forget hung checks whose thread has returned (under `_hung_lock`)."""
        for name in [n for n, h in self._hung.items() if not h.worker.thread.is_alive()]:
            del self._hung[name]

    def run(
        self,
        names: Collection[str] | None = None,
        *,
        tier: Tier | None = None,
        budget: float | None = None,
        wait: float | None = None,
        parallel: int | None = None,
    ) -> RunReport:
        """Run the selected checks in parallel (at most `parallel` at once; None: all); return
        when all have answered or reached their timeout (each counted from its own start,
        capped by `budget` seconds overall, for the launch tier).

        `wait` bounds how long to queue behind a run already in progress (None: as long as
        it takes); RunnerBusy when it runs out."""
        selected = self.selected(names, tier)
        if not self._lock.acquire(timeout=-1 if wait is None else max(0.0, wait)):
            raise RunnerBusy(f"another check run is still in progress after {wait:g}s")
        try:
            return self._run(selected, budget, parallel)
        finally:
            self._lock.release()

    def _run(self, names: list[str], budget: float | None, parallel: int | None) -> RunReport:
        started_wall = self.ctx.clock.now()
        start = time.monotonic()
        # This run's specs, configs and instances, whatever a reload swaps in meanwhile.
        specs, configs, instances = self.specs, self.configs, self._checks
        names = [n for n in names if n in specs and n in configs and n in instances]
        with self._hung_lock:
            self._reap()
            hung_now = dict(self._hung)
        outcomes: dict[str, CheckOutcome] = {}
        to_start: deque[tuple[str, CheckConfig, float]] = deque()
        for name in names:
            spec, cfg = specs[name], configs[name]
            missing = [need for need in spec.needs if not self.ctx.provides(need)]
            if missing:
                result = _unknown(
                    name,
                    "check.unavailable",
                    f"{name}: this node's context lacks {', '.join(missing)}",
                    missing=missing,
                )
                outcomes[name] = CheckOutcome(name, RunState.UNAVAILABLE, (result,), 0.0)
                continue
            hung = hung_now.get(name)
            if hung is not None:
                since = hung.since.isoformat(timespec="seconds")
                result = _unknown(
                    name,
                    "check.hung",
                    f"{name}: still hung since {since}; not started again",
                    hung_since=since,
                    hung_seconds=round(time.monotonic() - hung.started, 1),
                )
                outcomes[name] = CheckOutcome(name, RunState.HUNG, (result,), 0.0)
                continue
            timeout = spec.timeout_for(cfg)
            if budget is not None:
                timeout = min(timeout, budget)
            to_start.append((name, cfg, timeout))

        # Each check's deadline counts from its own start; a budget ends them all at once.
        keeper: Timekeeper[_Slot] = Timekeeper(
            self._workers, None if budget is None else start + budget
        )
        run = _Run(to_start, keeper)
        at_once = len(to_start) if parallel is None else max(1, parallel)
        with keeper.cond:
            for _ in range(min(at_once, len(to_start))):
                self._start_lane(run, instances)
            for lane, current in keeper.overran():  # the check's thread goes on
                assert lane.worker is not None
                with self._hung_lock:
                    self._hung[current.name] = _Hung(
                        lane.worker, self.ctx.clock.now(), current.started
                    )
                phase = current.tag.phase
                result = _unknown(
                    current.name,
                    "check.timeout",
                    f"{current.name}: no answer within {current.timeout:g}s ({phase})",
                    timeout_seconds=current.timeout,
                    phase=phase,
                )
                outcomes[current.name] = CheckOutcome(
                    current.name, RunState.TIMEOUT, (result,), current.timeout
                )
                if run.to_start:  # the rest go on in a lane of their own
                    self._start_lane(run, instances)
        for name, slot in run.answered.items():
            outcomes[name] = self._collect(name, slot)
        return RunReport(
            started=started_wall,
            seconds=time.monotonic() - start,
            outcomes=tuple(outcomes[n] for n in names),
        )

    def _start_lane(self, run: _Run, instances: Mapping[str, Check[Any, Any]]) -> None:
        """One more lane: a worker that runs the run's checks one after another until none
        is left (healthd.deadlines keeps their time)."""
        run.keeper.start(functools.partial(self._run_lane, run, instances), "check-lane")

    def _run_lane(
        self, run: _Run, instances: Mapping[str, Check[Any, Any]], lane: Lane[_Slot]
    ) -> None:
        keeper = run.keeper
        while True:
            with keeper.cond:
                if lane.abandoned or not run.to_start:
                    return
                name, cfg, timeout = run.to_start.popleft()
            slot = _Slot()
            with keeper.item(lane, name, slot, timeout):
                assert lane.worker is not None
                lane.worker.thread.name = f"check-{name}"  # py-spy and faulthandler name it
                self._work(instances[name], cfg, slot)
            with keeper.cond:  # not abandoned: it answered in time
                run.answered[name] = slot

    def _work(self, check: Check[Any, Any], cfg: CheckConfig, slot: _Slot) -> None:
        begin = time.monotonic()
        try:
            observation = check.gather(self.ctx, cfg)
            slot.phase = "evaluate"
            slot.results = list(check.evaluate(observation, cfg))
        except BaseException as exc:
            slot.error = exc
        finally:
            slot.seconds = time.monotonic() - begin
            slot.done.set()

    def _collect(self, name: str, slot: _Slot) -> CheckOutcome:
        if slot.error is not None:
            exc = slot.error
            where = traceback.extract_tb(exc.__traceback__)[-1:]
            result = _unknown(
                name,
                "check.error",
                f"{name}: {slot.phase} failed: {type(exc).__name__}: {exc}",
                phase=slot.phase,
                error=f"{type(exc).__name__}: {exc}",
                where=[f"{f.filename}:{f.lineno} in {f.name}" for f in where],
            )
            return CheckOutcome(name, RunState.ERROR, (result,), slot.seconds)
        results = slot.results or []
        bad = [r for r in results if not isinstance(r, Result) or r.check != name]
        if bad or not results:
            problem = "returned no results" if not results else f"returned {bad[0]!r}"
            result = _unknown(name, "check.error", f"{name}: evaluate {problem}", phase="evaluate")
            return CheckOutcome(name, RunState.ERROR, (result,), slot.seconds)
        return CheckOutcome(name, RunState.DONE, tuple(results), slot.seconds)

"""The daemon's check scheduler: when each periodic check is next due, and running those due.

Each check runs at its configured interval with jitter; checks whose times fall close
together (COALESCE_SECONDS) run in one round, ROUND_PARALLEL at a time, through the daemon's
Runner, and the round is recorded. An event (an XID, a kernel log line, a link going down)
makes checks due at once (`wake_checks`). The scheduler never waits long for the runner:
a run asked for through the socket (a sweep's deep probe) may hold it for an hour, far past
WatchdogSec, so due checks that could not start within RUNNER_WAIT seconds are tried again
BUSY_RETRY seconds later while the scheduler goes round (the watchdog sees it beat).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from healthd.checks.base import Tier
from healthd.runner import Runner, RunnerBusy, RunReport
from healthd.wakeup import Wakeup
from medic_core.settings import DaemonSettings

log = logging.getLogger("medic.healthd")

ROUND_PARALLEL = 2  # checks of a scheduled round that run at once (see CheckScheduler.run_due)
COALESCE_SECONDS = 5.0  # a check due this soon (at most half its interval) runs now
# Due checks that could not start within RUNNER_WAIT seconds are skipped this round and tried
# again BUSY_RETRY seconds later; a scheduler really stuck (a store write that hangs) does not
# go round, and the watchdog sees that.
RUNNER_WAIT = 1.0
BUSY_RETRY = 5.0


class SchedulerHost(Protocol):
    """What the scheduler reads of the daemon, at every use (a reload replaces the settings,
    a test the runner)."""

    @property
    def checks(self) -> Runner: ...

    @property
    def settings(self) -> DaemonSettings: ...


class CheckScheduler:
    def __init__(
        self, host: SchedulerHost, record: Callable[[RunReport], None], wake: Wakeup
    ) -> None:
        self.host = host
        self.record = record  # a round's report goes here
        self.wake = wake  # the main loop's: set when a check becomes due sooner
        self.due: dict[str, float] = {}  # check name -> monotonic time it is next due
        self.runner_wait, self.busy_retry = RUNNER_WAIT, BUSY_RETRY
        self.busy_since: float | None = None  # the runner was busy when checks were due

    def reset(self) -> None:
        """Every periodic check due now (at start, and after a reload)."""
        now = time.monotonic()
        self.due = {name: now for name in self.host.checks.selected(tier=Tier.PERIODIC)}
        self.wake.set()

    def _base_interval(self, name: str) -> float | None:
        """The check's configured interval; None for a site command check a reload just
        removed."""
        checks = self.host.checks
        spec, cfg = checks.specs.get(name), checks.configs.get(name)
        return None if spec is None or cfg is None else spec.interval_for(cfg)

    def _interval(self, name: str) -> float:
        settings = self.host.settings
        base = self._base_interval(name)
        if base is None:
            return float(settings.prune_every)
        jitter = settings.jitter
        return float(base * (1 + random.uniform(-jitter, jitter)))

    def _early(self, name: str) -> float:
        """How long before it is due a check joins the round that runs now: checks whose
        jittered times fall close together run in one round (one wake-up of the scheduler
        and of the check threads instead of one each)."""
        base = self._base_interval(name)
        return 0.0 if base is None else min(COALESCE_SECONDS, base / 2)

    def run_due(self) -> RunReport | None:
        """Run the checks that are due; None when none are, or when the runner stays busy
        (another run holds it) for `runner_wait` seconds: those are due again `busy_retry`
        seconds later, and this returns so the scheduler's heartbeat goes on."""
        now = time.monotonic()
        due_at = {n: at for n, at in list(self.due.items()) if at <= now + self._early(n)}
        due = list(due_at)
        if not due:
            return None
        # Before the run, so an event during it makes the check due again. A check run early
        # (to join this round) keeps its own pace: its next time counts from when it was due.
        planned = {name: max(now, at) + self._interval(name) for name, at in due_at.items()}
        self.due.update(planned)
        try:
            report = self.host.checks.run(due, wait=self.runner_wait, parallel=ROUND_PARALLEL)
        except RunnerBusy:
            retry = time.monotonic() + self.busy_retry
            for name in due:
                if self.due.get(name) == planned[name]:  # not woken meanwhile
                    self.due[name] = min(planned[name], retry)
            if self.busy_since is None:
                self.busy_since = now
                log.info(
                    "the check runner is busy with another run (a check asked for through "
                    "the socket, such as a sweep's deep probe): %d due checks wait for it "
                    "(%s), tried again every %gs",
                    len(due),
                    ", ".join(due),
                    self.busy_retry,
                )
            return None
        if self.busy_since is not None:
            log.info(
                "the check runner is free again: periodic checks resume after %.0fs",
                now - self.busy_since,
            )
            self.busy_since = None
        self.record(report)
        return report

    def seconds_to_next(self) -> float:
        return max(0.0, min(self.due.values(), default=60.0) - time.monotonic())

    def wake_checks(self, names: Iterable[str]) -> None:
        """The XID listener or the kernel log saw something: run these checks at once."""
        now = time.monotonic()
        woken = [name for name in names if name in self.due]
        for name in woken:
            self.due[name] = now
        if woken:
            self.wake.set()

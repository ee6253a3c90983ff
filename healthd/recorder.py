"""What a check round's results become in the store, and which of them are fresh faults.

CONDITION results become conditions, one per (check, target), their `since` moving only when
status or reason changes; a target a check no longer reports is cleared; EVENT results with
a fault class become events. The forms (`conditions_of`, `condition_update`,
`no_longer_reported`, `fault_events`, `event_fields`) are shared by the daemon's
`ResultRecorder` and `medic check --record` (cli.check), so both write what the other would.

`ResultRecorder` is the daemon's: it keeps each check's latest results (what the launch gate,
the socket and the metrics read), rewrites an unchanged condition only every
REFRESH_SECONDS, hands fresh faults to `on_fault` on a thread of their own, and rides out a
store that refuses writes (conditions wait in memory, events in the node's journal, both
written once it is back).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from healthd.checks.base import Kind, Result, Status
from healthd.results import SEVERITY_OF, merge_by_target
from healthd.runner import RunReport
from medic_core.config import MedicConfig
from medic_core.journal import keep_in_journal
from medic_core.store import ConditionChange, ConditionUpdate, Severity, Store

log = logging.getLogger("medic.healthd")

# A fresh WARN with one of these recommendations is acted on too: a reset once the node is
# idle (pending page retirement, pending row remap), and an application restart (XID 94).
ACTIONABLE_WARN = ("gpu_reset_when_idle", "restart_app", "drain_after_job")
STORE_RETRY = 5.0  # seconds between tries of a store that refused a write
JOURNAL_LOOK = 10.0  # seconds between looks for journal entries to replay (two listings)
REFRESH_SECONDS = 300.0  # an unchanged condition's message, evidence and updated_at


# ---- the forms, shared with `medic check --record` --------------------------------------------


def conditions_of(results: Iterable[Result]) -> list[Result]:
    """A check's CONDITION results, one per target (the worst, the rest in its evidence)."""
    return merge_by_target(r for r in results if r.kind is Kind.CONDITION)


def condition_update(result: Result) -> ConditionUpdate:
    return ConditionUpdate(
        type=result.check,
        status=result.status,
        target=result.target or "",
        reason=result.fault_class or "",
        message=result.message,
        evidence=dict(result.evidence),
    )


def no_longer_reported(
    previous: Iterable[tuple[str, str]], updates: Iterable[ConditionUpdate]
) -> list[ConditionUpdate]:
    """A target a check no longer reports (a GPU's XID aged out) is cleared rather than left
    CRITICAL for ever: an OK update for each (type, target) of `previous` not in `updates`."""
    seen = {(u.type, u.target) for u in updates}
    cleared = []
    for key in previous:
        if key not in seen:
            cleared.append(
                ConditionUpdate(type=key[0], status=Status.OK, target=key[1],
                                message="no longer reported")
            )  # fmt: skip
            seen.add(key)
    return cleared


def fault_events(results: Iterable[Result]) -> list[Result]:
    """The EVENT results worth an event: an event without a fault class ("0 new kernel log
    records") is not news; an OK one with a class in its evidence (an IGNORE-bucket XID)
    is history."""
    return [
        r
        for r in results
        if r.kind is Kind.EVENT and (r.fault_class or r.evidence.get("fault_class"))
    ]


def event_fields(event: Result, source: str) -> dict[str, Any]:
    """Store.add_event's keywords (the node and time aside) for one of `fault_events`."""
    return {
        "kind": event.check,
        "severity": SEVERITY_OF.get(event.status, Severity.INFO),
        "source": source,
        "message": event.message,
        "fault_class": event.fault_class or str(event.evidence.get("fault_class") or ""),
        "target": event.target or "",
        "evidence": dict(event.evidence),
    }


# ---- the daemon's recorder --------------------------------------------------------------------


class RecorderHost(Protocol):
    """What the recorder reads of the daemon, at every use (a reload replaces the
    configuration)."""

    @property
    def node(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def config(self) -> MedicConfig: ...


class ResultRecorder:
    def __init__(self, host: RecorderHost, observe: Callable[[RunReport], None]) -> None:
        self.host = host
        self.observe = observe  # called with each recorded round, under the record lock
        # Called (on its own thread) with the results that just turned CRITICAL.
        self.on_fault: Callable[[list[Result]], None] | None = None
        # check name -> (monotonic time of its last run, its condition results)
        self._latest: dict[str, tuple[float, tuple[Result, ...]]] = {}
        self._record_lock = threading.Lock()
        # (type, target) -> (status, reason, message, monotonic time written): unchanged
        # conditions are rewritten only every REFRESH_SECONDS (a store write per condition
        # per run was most of the daemon's CPU).
        self._written: dict[tuple[str, str], tuple[str, str, str, float]] = {}
        # While the store refuses writes: the newest update of each condition it has not
        # taken (with its time), the status this daemon last saw of each, and why.
        self._unsynced: dict[tuple[str, str], tuple[ConditionUpdate, dt.datetime]] = {}
        self._known: dict[tuple[str, str], Status] = {}
        self._store_down = ""
        self._store_down_since = 0.0
        self._store_failed_at = 0.0
        self.store_retry = STORE_RETRY
        self._wrote = False  # this round wrote to the store
        self._journaled = False  # events wait in the node's journal
        self._journal_looked = -JOURNAL_LOOK
        self._replay_problem = ""  # why the last replay stopped with entries left ("" if not)

    def latest(self, name: str) -> tuple[float, tuple[Result, ...]] | None:
        """(monotonic time of the check's last run, its condition results), or None."""
        return self._latest.get(name)

    def current(self) -> list[Result]:
        return [r for _, results in self._latest.values() for r in results]

    def record(self, report: RunReport) -> None:
        """Write a round's conditions and events, and hand its fresh faults to `on_fault`.

        The answer to a fault never waits on the store: when it cannot take the round (its
        database down, its disk full), fresh faults are told from what this daemon last
        knew, the conditions wait in memory (newest per target, written in order once the
        store is back) and the events in the node's journal (replayed with their times)."""
        at = report.started
        finished = time.monotonic()
        new_faults: list[Result] = []
        with self._record_lock:
            self._wrote = False
            store_up, flushed = self._flush_unsynced()
            new_faults += flushed
            for outcome in report.outcomes:
                conditions = conditions_of(outcome.results)
                events = fault_events(outcome.results)
                previous = self._previous_targets(outcome.name)
                self._latest[outcome.name] = (finished, tuple(conditions))
                updates = [condition_update(r) for r in conditions]
                updates += no_longer_reported(previous, updates)
                updates = [u for u in updates if self._worth_writing(u, finished)]
                # A new CRITICAL, or a new WARN that asks for a reset once the node is idle
                # (pending page retirement, pending row remap): both start the ladder.
                when_idle = {
                    (r.check, r.target or "")
                    for r in conditions
                    if r.status == Status.WARN
                    and r.evidence.get("recommendation") in ACTIONABLE_WARN
                }
                changes = self._write_conditions(updates, at, finished, store_up)
                if changes is None:
                    store_up = False
                    fresh = {
                        (u.type, u.target)
                        for u in updates
                        if self._known.get((u.type, u.target)) != u.status
                        and (u.status == Status.CRITICAL or (u.type, u.target) in when_idle)
                    }
                else:
                    fresh = {
                        (c.type, c.target)
                        for c in changes
                        if c.previous_status != c.status
                        and (c.status == Status.CRITICAL or (c.type, c.target) in when_idle)
                    }
                    self._log_changes(changes)
                for u in updates:
                    self._known[(u.type, u.target)] = Status(u.status)
                new_faults += [r for r in conditions if (r.check, r.target or "") in fresh]
                # A CRITICAL event is news by itself (a kernel oops, an MCE): answered like a
                # fresh CRITICAL condition, unless its check marked it as history.
                new_faults += [
                    e
                    for e in events
                    if e.status is Status.CRITICAL and not e.evidence.get("history")
                ]
                for event in events:
                    record = event_fields(event, f"check:{event.check}")
                    store_up = self._store_event(at, record, store_up)
            if store_up and self._wrote:  # back only once a write went through
                self._store_back()
            # The journal also holds what the ladder's thread and the hooks could not store.
            if store_up and (self._journaled or finished - self._journal_looked > JOURNAL_LOOK):
                self._journal_looked = finished
                self._replay_journal()
            self.observe(report)  # the metrics' scrapes read this round's results
        if new_faults and self.on_fault is not None:
            # Slurm calls take time and may hang: never on the scheduler's thread.
            threading.Thread(
                target=self._respond, args=(self.on_fault, new_faults), daemon=True
            ).start()

    def add_event(self, at: dt.datetime, record: dict[str, Any]) -> None:
        """An event of the daemon's own (not a check's): into the store, or the node's
        journal while the store is down."""
        self._store_event(at, record, not self._store_down)

    def _write_conditions(
        self, updates: list[ConditionUpdate], at: dt.datetime, now: float, store_up: bool
    ) -> list[ConditionChange] | None:
        """The store's changes, or None when it refused them or is known to be down (they
        wait for `_flush_unsynced`, which keeps their order)."""
        if not updates:
            return [] if store_up else None
        if store_up:
            try:
                changes = self.host.store.set_conditions(self.host.node, updates, at)
            except Exception as exc:  # down, full, read-only: the round goes on without it
                self._store_failed(exc)
            else:
                self._wrote = True
                self._mark_written(updates, now)
                return changes
        for u in updates:
            # The newest word on each condition, with the time its status began.
            key = (u.type, u.target)
            self._written.pop(key, None)  # what the store last took is not the news now
            waiting = self._unsynced.get(key)
            same = waiting is not None and waiting[0].status == u.status
            self._unsynced[key] = (u, waiting[1] if waiting is not None and same else at)
        return None

    def _flush_unsynced(self) -> tuple[bool, list[Result]]:
        """Write what waited for the store, oldest first. (whether the store took it all,
        the faults the store sees as fresh in it and the checks still report: now that the
        store is back they are admitted again, and their episodes open)."""
        if self._store_down and time.monotonic() - self._store_failed_at < self.store_retry:
            return False, []  # a store that hangs each call (a partition) costs one per retry
        faults: list[Result] = []
        for at in sorted({when for _, when in self._unsynced.values()}):
            batch = [u for u, when in self._unsynced.values() if when == at]
            try:
                changes = self.host.store.set_conditions(self.host.node, batch, at)
            except Exception as exc:
                self._store_failed(exc)
                return False, faults
            self._wrote = True
            for u in batch:
                del self._unsynced[(u.type, u.target)]
            self._mark_written(batch, time.monotonic())
            self._log_changes(changes)
            faults += self._still_faults(c for c in changes if c.previous_status != c.status)
        return True, faults

    def _still_faults(self, changes: Iterable[ConditionChange]) -> list[Result]:
        found = []
        for change in changes:
            latest = self._latest.get(change.type)
            for r in latest[1] if latest is not None else ():
                if (r.target or "") != change.target or r.status != change.status:
                    continue
                if r.status == Status.CRITICAL or (
                    r.status == Status.WARN and r.evidence.get("recommendation") in ACTIONABLE_WARN
                ):
                    found.append(r)
        return found

    def _store_event(self, at: dt.datetime, record: dict[str, Any], store_up: bool) -> bool:
        """Into the store (True), or the node's journal when it is down (replayed once back)."""
        if store_up:
            try:
                self.host.store.add_event(node=self.host.node, at=at, **record)
                self._wrote = True
                return True
            except Exception as exc:
                self._store_failed(exc)
        keep_in_journal(self.host.config, at, record, self._store_down or "the store is down")
        self._journaled = True
        return False

    def _replay_journal(self) -> None:
        from medic_core import journal

        def add(entry: journal.Entry) -> None:
            self.host.store.add_event(**entry.store_fields())

        done = journal.replay(self.host.config.paths, add, deadline=time.monotonic() + 5.0)
        if done.delivered or done.set_aside:
            log.info(
                "journal: %d events replayed into the store, %d left%s",
                done.delivered,
                done.left,
                "".join(f"; set aside {line}" for line in done.set_aside),
            )
        # Why entries still wait, once per reason (tried again every round meanwhile).
        problem = done.stopped if done.left else ""
        if problem and problem != self._replay_problem:
            log.warning("journal: %d events wait: the replay stopped (%s)", done.left, problem)
        self._replay_problem = problem
        self._journaled = done.left > 0

    def _store_failed(self, exc: Exception) -> None:
        self._store_failed_at = time.monotonic()
        if self._store_down:
            return
        self._store_down = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        self._store_down_since = time.monotonic()
        log.error(
            "the store refused a write (%s): faults are still answered; conditions wait in"
            " memory and events in the node's journal until it is back",
            self._store_down,
        )

    def _store_back(self) -> None:
        if not self._store_down:
            return
        log.warning(
            "the store is back after %.0fs: the conditions that waited are written",
            time.monotonic() - self._store_down_since,
        )
        self._store_down = ""
        self._journaled = True  # what the ladder's thread kept meanwhile: replayed now

    def _log_changes(self, changes: Iterable[ConditionChange]) -> None:
        for change in changes:
            if change.previous_status is None and change.status == Status.OK:
                continue  # a first, healthy observation is not news
            log.info(
                "condition %s/%s: %s %s -> %s %s: %s",
                change.type,
                change.target or "-",
                change.previous_status,
                change.previous_reason or "",
                change.status,
                change.reason,
                change.message,
            )

    def _respond(self, respond: Callable[[list[Result]], None], faults: list[Result]) -> None:
        try:
            respond(faults)
        except Exception:
            log.exception("responding to %s failed", [r.fault_class for r in faults])

    def _previous_targets(self, check: str) -> list[tuple[str, str]]:
        """What `check` reported last time. On its first run since this daemon started, that
        is what the store holds for it: a condition an earlier daemon (an earlier boot) left
        CRITICAL would otherwise stay CRITICAL, and the same fault again would be no change."""
        latest = self._latest.get(check)
        if latest is not None:
            return [(r.check, r.target or "") for r in latest[1]]
        try:
            stored = self.host.store.conditions(self.host.node, type=check)
        except Exception as exc:
            self._store_failed(exc)
            return []
        return [
            (c.type, c.target)
            for c in stored
            if c.status in (Status.WARN, Status.CRITICAL, Status.UNKNOWN)
        ]

    def _worth_writing(self, update: ConditionUpdate, now: float) -> bool:
        key = (update.type, update.target)
        seen = (str(update.status), update.reason, update.message)
        last = self._written.get(key)
        return not (last is not None and last[:3] == seen and now - last[3] < REFRESH_SECONDS)

    def _mark_written(self, updates: Iterable[ConditionUpdate], now: float) -> None:
        """Only once the store took them: a refused write is tried again next round."""
        for u in updates:
            self._written[(u.type, u.target)] = (str(u.status), u.reason, u.message, now)

"""`medic-healthd`: the node daemon, and the composition root that wires its parts.

One scheduler thread runs due checks (per-check interval with jitter) through the Runner;
the NVML event listener hands XIDs in as they happen and wakes the scheduler so the XID check
runs at once. Results go to the store: CONDITION results become conditions (their `since`
moves only when status or reason changes), EVENT results become events; a fresh fault goes
to the remediation ladder's thread (`healthd.ladder_thread`). A local socket
(`healthd.socket_api`) answers the Slurm hooks and the CLI, the launch questions through the
launch gate (`healthd.launch_gate`). systemd: Type=notify with a watchdog that is pinged only
while the scheduler and the XID listener make progress (`healthd.watchdog`), a STATUS= line
every few seconds, SIGHUP reloads the configuration (RELOADING=1 ... READY=1), SIGTERM stops
cleanly; log lines carry syslog priorities when stderr is the journal (`healthd.logs`), and
a configuration it cannot use exits EXIT_CONFIG, which the unit does not restart.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import faulthandler
import logging
import random
import signal
import socketserver
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from healthd import logs, sdnotify
from healthd.checks.base import CheckContext, Kind, Result, Status, Tier, gpu_checks_skipped
from healthd.config_check import validate_config
from healthd.gpu_plumbing import GpuPlumbing, start_gpu_plumbing
from healthd.jobs import SpoolJobState
from healthd.kmsg_watch import KmsgWatcher
from healthd.ladder_thread import LadderThread, attach_ladder
from healthd.launch_gate import LaunchGate
from healthd.link_watch import Judged, LinkWatch
from healthd.metrics import DaemonMetrics
from healthd.results import SEVERITY_OF, merge_by_target
from healthd.runner import Runner, RunnerBusy, RunReport
from healthd.socket_api import SocketApi
from healthd.wakeup import Wakeup
from healthd.watchdog import Heartbeat, Watchdog
from healthd.xid_listener import EventKind, GpuEvent
from medic_core.config import ConfigError, MedicConfig, load_config
from medic_core.journal import keep_in_journal
from medic_core.settings import DaemonSettings
from medic_core.store import (
    ConditionChange,
    ConditionUpdate,
    Severity,
    Store,
    StoreError,
    open_configured_store,
)

log = logging.getLogger("medic.healthd")

# A fresh WARN with one of these recommendations is acted on too: a reset once the node is
# idle (pending page retirement, pending row remap), and an application restart (XID 94).
ACTIONABLE_WARN = ("gpu_reset_when_idle", "restart_app", "drain_after_job")
STORE_RETRY = 5.0  # seconds between tries of a store that refused a write
JOURNAL_LOOK = 10.0  # seconds between looks for journal entries to replay (two listings)
ROUND_PARALLEL = 2  # checks of a scheduled round that run at once (see HealthDaemon.run_due)
COALESCE_SECONDS = 5.0  # a check due this soon (at most half its interval) runs now
REFRESH_SECONDS = 300.0  # an unchanged condition's message, evidence and updated_at
# The scheduler never waits long for the runner: a run asked for through the socket (a
# sweep's deep probe) may hold it for up to the deep checks' timeouts, an hour, far past
# WatchdogSec. Due checks that could not start within RUNNER_WAIT seconds are skipped this
# round and tried again BUSY_RETRY seconds later; the scheduler goes round meanwhile, so the
# watchdog sees it beat, while a scheduler really stuck (a store write that hangs) does not.
RUNNER_WAIT = 1.0
BUSY_RETRY = 5.0
# Exit status for a configuration the daemon cannot use (a bad medic.toml, a bad store URL):
# EX_CONFIG of sysexits.h (systemd shows it as "78/CONFIG"). The unit does not restart on it
# (RestartPreventExitStatus=78): restarting cannot fix a file, a human must.
EXIT_CONFIG = 78


class HealthDaemon:
    def __init__(
        self,
        config: MedicConfig,
        store: Store,
        ctx: CheckContext,
        gpu: GpuPlumbing | None = None,
    ) -> None:
        self.store = store
        if not ctx.gpu_skip:  # a CPU node runs no GPU checks: the rule `medic check` follows
            gpus = DaemonSettings.from_config(config).gpus
            driver = gpu is not None or ctx.nvml is not None
            ctx = dataclasses.replace(ctx, gpu_skip=gpu_checks_skipped(gpus, driver))
        self.ctx = ctx
        self.gpu = gpu
        self.node = config.node_name
        self.metrics = DaemonMetrics(self.node)
        self._wake = Wakeup()  # set by other threads and, in main(), by any signal
        self._stop = threading.Event()
        self.heartbeat = Heartbeat()  # the scheduler went round: the watchdog reads it
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
        self._due: dict[str, float] = {}
        self.runner_wait, self.busy_retry = RUNNER_WAIT, BUSY_RETRY
        self._busy_since: float | None = None  # the runner was busy when checks were due
        self.runner: Runner | None = None
        self.kmsg: KmsgWatcher | None = None
        self.links: LinkWatch | None = None
        # Every watcher and the ladder started (main(), as READY=1 tells systemd): `ping`
        # says so, and the lab waits for it before it injects a fault.
        self.ready = False
        # Called (on its own thread) with the results that just turned CRITICAL.
        self.on_fault: Callable[[list[Result]], None] | None = None
        # The remediation ladder's thread (attached by build_daemon when Slurm is at hand).
        self.ladder: LadderThread | None = None
        self.gate = LaunchGate(self)
        self.notify: Callable[[str], object] = sdnotify.notify  # systemd's notify socket
        self._reload_lock = threading.Lock()
        self.apply_config(config)
        self._retire_not_run_here()
        if gpu is not None:
            gpu.on_xid = self.wake_checks
            gpu.on_event = self._on_gpu_event

    # ---- configuration -----------------------------------------------------------------

    def apply_config(self, config: MedicConfig) -> None:
        """Validate everything first (every table, as `medic config check` does), then swap:
        a bad file on SIGHUP changes nothing."""
        configs = validate_config(config)
        settings = DaemonSettings.from_config(config)
        if self.runner is None:
            self.runner = Runner(self.ctx, configs)
        else:
            self.runner.reconfigure(configs)
        self.config = config
        self.settings = settings
        now = time.monotonic()
        # Everything is due at start and after a reload.
        self._due = {name: now for name in self.runner.selected(tier=Tier.PERIODIC)}
        self._wake.set()

    def reload(self, path: Path | None = None) -> bool:
        """SIGHUP: re-read the file. systemd hears RELOADING=1 before and READY=1 after,
        whether the new file was taken or refused (the daemon runs on either way)."""
        with self._reload_lock:  # two SIGHUPs in a row: one reload after the other
            self.notify(sdnotify.reloading())
            try:
                self.apply_config(load_config(path or self.config.source))
            except ConfigError as exc:
                for line in exc.lines():  # every problem, one line each
                    log.error("reload refused, keeping the running configuration: %s", line)
                return False
            finally:
                self.notify("READY=1")
            log.info("configuration reloaded from %s", self.config.source)
            return True

    def _retire_not_run_here(self) -> None:
        """Conditions of checks this node does not run (GPU checks on a CPU node), left by
        an earlier daemon (one that reported them UNKNOWN, or ran on a GPU), become
        NOT_APPLICABLE: the node's health in the store is then what it runs."""
        updates = [
            ConditionUpdate(
                type=name,
                status=Status.NOT_APPLICABLE,
                target=c.target,
                message=f"not run on this node: {why}",
            )
            for name in self.checks.specs
            if (why := self.checks.not_here(name))
            for c in self.store.conditions(self.node, type=name)
            if c.status != Status.NOT_APPLICABLE
        ]
        if updates:
            self.store.set_conditions(self.node, updates, dt.datetime.now(dt.UTC))
            log.info(
                "%d conditions of checks not run on this node set NOT_APPLICABLE", len(updates)
            )

    @property
    def checks(self) -> Runner:
        assert self.runner is not None
        return self.runner

    # ---- running checks ----------------------------------------------------------------

    def _base_interval(self, name: str) -> float | None:
        """The check's configured interval; None for a site command check a reload just
        removed."""
        spec, cfg = self.checks.specs.get(name), self.checks.configs.get(name)
        return None if spec is None or cfg is None else spec.interval_for(cfg)

    def _interval(self, name: str) -> float:
        base = self._base_interval(name)
        if base is None:
            return float(self.settings.prune_every)
        jitter = self.settings.jitter
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
        due_at = {n: at for n, at in list(self._due.items()) if at <= now + self._early(n)}
        due = list(due_at)
        if not due:
            return None
        # Before the run, so an event during it makes the check due again. A check run early
        # (to join this round) keeps its own pace: its next time counts from when it was due.
        planned = {name: max(now, at) + self._interval(name) for name, at in due_at.items()}
        self._due.update(planned)
        try:
            report = self.checks.run(due, wait=self.runner_wait, parallel=ROUND_PARALLEL)
        except RunnerBusy:
            retry = time.monotonic() + self.busy_retry
            for name in due:
                if self._due.get(name) == planned[name]:  # not woken meanwhile
                    self._due[name] = min(planned[name], retry)
            if self._busy_since is None:
                self._busy_since = now
                log.info(
                    "the check runner is busy with another run (a check asked for through "
                    "the socket, such as a sweep's deep probe): %d due checks wait for it "
                    "(%s), tried again every %gs",
                    len(due),
                    ", ".join(due),
                    self.busy_retry,
                )
            return None
        if self._busy_since is not None:
            log.info(
                "the check runner is free again: periodic checks resume after %.0fs",
                now - self._busy_since,
            )
            self._busy_since = None
        self.record(report)
        return report

    def run_checks(
        self,
        names: Iterable[str] | None = None,
        *,
        tier: Tier | None = None,
        budget: float | None = None,
        wait: float | None = None,
    ) -> RunReport:
        report = self.checks.run(
            None if names is None else list(names), tier=tier, budget=budget, wait=wait
        )
        self.record(report)
        return report

    def seconds_to_next(self) -> float:
        return max(0.0, min(self._due.values(), default=60.0) - time.monotonic())

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
                conditions = merge_by_target(r for r in outcome.results if r.kind is Kind.CONDITION)
                # An event without a fault class ("0 new kernel log records") is not news; an
                # OK one with a class in its evidence (an IGNORE-bucket XID) is history.
                events = [
                    r
                    for r in outcome.results
                    if r.kind is Kind.EVENT and (r.fault_class or r.evidence.get("fault_class"))
                ]
                previous = self._previous_targets(outcome.name)
                self._latest[outcome.name] = (finished, tuple(conditions))
                updates = [self._update(r) for r in conditions]
                seen = {(u.type, u.target) for u in updates}
                # A target a check no longer reports (a GPU's XID aged out) is cleared rather
                # than left CRITICAL for ever.
                for key in previous:
                    if key not in seen:
                        updates.append(
                            ConditionUpdate(
                                type=key[0],
                                status=Status.OK,
                                target=key[1],
                                message="no longer reported",
                            )
                        )
                        seen.add(key)
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
                    store_up = self._add_event(at, event, store_up)
            if store_up and self._wrote:  # back only once a write went through
                self._store_back()
            # The journal also holds what the ladder's thread and the hooks could not store.
            if store_up and (self._journaled or finished - self._journal_looked > JOURNAL_LOOK):
                self._journal_looked = finished
                self._replay_journal()
            self.metrics.observe_report(report)
            self.metrics.observe_round(self)  # the scrapes read this round's results
        if new_faults and self.on_fault is not None:
            # Slurm calls take time and may hang: never on the scheduler's thread.
            threading.Thread(
                target=self._respond, args=(self.on_fault, new_faults), daemon=True
            ).start()

    def _write_conditions(
        self, updates: list[ConditionUpdate], at: dt.datetime, now: float, store_up: bool
    ) -> list[ConditionChange] | None:
        """The store's changes, or None when it refused them or is known to be down (they
        wait for `_flush_unsynced`, which keeps their order)."""
        if not updates:
            return [] if store_up else None
        if store_up:
            try:
                changes = self.store.set_conditions(self.node, updates, at)
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
                changes = self.store.set_conditions(self.node, batch, at)
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

    def _add_event(self, at: dt.datetime, event: Result, store_up: bool) -> bool:
        record: dict[str, Any] = {
            "kind": event.check,
            "severity": SEVERITY_OF.get(event.status, Severity.INFO),
            "source": f"check:{event.check}",
            "message": event.message,
            "fault_class": event.fault_class or str(event.evidence["fault_class"]),
            "target": event.target or "",
            "evidence": dict(event.evidence),
        }
        return self._store_event(at, record, store_up)

    def _store_event(self, at: dt.datetime, record: dict[str, Any], store_up: bool) -> bool:
        """Into the store (True), or the node's journal when it is down (replayed once back)."""
        if store_up:
            try:
                self.store.add_event(node=self.node, at=at, **record)
                self._wrote = True
                return True
            except Exception as exc:
                self._store_failed(exc)
        keep_in_journal(self.config, at, record, self._store_down or "the store is down")
        self._journaled = True
        return False

    def _replay_journal(self) -> None:
        from medic_core import journal

        def add(entry: journal.Entry) -> None:
            self.store.add_event(**entry.store_fields())

        done = journal.replay(self.config.paths, add, deadline=time.monotonic() + 5.0)
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
            stored = self.store.conditions(self.node, type=check)
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

    @staticmethod
    def _update(result: Result) -> ConditionUpdate:
        return ConditionUpdate(
            type=result.check,
            status=result.status,
            target=result.target or "",
            reason=result.fault_class or "",
            message=result.message,
            evidence=dict(result.evidence),
        )

    def ports_judged(self) -> Judged | None:
        """The InfiniBand ports the `ib` check's latest run judged, and those it held down
        or could not read (None: it has not run)."""
        latest = self.latest("ib")
        if latest is None:
            return None
        ports = frozenset(r.target for r in latest[1] if r.target and "/" in r.target)
        down = frozenset(
            r.target
            for r in latest[1]
            if r.target in ports and r.fault_class in ("ib.port.down", "check.read_error")
        )
        return Judged(ports, down)

    def wake_checks(self, names: Iterable[str]) -> None:
        """The XID listener or the kernel log saw something: run these checks at once."""
        now = time.monotonic()
        woken = [name for name in names if name in self._due]
        for name in woken:
            self._due[name] = now
        if woken:
            self._wake.set()

    def _on_gpu_event(self, event: GpuEvent) -> None:
        gpu = "" if event.gpu is None else str(event.gpu)
        self.metrics.gpu_events.labels(event.kind.value, gpu).inc()
        if event.kind is EventKind.GPU_LOST:
            record: dict[str, Any] = {
                "kind": "gpu_listener",
                "severity": Severity.CRITICAL,
                "source": "nvml:events",
                "message": f"GPU {gpu or '?'}: NVML says the GPU is lost ({event.detail})",
                "fault_class": "gpu.lost",
                "target": gpu,
            }
            self._store_event(dt.datetime.now(dt.UTC), record, not self._store_down)

    def gpu_identities(self) -> list[dict[str, Any]]:
        if self.gpu is None:
            return []
        found = []
        for index in range(64):
            info = self.gpu.client.cached_gpu_info(index)
            if info is None:
                break
            found.append(
                {"index": info.index, "uuid": info.uuid, "serial": info.serial,
                 "pci_bus_id": info.pci_bus_id}
            )  # fmt: skip
        return found

    def current(self) -> list[Result]:
        return [r for _, results in self._latest.values() for r in results]

    def status_line(self) -> str:
        """One line for `systemctl status` (STATUS=): "watching 8 GPUs; last round 2 s ago;
        0 CRITICAL", and what the scheduler is waiting for when it is."""
        if self.gpu is None:
            gpus = "no GPUs (CPU node)"
        else:
            latest = self._latest.get("gpu_count")
            counts = [r.evidence.get("count") for r in latest[1]] if latest else []
            count = next((c for c in counts if isinstance(c, int)), None)
            gpus = "GPUs (not counted yet)" if count is None else f"{count} GPUs"
        since = self.heartbeat.stalled_for()
        round_words = "no check round yet" if since is None else f"last round {since:.0f} s ago"
        seen = Counter(r.status for r in self.current())
        found = [f"{seen[Status.CRITICAL]} CRITICAL"]
        found += [f"{seen[s]} {s.value}" for s in (Status.UNKNOWN, Status.WARN) if seen[s]]
        line = f"watching {gpus}; {round_words}; {', '.join(found)}"
        busy_since = self._busy_since
        if busy_since is not None:
            waited = time.monotonic() - busy_since
            line += f"; periodic checks waiting {waited:.0f} s for a run in progress"
        return line

    def latest(self, name: str) -> tuple[float, tuple[Result, ...]] | None:
        """(monotonic time of the check's last run, its condition results), or None."""
        return self._latest.get(name)

    # ---- wiring the parts --------------------------------------------------------------

    def attach(self, ladder: LadderThread) -> None:
        """The ladder's thread answers fresh faults and stops with the daemon; the rails its
        ticks read (every 5 s idle) keep the launch gate's fresh."""
        self.ladder = ladder
        self.on_fault = ladder.respond
        ladder.ladder.on_rails = self.gate.observe_rails
        self.gate.before_launch = ladder.guard_launch

    def serve(self, socket_path: Path) -> socketserver.UnixStreamServer:
        """The local socket, answering from this daemon, its launch gate and its ladder."""
        episodes = self.ladder.episodes if self.ladder is not None else None
        return SocketApi(self, self.gate, episodes).serve(socket_path)

    # ---- main loop ---------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self.ladder is not None:
            self.ladder.stop()

    def wake_on_signals(self) -> None:
        """Any signal wakes the main loop at once, whichever thread the kernel gave it to."""
        self._wake.ring_on_signals()

    def loop(self) -> None:
        # Idle, the scheduler still goes round every half WatchdogSec: the watchdog sees it
        # beat, and an idle scheduler never looks stalled.
        watchdog = sdnotify.watchdog_period()
        last_prune = 0.0
        from healthd.inventory import InventoryRecorder  # off the start-up path

        # The node's inventory, for `medic fleet drift`: now, then every [fleet] inventory_every.
        inventory = InventoryRecorder.for_daemon(self)
        self.heartbeat.beat()
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.run_due()
                inventory.tick()
                if time.monotonic() - last_prune > self.settings.prune_every:
                    self.store.prune(dt.datetime.now(dt.UTC), self._retention_days())
                    last_prune = time.monotonic()
            except Exception:  # the daemon outlives any single failure; the watchdog does not
                log.exception("scheduler iteration failed")
            self.heartbeat.beat()
            wait = self.seconds_to_next()
            if watchdog is not None:
                wait = min(wait, watchdog)
            self._wake.wait(timeout=wait)

    def _retention_days(self) -> int:
        from medic_core.store import store_settings

        return store_settings(self.config).event_retention_days


def build_daemon(config: MedicConfig) -> HealthDaemon:
    settings = DaemonSettings.from_config(config)
    store = open_configured_store(config)
    node = config.node_name
    spool = Path(settings.slurmd_spool_dir.replace("%n", node).replace("{node}", node))
    jobs = SpoolJobState(spool, config.node_name)
    gpu = start_gpu_plumbing(settings.gpus, jobs, call_timeout=settings.nvml_call_timeout)
    ctx = CheckContext.for_root(config.paths.host_root, state_dir=config.paths.state_dir)
    if gpu is not None:
        ctx = gpu.extend(ctx)
    daemon = HealthDaemon(config, store, ctx, gpu)
    daemon.kmsg = KmsgWatcher(config.paths.host_root / "dev" / "kmsg", daemon.wake_checks)
    daemon.links = LinkWatch(config.paths.host_root, daemon.wake_checks, judged=daemon.ports_judged)
    daemon.attach(attach_ladder(daemon))
    return daemon


def watch_progress(
    daemon: HealthDaemon, period: float, notify: Callable[[str], object] = sdnotify.notify
) -> Watchdog:
    """systemd's watchdog for `daemon`: WATCHDOG=1 every `period` (half of WatchdogSec) while
    the check scheduler and the XID listener have both made progress within WatchdogSec."""
    watchdog = Watchdog(period, stall_after=2 * period, notify=notify)
    watchdog.watch("the check scheduler", daemon.heartbeat.stalled_for)
    if daemon.gpu is not None:
        watchdog.watch("the XID listener", daemon.gpu.stalled_for)
    return watchdog


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="medic-healthd", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", type=Path, help="config file (default: MEDIC_CONFIG or /etc/medic/medic.toml)"
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    )
    args = parser.parse_args(argv)
    journal = logs.configure(args.log_level, sys.stderr)
    try:
        config = load_config(args.config)
        validate_config(config)  # every table, before the store is opened
        daemon = build_daemon(config)
    except (ConfigError, ValueError) as exc:  # a file or URL no restart can fix
        lines = exc.lines() if isinstance(exc, ConfigError) else [str(exc)]
        for problem in lines:
            line = f"medic-healthd: {problem}"
            print(logs.with_priority(line, logging.ERROR) if journal else line, file=sys.stderr)
        return EXIT_CONFIG
    except StoreError as exc:  # down, corrupt or read-only: systemd tries again (Restart=)
        line = f"medic-healthd: {exc}"
        print(logs.with_priority(line, logging.ERROR) if journal else line, file=sys.stderr)
        return 1
    server = daemon.serve(config.paths.socket)
    if daemon.settings.metrics_port:
        daemon.metrics.serve(daemon.settings.metrics_address, daemon.settings.metrics_port)
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    # `kill -USR1` prints every thread's stack to the log: what a stuck daemon is waiting on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=daemon.reload).start())
    daemon.wake_on_signals()
    log.info(
        "medic-healthd for %s: %d checks, %s GPU plumbing, socket %s",
        daemon.node,
        len(daemon.checks.specs),
        "with" if daemon.gpu else "without",
        config.paths.socket,
    )
    if daemon.kmsg is not None:
        daemon.kmsg.start()
    if daemon.links is not None:
        daemon.links.start()
    if daemon.ladder is not None:  # also continues an episode a restart interrupted
        daemon.ladder.start()
    period = sdnotify.watchdog_period()  # None: not run by systemd with WatchdogSec
    watchdog = None if period is None else watch_progress(daemon, period)
    status = sdnotify.StatusReporter(daemon.status_line) if sdnotify.enabled() else None
    daemon.ready = True
    sdnotify.notify("READY=1")
    if watchdog is not None:
        watchdog.start()
    if status is not None:
        status.start()
    try:
        daemon.loop()
    finally:
        if watchdog is not None:
            watchdog.stop()
        if status is not None:
            status.stop()
        sdnotify.notify("STOPPING=1")
        if daemon.kmsg is not None:
            daemon.kmsg.stop()
        if daemon.links is not None:
            daemon.links.stop()
        server.shutdown()
        server.server_close()
        config.paths.socket.unlink(missing_ok=True)
        if daemon.gpu is not None:
            daemon.gpu.stop()
        daemon.store.close()
    log.info("medic-healthd stopped")
    return 0

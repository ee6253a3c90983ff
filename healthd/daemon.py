"""`medic-healthd`: the node daemon.

One scheduler thread runs due checks (per-check interval with jitter) through the Runner;
the NVML event listener hands XIDs in as they happen and wakes the scheduler so the XID check
runs at once; a local socket answers the Slurm hooks and the CLI. Results go to the store:
CONDITION results become conditions (their `since` moves only when status or reason
changes), EVENT results become events. systemd: Type=notify with a watchdog, SIGHUP reloads
the configuration, SIGTERM stops cleanly.
"""

from __future__ import annotations

import argparse
import datetime as dt
import faulthandler
import grp
import json
import logging
import os
import random
import signal
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from healthd import sdnotify
from healthd.checks import load_check_configs
from healthd.checks.base import (
    CheckContext,
    Kind,
    Result,
    Status,
    Tier,
    worst,
)
from healthd.gpu_plumbing import GpuPlumbing, start_gpu_plumbing
from healthd.jobs import SpoolJobState
from healthd.kmsg_watch import KmsgWatcher
from healthd.metrics import DaemonMetrics
from healthd.results import SEVERITY_OF, finding_of, merge_by_target, result_json
from healthd.runner import Runner, RunnerBusy, RunReport
from healthd.xid_listener import EventKind, GpuEvent
from medic_core.config import ConfigError, MedicConfig, load_config
from medic_core.settings import DaemonSettings, WebhookSettings
from medic_core.slurm import SlurmError
from medic_core.store import ConditionUpdate, Severity, Store, open_configured_store
from remediation.decide import primary
from remediation.episodes import EpisodeStore
from remediation.ladder import Ladder
from remediation.webhook import deliver_pending

log = logging.getLogger("medic.healthd")

SOCKET_OPS = ("ping", "status", "launch", "check", "job_end", "job_summary", "event", "metrics")
# What the epilog's job_end runs: the GPUs still there and clean after the job.
POST_JOB_CHECKS = ("gpu_count", "gpu_xid", "gpu_ecc", "gpu_retired_pages", "gpu_remapped_rows")
HOOK_EVENT_KINDS = ("gate", "job_summary", "job_action")
# A fresh WARN with one of these recommendations is acted on too: a reset once the node is
# idle (pending page retirement, pending row remap), and an application restart (XID 94).
ACTIONABLE_WARN = ("gpu_reset_when_idle", "restart_app")
REFRESH_SECONDS = 300.0  # an unchanged condition's message, evidence and updated_at


class HealthDaemon:
    def __init__(
        self,
        config: MedicConfig,
        store: Store,
        ctx: CheckContext,
        gpu: GpuPlumbing | None = None,
    ) -> None:
        self.store = store
        self.ctx = ctx
        self.gpu = gpu
        self.node = config.node_name
        self.metrics = DaemonMetrics(self.node)
        self._wake = threading.Event()
        self._stop = threading.Event()
        # check name -> (monotonic time of its last run, its condition results)
        self._latest: dict[str, tuple[float, tuple[Result, ...]]] = {}
        self._record_lock = threading.Lock()
        # (type, target) -> (status, reason, message, monotonic time written): unchanged
        # conditions are rewritten only every REFRESH_SECONDS (a store write per condition
        # per run was most of the daemon's CPU).
        self._written: dict[tuple[str, str], tuple[str, str, str, float]] = {}
        self._due: dict[str, float] = {}
        self.runner: Runner | None = None
        self.kmsg: KmsgWatcher | None = None
        # Called (on its own thread) with the results that just turned CRITICAL.
        self.on_fault: Callable[[list[Result]], None] | None = None
        # The remediation ladder (set by build_daemon when a store and Slurm are at hand).
        self.ladder: Ladder | None = None
        self.ladder_store: EpisodeStore | None = None
        self.ladder_lock = threading.Lock()
        self.webhook: WebhookSettings | None = None
        self.wake_ladder = threading.Event()
        self.apply_config(config)
        if gpu is not None:
            gpu.on_xid = self.wake_checks
            gpu.on_event = self._on_gpu_event

    # ---- configuration -----------------------------------------------------------------

    def apply_config(self, config: MedicConfig) -> None:
        """Validate everything first, then swap: a bad file on SIGHUP changes nothing."""
        settings = DaemonSettings.from_config(config)
        configs = load_check_configs(config)
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
        try:
            self.apply_config(load_config(path or self.config.source))
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            return False
        log.info("configuration reloaded from %s", self.config.source)
        return True

    @property
    def checks(self) -> Runner:
        assert self.runner is not None
        return self.runner

    # ---- running checks ----------------------------------------------------------------

    def _interval(self, name: str) -> float:
        spec = self.checks.specs[name]
        base = spec.interval_for(self.checks.configs[name])
        jitter = self.settings.jitter
        return float(base * (1 + random.uniform(-jitter, jitter)))

    def run_due(self) -> RunReport | None:
        now = time.monotonic()
        due = [name for name, at in list(self._due.items()) if at <= now]
        if not due:
            return None
        for name in due:  # before the run, so an event during it makes the check due again
            self._due[name] = now + self._interval(name)
        report = self.checks.run(due)
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
        at = report.started
        finished = time.monotonic()
        new_faults: list[Result] = []
        with self._record_lock:
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
                changes = self.store.set_conditions(self.node, updates, at) if updates else []
                # A new CRITICAL, or a new WARN that asks for a reset once the node is idle
                # (pending page retirement, pending row remap): both start the ladder.
                when_idle = {
                    (r.check, r.target or "")
                    for r in conditions
                    if r.status == Status.WARN
                    and r.evidence.get("recommendation") in ACTIONABLE_WARN
                }
                fresh = {
                    (c.type, c.target)
                    for c in changes
                    if c.previous_status != c.status
                    and (c.status == Status.CRITICAL or (c.type, c.target) in when_idle)
                }
                new_faults += [r for r in conditions if (r.check, r.target or "") in fresh]
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
                for event in events:
                    self.store.add_event(
                        node=self.node,
                        at=at,
                        kind=event.check,
                        severity=SEVERITY_OF.get(event.status, Severity.INFO),
                        source=f"check:{event.check}",
                        message=event.message,
                        fault_class=event.fault_class or str(event.evidence["fault_class"]),
                        target=event.target or "",
                        evidence=dict(event.evidence),
                    )
            self.metrics.observe_report(report)
            self.metrics.observe_current(self.current())
        if new_faults and self.on_fault is not None:
            # Slurm calls take time and may hang: never on the scheduler's thread.
            threading.Thread(
                target=self._respond, args=(self.on_fault, new_faults), daemon=True
            ).start()

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
        return [
            (c.type, c.target)
            for c in self.store.conditions(self.node, type=check)
            if c.status in (Status.WARN, Status.CRITICAL, Status.UNKNOWN)
        ]

    def _worth_writing(self, update: ConditionUpdate, now: float) -> bool:
        key = (update.type, update.target)
        seen = (str(update.status), update.reason, update.message)
        last = self._written.get(key)
        if last is not None and last[:3] == seen and now - last[3] < REFRESH_SECONDS:
            return False
        self._written[key] = (*seen, now)
        return True

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
            self.store.add_event(
                node=self.node,
                at=dt.datetime.now(dt.UTC),
                kind="gpu_listener",
                severity=Severity.CRITICAL,
                source="nvml:events",
                message=f"GPU {gpu or '?'}: NVML says the GPU is lost ({event.detail})",
                fault_class="gpu.lost",
                target=gpu,
            )

    def _open_tickets(self) -> list[int]:
        from remediation.tickets import TicketState, list_tickets

        return [
            t.id for t in list_tickets(self.store, node=self.node) if t.state != TicketState.CLOSED
        ]

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

    def ladder_loop(self, every: float = 2.0) -> None:
        """The ladder's own thread: repairs take minutes and must not hold up the checks."""
        while not self._stop.is_set():
            if self.ladder is not None:
                try:
                    with self.ladder_lock:
                        self.ladder.tick()
                except Exception:
                    log.exception("remediation step failed")
            if self.webhook is not None:  # RMA ticket changes to the site's ticketing system
                try:
                    deliver_pending(self.store, self.webhook)
                except Exception:
                    log.exception("webhook delivery failed")
            self.wake_ladder.wait(every)
            self.wake_ladder.clear()

    def current(self) -> list[Result]:
        return [r for _, results in self._latest.values() for r in results]

    # ---- socket operations -------------------------------------------------------------

    def launch_verdict(self, budget: float, *, fresh_only: bool = False) -> dict[str, Any]:
        """The prolog's question: may a job start here? Current launch-tier results younger
        than launch_max_age are reused; the stale ones are run now. Waiting for the runner
        (a periodic run in progress) and the run itself fit in `budget` together: a check
        that could not answer in time is UNKNOWN. With `fresh_only` (the compiled front,
        which waits only a fixed short time) stale results are not run: the reply names
        them instead of carrying a status, and the Python prolog asks again with a budget."""
        lock_step, min_run = 0.05, 0.01  # seconds
        start = time.monotonic()
        deadline = start + budget
        names = self.checks.selected(tier=Tier.LAUNCH)
        max_age = self.settings.launch_max_age

        def stale_now() -> list[str]:
            now = time.monotonic()
            return [n for n in names if now - self._latest.get(n, (-1e18, ()))[0] > max_age]

        stale = stale_now()
        if stale and fresh_only:
            return {"node": self.node, "tier": Tier.LAUNCH.value, "stale": stale}
        ran, busy = list(stale), ""
        while stale:
            left = deadline - time.monotonic()
            if left <= min_run:
                busy = f"the runner was busy for the whole {budget:g}s launch budget"
                break
            # Queue for the runner in short steps, each run capped by what is left after its
            # step, so wait + run <= budget; a periodic run that ends meanwhile may have
            # refreshed some of the stale checks, which are then reused.
            step = min(lock_step, left / 2)
            try:
                self.run_checks(stale, budget=left - step, wait=step)
                stale = []
            except RunnerBusy:
                stale = stale_now()
        results: list[Result] = []
        for name in names:
            entry = self._latest.get(name)
            if entry is None or name in stale:
                results.append(
                    Result(
                        name,
                        Status.UNKNOWN,
                        "check.busy",
                        None,
                        f"{name}: no fresh result ({busy or 'never ran'})",
                    )
                )
            else:
                results.extend(entry[1])
        return {
            "node": self.node,
            "tier": Tier.LAUNCH.value,
            "status": worst([r.status for r in results]).value,
            "ran": [n for n in ran if n not in stale],
            "seconds": round(time.monotonic() - start, 4),
            "results": [result_json(r) for r in results],
        }

    def record_hook_event(self, request: Mapping[str, Any]) -> dict[str, Any]:
        kind = str(request.get("kind", ""))
        if kind not in HOOK_EVENT_KINDS:
            return {"error": f"event kind {kind!r} is not one of {', '.join(HOOK_EVENT_KINDS)}"}
        event = self.store.add_event(
            node=self.node,
            at=dt.datetime.now(dt.UTC),
            kind=kind,
            severity=Severity(request.get("severity", "INFO")),
            source=str(request.get("source", "hook")),
            message=str(request.get("message", "")),
            fault_class=str(request.get("fault_class", "")),
            target=str(request.get("target", "")),
            evidence=dict(request.get("evidence") or {}),
        )
        return {"node": self.node, "event_id": event.id}

    def gate(self, job_id: str, verdict: Mapping[str, Any]) -> dict[str, Any]:
        """The prolog's decision on a launch verdict, with the `[hooks]` policy, recorded
        for the job (an event of kind "gate")."""
        from medic_core.settings import HookSettings
        from medic_core.vocabulary import Verdict
        from remediation.decide import decide_launch as decide

        seen = Verdict.from_reply(dict(verdict), "healthd", float(verdict.get("seconds", 0.0)))
        decision = decide(seen, HookSettings.from_config(self.config))
        first = decision.first
        self.store.add_event(
            node=self.node,
            at=dt.datetime.now(dt.UTC),
            kind="gate",
            severity=Severity.INFO if decision.allow else Severity.CRITICAL,
            source="prolog",
            message=(
                f"job {job_id} allowed ({seen.status.value})"
                if decision.allow
                else f"job {job_id} refused: {first.message if first else decision.why}"
            ),
            fault_class=first.fault_class if first else "",
            target=f"job:{job_id}",
            evidence={
                "job_id": job_id,
                "allow": decision.allow,
                "status": seen.status.value,
                "verdict_source": "healthd",
                "ran": list(verdict.get("ran", [])),
                "seconds": verdict.get("seconds"),
            },
        )
        return {"allow": decision.allow, "why": decision.why}

    def after_job(self, job_id: str) -> None:
        """Post-job checks and the job's health summary (an event of kind "job_summary");
        a CRITICAL finding goes the usual way (drain, ladder) through record()."""
        try:
            summary = self.job_summary(job_id, list(POST_JOB_CHECKS), self.settings.launch_budget)
            critical = [r for r in summary["results"] if r["status"] == "CRITICAL"]
            self.store.add_event(
                node=self.node,
                at=dt.datetime.now(dt.UTC),
                kind="job_summary",
                severity=Severity.CRITICAL if critical else Severity.INFO,
                source="epilog",
                message=summary["message"],
                fault_class=critical[0]["fault_class"] or "" if critical else "",
                target=f"job:{job_id}",
                evidence={k: v for k, v in summary.items() if k != "results"},
            )
        except Exception:
            log.exception("post-job checks for job %s failed", job_id)

    def job_summary(self, job_id: str, checks: list[str], budget: float) -> dict[str, Any]:
        """For the epilog: the post-job checks now, and what this node saw during the job
        (events since the job's gate decision, or the last day when there was none)."""
        now = dt.datetime.now(dt.UTC)
        gates = [
            e for e in self.store.events(self.node, kind="gate") if e.target == f"job:{job_id}"
        ]
        since = gates[0].at if gates else now - dt.timedelta(days=1)
        names = [n for n in checks if n in self.checks.specs]
        report = self.run_checks(names, budget=budget)
        during = [
            e
            for e in self.store.events(self.node, since=since, limit=1000)
            if e.severity != "INFO" and e.kind not in HOOK_EVENT_KINDS
        ]
        faults = sorted({e.fault_class for e in during if e.fault_class})
        bad = [r for r in report.results if r.status.severity >= Status.WARN.severity]
        faults += sorted({r.fault_class for r in bad if r.fault_class} - set(faults))
        message = f"job {job_id} on {self.node}: " + (
            f"faults {', '.join(faults)}" if faults else "no faults seen"
        )
        return {
            "node": self.node,
            "job_id": job_id,
            "since": since.isoformat(),
            "message": message,
            "faults": faults,
            "events": [
                {
                    "at": e.at.isoformat(),
                    "kind": e.kind,
                    "fault_class": e.fault_class,
                    "target": e.target,
                    "message": e.message,
                }
                for e in during[:50]
            ],
            "status": worst([r.status for r in report.results]).value,
            "results": [result_json(r) for r in report.results],
        }

    def handle(self, request: Mapping[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"node": self.node, "pid": os.getpid()}
        if op == "status":
            results = self.current()
            episode = self.ladder_store.open_for(self.node) if self.ladder_store else None
            return {
                "node": self.node,
                "status": worst([r.status for r in results]).value,
                "rma_open": self._open_tickets(),
                "remediation_episode": (
                    {"id": episode.id, "state": episode.state, "rung": episode.rung}
                    if episode
                    else None
                ),
                "hung": {k: v.isoformat() for k, v in self.checks.hung().items()},
                "results": [result_json(r) for r in results],
            }
        if op == "event":  # the hooks' records (gate decisions, job summaries) go through us
            return self.record_hook_event(request)
        if op == "job_summary":
            return self.job_summary(
                str(request.get("job_id", "")),
                [str(c) for c in request.get("checks", [])],
                min(float(request.get("budget", 10.0)), self.settings.launch_budget),
            )
        if op == "metrics":  # the Prometheus exposition, for nodes without the HTTP port
            return {"node": self.node, "text": self.metrics.exposition()}
        if op == "launch":  # "budget": what is left of the prolog's one deadline
            from medic_core.settings import HookSettings

            configured = HookSettings.from_config(self.config).launch_budget
            try:
                budget = min(float(request.get("budget", configured)), configured)
            except (TypeError, ValueError):
                return {"error": f"launch: budget {request.get('budget')!r} is not a number"}
            verdict = self.launch_verdict(
                max(0.0, budget), fresh_only=bool(request.get("fresh_only"))
            )
            job_id = request.get("job_id")
            if job_id is not None and "status" in verdict:  # a verdict, not "stale: ask again"
                verdict.update(self.gate(str(job_id), verdict))
            return verdict
        if op == "job_end":  # the epilog: answered at once, judged in the background
            job_id = str(request.get("job_id", ""))
            threading.Thread(target=self.after_job, args=(job_id,), daemon=True).start()
            return {"node": self.node, "job_id": job_id, "queued": True}
        if op == "check":
            tier = Tier(request["tier"]) if request.get("tier") else None
            names = request.get("checks")
            limit = request.get("budget")
            report = self.run_checks(
                names, tier=tier, budget=None if limit is None else float(limit)
            )
            return {
                "node": self.node,
                "tier": tier.value if tier else None,
                "status": worst([r.status for r in report.results]).value,
                "seconds": round(report.seconds, 3),
                "results": [result_json(r) for r in report.results],
            }
        return {"error": f"unknown op {op!r}: use one of {', '.join(SOCKET_OPS)}"}

    def serve(self, socket_path: Path) -> socketserver.UnixStreamServer:
        daemon = self

        from healthd.metrics import BoundedServerMixIn

        # Hooks, the health check and the CLI: a few at a time. A client must send its
        # request line within socket_idle seconds of connecting (then the op may take as
        # long as it needs); one more than socket_max is told "busy" and closed.
        socket_max, socket_idle = 64, 5.0

        class Handler(socketserver.StreamRequestHandler):
            timeout = socket_idle  # per read or write; the request line also has a deadline

            def handle(self) -> None:
                begin = time.monotonic()
                op = "invalid"
                try:
                    line = self.rfile.readline(1 << 20)
                except OSError:  # idle past socket_idle, or cut off at the deadline
                    return
                server.request_read(self.request)  # in: the op may now take its time
                if not line:  # connected and closed without a word
                    return
                try:
                    request = json.loads(line)
                    op = str(request.get("op")) if isinstance(request, dict) else "invalid"
                    reply = daemon.handle(request)
                except Exception as exc:  # one bad request must not stop the daemon
                    log.exception("socket request failed")
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                self.wfile.write(json.dumps(reply).encode() + b"\n")
                daemon.metrics.socket_requests.labels(op).inc()
                daemon.metrics.socket_seconds.labels(op).observe(time.monotonic() - begin)

        class Server(BoundedServerMixIn, socketserver.UnixStreamServer):
            # Its own bound, apart from the metrics endpoint's: a flood there never
            # reaches the hooks' socket.
            max_connections = socket_max
            idle_seconds = socket_idle
            deadline = socket_idle
            busy_reply = b'{"error": "busy: too many connections to medic-healthd"}\n'

        socket_path.parent.mkdir(parents=True, exist_ok=True)
        socket_path.unlink(missing_ok=True)
        old_umask = os.umask(0o177)  # no window in which the socket is open to everyone
        try:
            server = Server(str(socket_path), Handler)
        finally:
            os.umask(old_umask)
        self._share_socket(socket_path)
        threading.Thread(target=server.serve_forever, name="socket", daemon=True).start()
        return server

    def _share_socket(self, socket_path: Path) -> None:
        """root plus SlurmUser's group (the prolog runs as SlurmdUser, the healthcheck as
        root): mode 0660 with that group, else 0600."""
        group = self.settings.socket_group
        if not group:
            return
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            log.warning(
                "socket_group %r does not exist: socket %s is root-only", group, socket_path
            )
            return
        os.chown(socket_path, -1, gid)
        os.chmod(socket_path, 0o660)

    # ---- main loop ---------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def loop(self) -> None:
        watchdog = sdnotify.watchdog_period()
        last_prune = 0.0
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.run_due()
                if time.monotonic() - last_prune > self.settings.prune_every:
                    self.store.prune(dt.datetime.now(dt.UTC), self._retention_days())
                    last_prune = time.monotonic()
            except Exception:  # the daemon outlives any single failure; the watchdog does not
                log.exception("scheduler iteration failed")
            sdnotify.notify("WATCHDOG=1")
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
    ctx = CheckContext.for_root(config.paths.host_root)
    if gpu is not None:
        ctx = gpu.extend(ctx)
    daemon = HealthDaemon(config, store, ctx, gpu)
    daemon.kmsg = KmsgWatcher(config.paths.host_root / "dev" / "kmsg", daemon.wake_checks)
    daemon.on_fault = fault_responder(daemon)
    attach_ladder(daemon)
    return daemon


def attach_ladder(daemon: HealthDaemon) -> None:
    from healthd.ladder_host import DaemonLadderHost
    from medic_core.settings import HookSettings, RemediationSettings
    from remediation.episodes import EpisodeStore
    from slurm_hooks.actions import slurm_client

    settings = RemediationSettings.from_config(daemon.config)
    daemon.webhook = WebhookSettings.from_config(daemon.config)
    hooks = HookSettings.from_config(daemon.config)
    daemon.ladder_store = EpisodeStore(daemon.store)
    daemon.ladder = Ladder(
        daemon.node,
        daemon.ladder_store,
        slurm_client(daemon.config, hooks),
        DaemonLadderHost(daemon),
        settings,
    )


def fault_responder(daemon: HealthDaemon) -> Callable[[list[Result]], None]:
    """Slurm's side of a fresh fault: the ladder gathers the facts, the decision core
    (remediation.decide) decides drain, requeues and episode, and slurm_hooks.actions
    carries it out; each outcome is an event."""
    from medic_core.settings import HookSettings
    from slurm_hooks.actions import carry_out, job_facts, slurm_client, start_releaser

    def respond(faults: list[Result]) -> None:
        settings = HookSettings.from_config(daemon.config)
        findings = [finding_of(r) for r in faults]
        client = slurm_client(daemon.config, settings)
        now = dt.datetime.now(dt.UTC)
        if daemon.ladder is None:
            return
        with daemon.ladder_lock:
            try:
                jobs = job_facts(client, daemon.node)
            except SlurmError as exc:
                log.warning("cannot read the jobs on %s: %s", daemon.node, exc)
                jobs = []
            admission = daemon.ladder.admit(
                findings, jobs, requeue_resilient=settings.requeue_resilient
            )
            decision = admission.decision

            def make_eligible(job_id: str, restarts: int) -> None:
                start_releaser(daemon.config, job_id, restarts)

            after = make_eligible if settings.release_held else None
            drained, actions = carry_out(client, daemon.node, decision, after)
            if drained is not None:
                daemon.ladder.drained(admission, drained.value)
        daemon.wake_ladder.set()
        first = primary(findings)
        outcome = drained.value if drained else f"not drained: {decision.why}"
        daemon.store.add_event(
            node=daemon.node,
            at=now,
            kind="job_action",
            severity=Severity.CRITICAL if first.status is Status.CRITICAL else Severity.WARN,
            source="healthd",
            message=f"{first.fault_class}: {outcome}",
            fault_class=first.fault_class,
            target=first.target,
            evidence={"drain": drained.value if drained else None, "why": decision.why},
        )
        for action in actions:
            log.warning("job %s: %s: %s", action.job_id, action.action, action.detail)
            daemon.store.add_event(
                node=daemon.node,
                at=now,
                kind="job_action",
                severity=Severity.WARN,
                source="healthd",
                message=action.detail,
                fault_class=first.fault_class,
                target=f"job:{action.job_id}",
                evidence={"action": action.action, "job_id": action.job_id},
            )

    return respond


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="medic-healthd", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", type=Path, help="config file (default: MEDIC_CONFIG or /etc/medic/medic.toml)"
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config)
        daemon = build_daemon(config)
    except (ConfigError, ValueError) as exc:
        print(f"medic-healthd: {exc}", file=sys.stderr)
        return 2
    server = daemon.serve(config.paths.socket)
    if daemon.settings.metrics_port:
        daemon.metrics.serve(daemon.settings.metrics_address, daemon.settings.metrics_port)
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    # `kill -USR1` prints every thread's stack to the log: what a stuck daemon is waiting on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=daemon.reload).start())
    log.info(
        "medic-healthd for %s: %d checks, %s GPU plumbing, socket %s",
        daemon.node,
        len(daemon.checks.specs),
        "with" if daemon.gpu else "without",
        config.paths.socket,
    )
    if daemon.kmsg is not None:
        daemon.kmsg.start()
    if daemon.ladder is not None:  # also continues an episode a restart interrupted
        threading.Thread(target=daemon.ladder_loop, name="ladder", daemon=True).start()
    sdnotify.notify("READY=1")
    try:
        daemon.loop()
    finally:
        sdnotify.notify("STOPPING=1")
        if daemon.kmsg is not None:
            daemon.kmsg.stop()
        server.shutdown()
        server.server_close()
        config.paths.socket.unlink(missing_ok=True)
        if daemon.gpu is not None:
            daemon.gpu.stop()
        daemon.store.close()
    log.info("medic-healthd stopped")
    return 0

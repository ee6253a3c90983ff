"""`medic-healthd`: the node daemon, and the composition root that wires its parts.

The check scheduler (`healthd.scheduler`) runs due checks (per-check interval with jitter)
through the Runner on the main loop's thread; the NVML event listener hands XIDs in as they
happen and wakes the scheduler so the XID check runs at once. The result recorder
(`healthd.recorder`) writes results to the store: CONDITION results become conditions
(their `since` moves only when status or reason changes), EVENT results become events; a
fresh fault goes to the remediation ladder's thread (`healthd.ladder_thread`). A local socket
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
from healthd.checks.base import CheckContext, Result, Status, Tier, gpu_checks_skipped
from healthd.config_check import validate_config
from healthd.gpu_plumbing import GpuPlumbing, start_gpu_plumbing
from healthd.jobs import SpoolJobState
from healthd.kmsg_watch import KmsgWatcher
from healthd.ladder_thread import LadderThread
from healthd.ladder_wiring import attach_ladder
from healthd.launch_gate import LaunchGate
from healthd.link_watch import Judged, LinkWatch
from healthd.metrics import DaemonMetrics
from healthd.recorder import ResultRecorder
from healthd.runner import Runner, RunReport
from healthd.scheduler import CheckScheduler
from healthd.socket_api import SocketApi
from healthd.wakeup import Wakeup
from healthd.watchdog import Heartbeat, Watchdog
from healthd.xid_listener import EventKind, GpuEvent
from medic_core.config import ConfigError, MedicConfig, load_config
from medic_core.settings import DaemonSettings
from medic_core.store import ConditionUpdate, Severity, Store, StoreError, open_configured_store

log = logging.getLogger("medic.healthd")

# Exit status for a configuration the daemon cannot use (a bad medic.toml, a bad store URL):
# EX_CONFIG of sysexits.h (systemd shows it as "78/CONFIG"). The unit does not restart on it
# (RestartPreventExitStatus=78): restarting cannot fix a file, a human must.
EXIT_CONFIG = 78


class HealthDaemon:
    """The daemon's parts wired together: the check scheduler (`scheduler`), the result
    recorder (`recorder`), the launch gate, the ladder's thread, the GPU plumbing; its
    configuration, its main loop and its stop."""

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
        self.recorder = ResultRecorder(self, self._observe)
        self.scheduler = CheckScheduler(self, self.recorder.record, self._wake)
        self.runner: Runner | None = None
        self.kmsg: KmsgWatcher | None = None
        self.links: LinkWatch | None = None
        # Every watcher and the ladder started (main(), as READY=1 tells systemd): `ping`
        # says so, and the lab waits for it before it injects a fault.
        self.ready = False
        # The remediation ladder's thread (attached by build_daemon when Slurm is at hand).
        self.ladder: LadderThread | None = None
        self.gate = LaunchGate(self)
        self.notify: Callable[[str], object] = sdnotify.notify  # systemd's notify socket
        self._reload_lock = threading.Lock()
        self.apply_config(config)
        self._retire_not_run_here()
        if gpu is not None:
            gpu.on_xid = self.scheduler.wake_checks
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
        self.scheduler.reset()  # everything is due at start and after a reload

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

    # ---- what the parts ask of the daemon ----------------------------------------------

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
        self.recorder.record(report)
        return report

    def latest(self, name: str) -> tuple[float, tuple[Result, ...]] | None:
        """(monotonic time of the check's last run, its condition results), or None."""
        return self.recorder.latest(name)

    def current(self) -> list[Result]:
        return self.recorder.current()

    def _observe(self, report: RunReport) -> None:
        """A round recorded (under the recorder's lock): the metrics' scrapes read it."""
        self.metrics.observe_report(report)
        self.metrics.observe_round(self)

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
            self.recorder.add_event(dt.datetime.now(dt.UTC), record)

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

    def status_line(self) -> str:
        """One line for `systemctl status` (STATUS=): "watching 8 GPUs; last round 2 s ago;
        0 CRITICAL", and what the scheduler is waiting for when it is."""
        if self.gpu is None:
            gpus = "no GPUs (CPU node)"
        else:
            latest = self.latest("gpu_count")
            counts = [r.evidence.get("count") for r in latest[1]] if latest else []
            count = next((c for c in counts if isinstance(c, int)), None)
            gpus = "GPUs (not counted yet)" if count is None else f"{count} GPUs"
        since = self.heartbeat.stalled_for()
        round_words = "no check round yet" if since is None else f"last round {since:.0f} s ago"
        seen = Counter(r.status for r in self.current())
        found = [f"{seen[Status.CRITICAL]} CRITICAL"]
        found += [f"{seen[s]} {s.value}" for s in (Status.UNKNOWN, Status.WARN) if seen[s]]
        line = f"watching {gpus}; {round_words}; {', '.join(found)}"
        busy_since = self.scheduler.busy_since
        if busy_since is not None:
            waited = time.monotonic() - busy_since
            line += f"; periodic checks waiting {waited:.0f} s for a run in progress"
        return line

    # ---- wiring the parts --------------------------------------------------------------

    def attach(self, ladder: LadderThread) -> None:
        """The ladder's thread answers fresh faults and stops with the daemon; the rails its
        ticks read (every 5 s idle) keep the launch gate's fresh."""
        self.ladder = ladder
        self.recorder.on_fault = ladder.respond
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
        inventory = InventoryRecorder.for_daemon(
            self.node,
            lambda: self.config,
            lambda: self.gpu.client if self.gpu is not None else None,
            self.store,
        )
        self.heartbeat.beat()
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.scheduler.run_due()
                inventory.tick()
                if time.monotonic() - last_prune > self.settings.prune_every:
                    self.store.prune(dt.datetime.now(dt.UTC), self._retention_days())
                    last_prune = time.monotonic()
            except Exception:  # the daemon outlives any single failure; the watchdog does not
                log.exception("scheduler iteration failed")
            self.heartbeat.beat()
            wait = self.scheduler.seconds_to_next()
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
    wake_checks = daemon.scheduler.wake_checks
    daemon.kmsg = KmsgWatcher(config.paths.host_root / "dev" / "kmsg", wake_checks)
    daemon.links = LinkWatch(config.paths.host_root, wake_checks, judged=daemon.ports_judged)
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

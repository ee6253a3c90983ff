"""systemd's watchdog is pinged only while the check scheduler and the XID listener make
progress; a stalled part withholds the ping and is named once in the log (fake clocks and a
fake notifier: nothing here sleeps)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from healthd.gpu_plumbing import GpuPlumbing
from healthd.nvml_client import NvmlError
from healthd.watchdog import Heartbeat, Watchdog
from healthd.xid_listener import XidListener
from tests.conftest import poll
from tests.fakes import FakeClock


class HangingEvents:
    """NVML's event API where every call waits until the test lets one through (a hung NVML
    until then); event_set_create fails while `create_fails` is set."""

    def __init__(self) -> None:
        self.go = threading.Semaphore(0)
        self.create_fails = False
        self.calls = 0

    def _call(self) -> None:
        self.go.acquire()
        self.calls += 1

    def device_count(self) -> int:
        return 1

    def event_set_create(self) -> Any:
        self._call()
        if self.create_fails:
            raise NvmlError("nvmlEventSetCreate", None, "driver not loaded")
        return object()

    def register_events(self, event_set: Any, index: int, wanted: int) -> int:
        return wanted

    def event_wait(self, event_set: Any, timeout_ms: int) -> None:
        self._call()
        return None

    def event_set_free(self, event_set: Any) -> None:
        pass


def watchdog_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if "watchdog" in r.getMessage()]


@pytest.fixture
def parts() -> tuple[FakeClock, Heartbeat, dict[str, float | None], Watchdog, list[str]]:
    """A scheduler heartbeat, a listener whose age the test sets, and a watchdog over both
    (WatchdogSec 10 s: a ping every 5 s, a part stalled after 10 s without progress)."""
    clock = FakeClock()
    scheduler = Heartbeat(clock)
    scheduler.beat()  # the loop started
    listener: dict[str, float | None] = {"age": 0.0}
    sent: list[str] = []
    watchdog = Watchdog(5.0, 10.0, notify=sent.append)
    watchdog.watch("the check scheduler", scheduler.stalled_for)
    watchdog.watch("the XID listener", lambda: listener["age"])
    return clock, scheduler, listener, watchdog, sent


def test_pings_while_both_parts_make_progress(parts: Any) -> None:
    clock, scheduler, listener, watchdog, sent = parts
    for _ in range(5):
        clock.now += 5
        scheduler.beat()
        listener["age"] = 1.0
        assert watchdog.check()
    assert sent == ["WATCHDOG=1"] * 5
    clock.now += 10  # exactly the bound: still progress
    assert watchdog.check() and len(sent) == 6


def test_a_stalled_listener_withholds_the_ping_and_is_named_once(
    parts: Any, caplog: pytest.LogCaptureFixture
) -> None:
    clock, scheduler, listener, watchdog, sent = parts
    caplog.set_level(logging.INFO, logger="medic.healthd")
    listener["age"] = 12.0
    assert not watchdog.check()
    for _ in range(3):  # still stalled: still no ping, and no second line
        clock.now += 5
        scheduler.beat()
        listener["age"] += 5
        assert not watchdog.check()
    assert sent == []
    assert watchdog_lines(caplog) == [
        (
            "ERROR",
            "watchdog: no progress from the XID listener for 12s (bound 10s): WATCHDOG=1 "
            "withheld, so systemd restarts medic-healthd",
        )
    ]
    listener["age"] = 0.5  # a wait returned after all
    assert watchdog.check() and sent == ["WATCHDOG=1"]
    assert watchdog_lines(caplog)[1:] == [
        ("WARNING", "watchdog: the XID listener made progress again: WATCHDOG=1 resumed")
    ]


def test_a_stalled_scheduler_is_named_and_then_both_in_one_line(
    parts: Any, caplog: pytest.LogCaptureFixture
) -> None:
    clock, scheduler, listener, watchdog, sent = parts
    caplog.set_level(logging.INFO, logger="medic.healthd")
    clock.now += 30  # the scheduler is stuck in a round; the listener goes on
    assert not watchdog.check()
    listener["age"] = 25.0  # now the listener too
    clock.now += 5
    assert not watchdog.check()
    assert not watchdog.check()
    assert sent == []
    assert [line for _, line in watchdog_lines(caplog)] == [
        "watchdog: no progress from the check scheduler for 30s (bound 10s): WATCHDOG=1 "
        "withheld, so systemd restarts medic-healthd",
        "watchdog: no progress from the check scheduler for 35s and the XID listener for 25s "
        "(bound 10s): WATCHDOG=1 withheld, so systemd restarts medic-healthd",
    ]
    scheduler.beat()  # one recovers: still withheld
    assert not watchdog.check()
    assert watchdog_lines(caplog)[-1] == (
        "WARNING",
        "watchdog: the check scheduler made progress again",
    )


def test_a_part_that_is_not_running_is_not_judged(parts: Any) -> None:
    clock, scheduler, listener, watchdog, sent = parts
    listener["age"] = None  # the listener has not started (or this is a CPU node)
    clock.now += 100
    scheduler.beat()
    assert watchdog.check() and sent == ["WATCHDOG=1"]
    # Nor is a scheduler whose loop has not started yet (the daemon is still starting up).
    assert Heartbeat(clock).stalled_for() is None


def test_the_watchdog_thread_pings_until_stopped() -> None:
    sent: list[str] = []
    watchdog = Watchdog(0.01, 10.0, notify=sent.append)
    watchdog.watch("the check scheduler", lambda: 0.0)
    thread = watchdog.start()
    try:
        poll("three pings", lambda: sent.count("WATCHDOG=1") >= 3, timeout=5)
    finally:
        watchdog.stop(timeout=5)
    assert not thread.is_alive()


def test_a_raising_part_costs_one_ping_not_the_thread() -> None:
    sent: list[str] = []
    answers = iter([RuntimeError("boom")])

    def flaky() -> float:
        for answer in answers:
            raise answer
        return 0.0

    watchdog = Watchdog(0.01, 10.0, notify=sent.append)
    watchdog.watch("the check scheduler", flaky)
    thread = watchdog.start()
    try:
        poll("a ping after the failed round", lambda: "WATCHDOG=1" in sent, timeout=5)
    finally:
        watchdog.stop(timeout=5)
    assert not thread.is_alive()


# --- the XID listener's progress --------------------------------------------------------------


def test_the_listener_stalls_in_a_hung_wait_and_recovers_when_it_returns() -> None:
    clock = FakeClock(100.0)
    events = HangingEvents()
    listener = XidListener(events, lambda event: None, clock=clock)
    assert listener.stalled_for() is None  # not started: not judged
    events.go.release()  # event_set_create answers; the first wait hangs
    assert listener.start(ready_timeout=5)
    try:
        clock.now = 130.0
        assert listener.stalled_for() == 30.0  # stuck in nvmlEventSetWait since the start
        events.go.release()  # the wait returns (a timeout: no event)
        poll("the listener back from its wait", lambda: listener.stalled_for() == 0.0)
    finally:
        assert not listener.stop(timeout=0)  # still in its next wait...
        events.go.release(2)
        assert listener.stop(timeout=5)  # ...which now returns


def test_a_failed_registration_is_progress_too() -> None:
    """The listener retries registration while NVML is unusable: alive, not stalled."""
    clock = FakeClock(100.0)
    events = HangingEvents()
    events.create_fails = True
    listener = XidListener(events, lambda event: None, clock=clock)
    assert not listener.start(ready_timeout=0)
    try:
        assert listener.stalled_for() == 0.0  # started
        clock.now = 120.0
        events.go.release()
        poll("the failed attempt", lambda: events.calls == 1 and listener.stalled_for() == 0.0)
        assert listener.status.errors == 1
    finally:
        assert listener.stop(timeout=5)  # in its back-off, which stop() cuts short


def test_the_gpu_plumbing_asks_its_current_listener() -> None:
    plumbing = GpuPlumbing(client=None)  # type: ignore[arg-type]
    assert plumbing.stalled_for() is None
    plumbing.listener = SimpleNamespace(stalled_for=lambda: 7.0)  # type: ignore[assignment]
    assert plumbing.stalled_for() == 7.0
    # After a driver reload the plumbing starts a new listener: that is the one judged.
    plumbing.listener = SimpleNamespace(stalled_for=lambda: 0.5)  # type: ignore[assignment]
    assert plumbing.stalled_for() == 0.5


# --- the daemon wires both parts ------------------------------------------------------------


def test_a_daemon_stuck_in_a_check_round_stops_pinging_and_names_the_scheduler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from healthd.checks.base import CheckContext
    from healthd.daemon import HealthDaemon, watch_progress
    from medic_core.config import load_config
    from medic_core.store import open_configured_store
    from tests.test_daemon import plain_config

    caplog.set_level(logging.INFO, logger="medic.healthd")
    config = load_config(plain_config(tmp_path))
    store = open_configured_store(config)
    daemon = HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root))
    clock = FakeClock()
    daemon.heartbeat = Heartbeat(clock)
    daemon.scheduler.due.clear()  # nothing due: the loop goes round only when woken
    entered, release = threading.Event(), threading.Event()
    run_due = daemon.scheduler.run_due

    def first_round_hangs() -> Any:
        if not entered.is_set():
            entered.set()
            release.wait(10)  # a check round that does not come back
        return run_due()

    daemon.scheduler.run_due = first_round_hangs  # type: ignore[method-assign]
    # A GPU node: the XID listener makes progress all along.
    daemon.gpu = SimpleNamespace(stalled_for=lambda: 1.0)  # type: ignore[assignment]
    sent: list[str] = []
    watchdog = watch_progress(daemon, period=30.0, notify=sent.append)
    assert (watchdog.period, watchdog.stall_after) == (30.0, 60.0)
    loop = threading.Thread(target=daemon.loop)
    loop.start()
    try:
        poll("the first round", entered.is_set)
        clock.now += 45
        assert watchdog.check() and sent == ["WATCHDOG=1"]
        clock.now += 20
        assert not watchdog.check() and sent == ["WATCHDOG=1"]
        assert watchdog_lines(caplog) == [
            (
                "ERROR",
                "watchdog: no progress from the check scheduler for 65s (bound 60s): "
                "WATCHDOG=1 withheld, so systemd restarts medic-healthd",
            )
        ]
        release.set()  # the round comes back: the scheduler beats, the pings resume
        poll("the scheduler's beat", lambda: daemon.heartbeat.stalled_for() == 0.0)
        assert watchdog.check() and sent == ["WATCHDOG=1"] * 2
    finally:
        release.set()
        daemon.stop()
        loop.join(10)
        store.close()
    assert not loop.is_alive()


def test_a_deep_probe_through_the_socket_leaves_the_scheduler_beating(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sweep's probe (the socket's check op, deep tier) holds the runner for as long as its
    checks take, up to an hour: the scheduler skips its due checks meanwhile instead of
    queueing behind it, goes on beating, so systemd keeps hearing WATCHDOG=1 well past
    WatchdogSec, and runs them once the probe is done."""
    from healthd.checks.base import CheckContext, Tier, ok
    from healthd.daemon import HealthDaemon, watch_progress
    from healthd.runner import Runner
    from healthd.socket_api import SocketApi
    from medic_core.config import load_config
    from medic_core.store import open_configured_store
    from tests.test_checks_runner import make_spec
    from tests.test_daemon import plain_config

    caplog.set_level(logging.INFO, logger="medic.healthd")
    config = load_config(plain_config(tmp_path))
    store = open_configured_store(config)
    daemon = HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root))
    probing, release = threading.Event(), threading.Event()
    ticks: list[str] = []

    def deep() -> list[Any]:
        probing.set()
        release.wait(30)  # a burn-in that takes its time
        return [ok("deep_burn", "GPUs fine under load")]

    def tick() -> list[Any]:
        ticks.append("tick")
        return [ok("tick", "fine")]

    daemon.runner = Runner(
        daemon.ctx,
        specs=[
            make_spec("deep_burn", deep, timeout=3600.0, tiers=(Tier.DEEP,)),
            make_spec("tick", tick),
        ],
    )
    daemon.scheduler.due = {"tick": 0.0}  # due at once
    daemon.scheduler.runner_wait, daemon.scheduler.busy_retry = 0.01, 0.05
    clock = FakeClock()
    daemon.heartbeat = Heartbeat(clock)
    sent: list[str] = []
    watchdog = watch_progress(daemon, period=30.0, notify=sent.append)  # WatchdogSec=60
    reply: dict[str, Any] = {}
    api = SocketApi(daemon, daemon.gate)
    probe = threading.Thread(
        target=lambda: reply.update(api.handle({"op": "check", "tier": "deep", "budget": 3600}))
    )
    probe.start()
    loop = threading.Thread(target=daemon.loop)
    try:
        poll("the probe holding the runner", probing.is_set)
        loop.start()
        for _ in range(6):  # three times WatchdogSec of (fake) time into the probe
            clock.now += 30
            poll("a scheduler round", lambda: daemon.heartbeat.stalled_for() == 0.0)
            assert watchdog.check()
        assert sent == ["WATCHDOG=1"] * 6
        assert ticks == []  # the due check did not run: it waits for the runner
        release.set()
        poll("the deferred check", lambda: ticks == ["tick"])
        probe.join(10)
        assert reply["status"] == "OK"
        assert [r["check"] for r in reply["results"]] == ["deep_burn"]
    finally:
        release.set()
        daemon.stop()
        if loop.is_alive():
            loop.join(10)
        probe.join(10)
        store.close()
    assert not loop.is_alive() and not probe.is_alive()
    busy = [r.getMessage() for r in caplog.records if "check runner" in r.getMessage()]
    assert busy[0].startswith(
        "the check runner is busy with another run (a check asked for through the socket, "
        "such as a sweep's deep probe): 1 due checks wait for it (tick)"
    )
    assert len(busy) == 2 and busy[1].startswith("the check runner is free again")
    assert not watchdog_lines(caplog)  # never a stall

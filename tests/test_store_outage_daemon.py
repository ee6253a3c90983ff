"""The node daemon with its store refusing writes (PostgreSQL down, the disk under SQLite
full): a fresh fault is still answered, nothing the rounds saw is lost, and the store catches
up by itself once it is back (hardening issue, item 8). A real daemon on a real SQLite store
behind a switch that makes every call fail; rounds are fed to `record` directly. The same on
the lab's real Slurm and PostgreSQL: tests/test_fault_injection_lab.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from healthd.checks.base import CheckContext, Kind, Result, Status, fault, ok
from healthd.daemon import HealthDaemon
from healthd.runner import CheckOutcome, RunReport, RunState
from healthd.socket_api import SocketApi
from medic_core import journal
from medic_core.config import load_config
from medic_core.store import Store, open_configured_store
from remediation.episodes import EpisodeStore
from tests.conftest import poll
from tests.test_daemon import plain_config


class StoreDown(RuntimeError):
    pass


class SwitchedStore:
    """The real store, or an exception from every call while `down`."""

    def __init__(self, store: Store) -> None:
        self.real = store
        self.down = False
        self.refused = 0  # calls refused while down

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if not callable(attr):
            if self.down:  # the engine: a connection would fail
                self.refused += 1
                raise StoreDown("connection refused (the store is down)")
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.refused += 1
                raise StoreDown("connection refused (the store is down)")
            return attr(*args, **kwargs)

        return call


class Answered:
    """What the daemon handed its fault responder, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: list[tuple[str, str]] = []

    def __call__(self, results: list[Result]) -> None:
        with self.lock:
            self.faults += [(r.fault_class or "", r.target or "") for r in results]

    def count(self, fault_class: str, target: str) -> int:
        with self.lock:
            return self.faults.count((fault_class, target))


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[HealthDaemon, SwitchedStore, Answered]]:
    config = load_config(plain_config(tmp_path))
    real = open_configured_store(config)
    store = SwitchedStore(real)
    try:
        daemon = HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root))  # type: ignore[arg-type]
        daemon.recorder.store_retry = 0.0  # every round tries the store again
        answered = Answered()
        daemon.recorder.on_fault = answered
        yield daemon, store, answered
    finally:
        real.close()


T0 = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def round_of(at: dt.datetime, **checks: list[Result]) -> RunReport:
    outcomes = tuple(
        CheckOutcome(name, RunState.DONE, tuple(results), 0.01) for name, results in checks.items()
    )
    return RunReport(at, 0.01, outcomes)


def nvlink_down(gpu: str = "3") -> Result:
    return fault("gpu_nvlink", Status.CRITICAL, "gpu.nvlink.down", "NVLink 1 down", target=gpu)


def nvlink_ok(gpu: str = "3") -> Result:
    return ok("gpu_nvlink", "all links up", target=gpu)


def xid_79(gpu: str = "2") -> list[Result]:
    """A CRITICAL XID is a condition (gpu_xid); a WARN one (XID 13) is an event."""
    condition = fault(
        "gpu_xid", Status.CRITICAL, "gpu.xid.79", "XID 79 (fell off the bus)", target=gpu
    )
    event = fault(
        "gpu_xid", Status.WARN, "gpu.xid.13", "XID 13 at 12:00:01", target="0", kind=Kind.EVENT
    )
    return [condition, event]


def stored(store: SwitchedStore, node: str) -> dict[tuple[str, str], str]:
    return {(c.type, c.target): str(c.status) for c in store.real.conditions(node)}


def test_a_fault_is_answered_while_the_store_refuses_every_write(rig: Any) -> None:
    daemon, store, answered = rig
    daemon.recorder.record(round_of(T0, gpu_nvlink=[nvlink_ok()]))
    store.down = True
    daemon.recorder.record(round_of(T0 + dt.timedelta(seconds=2), gpu_xid=xid_79()))
    poll("the fault answered", lambda: answered.count("gpu.xid.79", "2") == 1, timeout=5)
    assert daemon.latest("gpu_xid") is not None  # the gate answers from memory


def test_store_back_everything_seen_during_the_outage_reaches_it(rig: Any) -> None:
    daemon, store, answered = rig
    daemon.recorder.record(round_of(T0, gpu_nvlink=[nvlink_ok()]))
    store.down = True
    outage = T0 + dt.timedelta(seconds=2)
    daemon.recorder.record(round_of(outage, gpu_xid=xid_79(), gpu_nvlink=[nvlink_down()]))
    assert journal.pending(daemon.config.paths), "the XID's event waits in the journal"
    # The NVLink fault is unchanged next round: it must not wait REFRESH_SECONDS (300 s).
    daemon.recorder.record(round_of(outage + dt.timedelta(seconds=2), gpu_nvlink=[nvlink_down()]))
    store.down = False
    daemon.recorder.record(round_of(outage + dt.timedelta(seconds=4), gpu_nvlink=[nvlink_down()]))
    conditions = stored(store, daemon.node)
    assert conditions[("gpu_nvlink", "3")] == "CRITICAL"
    assert conditions[("gpu_xid", "2")] == "CRITICAL"
    [nvlink] = store.real.conditions(daemon.node, type="gpu_nvlink")
    assert nvlink.since == outage  # when it happened, not when the store came back
    events = store.real.events(daemon.node, kind="gpu_xid")
    assert [(e.fault_class, e.target, e.at) for e in events] == [("gpu.xid.13", "0", outage)]
    assert journal.pending(daemon.config.paths) == []
    # Answered from memory during the outage, and once more when the store took it (the
    # ladder then opens the episode it could not record before).
    poll("the second answer", lambda: answered.count("gpu.nvlink.down", "3") == 2, timeout=5)
    assert answered.count("gpu.xid.79", "2") == 2


def test_a_fault_gone_before_the_store_is_back_is_not_answered_again(rig: Any) -> None:
    daemon, store, answered = rig
    daemon.recorder.record(round_of(T0, gpu_nvlink=[nvlink_ok()]))
    store.down = True
    daemon.recorder.record(round_of(T0 + dt.timedelta(seconds=2), gpu_nvlink=[nvlink_down()]))
    poll("answered", lambda: answered.count("gpu.nvlink.down", "3") == 1, timeout=5)
    daemon.recorder.record(round_of(T0 + dt.timedelta(seconds=4), gpu_nvlink=[nvlink_ok()]))
    store.down = False
    daemon.recorder.record(round_of(T0 + dt.timedelta(seconds=6), gpu_nvlink=[nvlink_ok()]))
    assert stored(store, daemon.node)[("gpu_nvlink", "3")] == "OK"
    assert answered.count("gpu.nvlink.down", "3") == 1


def test_a_condition_answered_before_the_outage_is_not_answered_again_during_it(
    rig: Any,
) -> None:
    daemon, store, answered = rig
    daemon.recorder.record(round_of(T0, gpu_nvlink=[nvlink_down()]))
    poll("answered", lambda: answered.count("gpu.nvlink.down", "3") == 1, timeout=5)
    store.down = True
    later = dataclasses.replace(nvlink_down(), message="NVLink 1 still down")
    daemon.recorder.record(round_of(T0 + dt.timedelta(seconds=400), gpu_nvlink=[later]))
    store.down = False
    daemon.recorder.record(round_of(T0 + dt.timedelta(seconds=402), gpu_nvlink=[later]))
    assert stored(store, daemon.node)[("gpu_nvlink", "3")] == "CRITICAL"
    assert answered.count("gpu.nvlink.down", "3") == 1


# --- random outages: invariants after every sequence ------------------------------------------

STEPS = st.lists(
    st.tuples(st.booleans(), st.sampled_from(["ok", "down"])),  # (store down?, NVLink state)
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=STEPS)
def test_random_outages_the_store_converges_and_every_new_fault_is_answered(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[bool, str]]
) -> None:
    """After any sequence of rounds with the store up or down, one round with the store up
    leaves the store holding what the checks last said, and every OK -> CRITICAL the checks
    reported was answered at least once."""
    tmp_path = tmp_path_factory.mktemp("outage")
    config = load_config(plain_config(tmp_path))
    real = open_configured_store(config)
    store = SwitchedStore(real)
    try:
        daemon = HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root))  # type: ignore[arg-type]
        daemon.recorder.store_retry = 0.0
        answers: list[int] = []
        daemon.recorder.on_fault = lambda results: answers.append(len(results))
        at, last, onsets = T0, "ok", 0
        for down, link in [*steps, (False, steps[-1][1])]:
            store.down = down
            at += dt.timedelta(seconds=2)
            daemon.recorder.record(
                round_of(at, gpu_nvlink=[nvlink_down() if link == "down" else nvlink_ok()])
            )
            onsets += link == "down" and last == "ok"
            last = link
        want = "CRITICAL" if last == "down" else "OK"
        assert stored(store, daemon.node)[("gpu_nvlink", "3")] == want
        poll("the answers", lambda: len(answers) >= onsets, timeout=5)
    finally:
        real.close()


def test_the_socket_status_answers_from_memory_with_the_store_down(rig: Any) -> None:
    daemon, store, _ = rig
    api = SocketApi(daemon, daemon.gate, EpisodeStore(store))
    daemon.recorder.record(round_of(T0, gpu_nvlink=[nvlink_down()]))
    store.down = True
    reply = api.handle({"op": "status"})
    assert reply["status"] == "CRITICAL" and reply["store"].startswith("unavailable: ")
    assert (reply["rma_open"], reply["remediation_episode"]) == ([], None)
    store.down = False
    assert "store" not in api.handle({"op": "status"})


def test_a_store_that_refused_is_tried_again_only_every_store_retry(rig: Any) -> None:
    """A partitioned PostgreSQL makes each call wait out the connect timeout: the rounds in
    between answer their faults without touching it."""
    daemon, store, answered = rig
    daemon.recorder.store_retry = 3600.0
    # (each check's first round reads what an earlier daemon left in the store: once)
    quiet = ok("gpu_xid", "no XID needing action")
    daemon.recorder.record(round_of(T0, gpu_nvlink=[nvlink_ok()], gpu_xid=[quiet]))
    store.down = True
    daemon.recorder.record(round_of(T0 + dt.timedelta(seconds=2), gpu_nvlink=[nvlink_down()]))
    tried = store.refused
    assert tried >= 1
    daemon.recorder.record(round_of(T0 + dt.timedelta(seconds=4), gpu_xid=xid_79()))
    assert store.refused == tried  # not tried again within store_retry
    poll("both answered", lambda: answered.count("gpu.xid.79", "2") == 1, timeout=5)
    assert answered.count("gpu.nvlink.down", "3") == 1
    # Rounds keep coming during the outage: they must not push the next try further away.
    daemon.recorder.store_retry = 0.5
    store.down = False
    rounds = [T0 + dt.timedelta(seconds=6)]

    def a_round_wrote_it() -> bool:
        rounds.append(rounds[-1] + dt.timedelta(seconds=2))
        daemon.recorder.record(round_of(rounds[-1], gpu_nvlink=[nvlink_down()]))
        return stored(store, daemon.node).get(("gpu_nvlink", "3")) == "CRITICAL"

    poll("the store written once the retry is due", a_round_wrote_it, timeout=10)


def kernel_event(status: Status, history: bool = False) -> Result:
    evidence = {"rule": "kernel_oops", "count": 1, **({"history": True} if history else {})}
    return fault(
        "kernel_log", status, "kernel.oops", "BUG: unable to handle page fault",
        evidence=evidence, kind=Kind.EVENT,
    )  # fmt: skip


def test_a_critical_kernel_log_event_is_answered_and_history_or_a_warn_is_not(rig: Any) -> None:
    daemon, _, answered = rig
    daemon.recorder.record(round_of(T0, kernel_log=[kernel_event(Status.CRITICAL, history=True)]))
    daemon.recorder.record(round_of(T0, kernel_log=[kernel_event(Status.WARN)]))
    # A marker: answered after them.
    daemon.recorder.record(round_of(T0, gpu_nvlink=[nvlink_down()]))
    poll("the marker answered", lambda: answered.count("gpu.nvlink.down", "3") == 1, timeout=5)
    assert answered.count("kernel.oops", "") == 0
    daemon.recorder.record(
        round_of(T0 + dt.timedelta(seconds=30), kernel_log=[kernel_event(Status.CRITICAL)])
    )
    poll("the oops answered", lambda: answered.count("kernel.oops", "") == 1, timeout=5)


def test_the_socket_status_names_the_open_ticket_and_episode_from_one_read(rig: Any) -> None:
    from remediation import tickets

    daemon, store, _ = rig
    episodes = EpisodeStore(store)
    api = SocketApi(daemon, daemon.gate, episodes)
    opened = episodes.open_episode(
        daemon.node, state="waiting_idle", fault_class="gpu.xid.79", target="gpu:3",
        check="gpu_xid", recommendation="reset_gpu", rung=1, message="", evidence={},
    )  # fmt: skip
    ticket = tickets.open_ticket(store, daemon.node, "gpu.xid.79", "off the bus", [], {}, "test")
    reply = api.handle({"op": "status"})
    assert reply["rma_open"] == [ticket.id]
    assert reply["remediation_episode"] == {"id": opened.id, "state": "waiting_idle", "rung": 1}

"""The prolog's hot path: a gate decision is answered from memory and written after the reply
(healthd.gate_recorder); the hook's reply is the decision, not every result; nothing is lost
when the store refuses the write, the queue is full, or the daemon exits with writes queued."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from healthd.checks.base import CheckContext, Result, Status, fault, ok
from healthd.gate_recorder import EventRecorder
from healthd.launch_gate import LaunchGate
from healthd.runner import Runner
from medic_core import journal
from medic_core.config import MedicConfig, NodePaths
from medic_core.store import Store, open_store
from tests.conftest import poll


class GatedStore:
    """A real store whose writes wait for `open` (a store busy elsewhere) or fail (down)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.open = threading.Event()
        self.open.set()
        self.down = False
        self.writes = 0

    def add_event(self, node: str, **kwargs: Any) -> Any:
        assert self.open.wait(30)
        if self.down:
            raise OSError("database is locked")
        self.writes += 1
        return self.store.add_event(node, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.fixture
def paths(tmp_path: Path) -> NodePaths:
    return NodePaths(state_dir=tmp_path / "state", socket=tmp_path / "run" / "healthd.sock")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[GatedStore]:
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as real:
        gated = GatedStore(real)
        yield gated
        gated.open.set()


def make_gate(tmp_path: Path, paths: NodePaths, store: GatedStore, result: Result) -> LaunchGate:
    runner = Runner(CheckContext.for_root(tmp_path), specs=[])
    runner.selected = lambda **_: ["gpu_count"]  # type: ignore[method-assign]
    host = SimpleNamespace(
        node="n1",
        store=store,
        config=MedicConfig(None, "n1", paths),
        settings=SimpleNamespace(launch_max_age=60.0, launch_budget=5.0),
        checks=runner,
        latest=lambda name: (time.monotonic(), (result,)),
    )
    return LaunchGate(host)  # type: ignore[arg-type]


def gate_events(store: GatedStore) -> list[Any]:
    return store.store.events("n1", kind="gate")


def test_the_hooks_request_is_answered_while_the_store_write_waits(
    tmp_path: Path, paths: NodePaths, store: GatedStore
) -> None:
    gate = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    store.open.clear()  # any write on the request path would hang the request
    reply = gate.launch(5.0, fresh_only=True, job_id="42")
    assert reply == {
        "node": "n1", "tier": "launch", "status": "OK", "ran": [],
        "seconds": reply["seconds"], "allow": True, "why": "",
    }  # fmt: skip
    assert gate_events(store) == []
    store.open.set()
    poll("the gate decision in the store", lambda: len(gate_events(store)) == 1)
    [event] = gate_events(store)
    assert (event.target, event.evidence["allow"], event.evidence["status"]) == (
        "job:42", True, "OK"
    )  # fmt: skip


def test_a_refusal_carries_what_blocks_and_the_results_that_are_not_ok(
    tmp_path: Path, paths: NodePaths, store: GatedStore
) -> None:
    bad = fault("gpu_count", Status.CRITICAL, "gpu.count.missing", "7 of 8 GPUs")
    gate = make_gate(tmp_path, paths, store, bad)
    reply = gate.launch(5.0, job_id="43")
    assert (reply["allow"], reply["status"]) == (False, "CRITICAL")
    assert [b["fault_class"] for b in reply["blocking"]] == ["gpu.count.missing"]
    assert [r["fault_class"] for r in reply["results"]] == ["gpu.count.missing"]
    assert gate.recorder.flush(10)
    [event] = gate_events(store)
    assert (event.severity, event.fault_class) == ("CRITICAL", "gpu.count.missing")


def test_a_launch_without_a_job_is_the_whole_verdict(
    tmp_path: Path, paths: NodePaths, store: GatedStore
) -> None:
    gate = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    reply = gate.launch(5.0)
    assert reply["status"] == "OK" and "allow" not in reply
    assert [r["check"] for r in reply["results"]] == ["gpu_count"]
    assert gate_events(store) == []


def test_a_write_the_store_refuses_is_kept_in_the_journal_and_replayed(
    tmp_path: Path, paths: NodePaths, store: GatedStore
) -> None:
    gate = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    store.down = True
    gate.launch(5.0, fresh_only=True, job_id="44")
    assert gate.recorder.flush(10)
    assert gate_events(store) == [] and len(journal.pending(paths)) == 1
    store.down = False
    gate.launch(5.0, fresh_only=True, job_id="45")  # the next write replays the journal
    assert gate.recorder.flush(10)
    assert sorted(e.target for e in gate_events(store)) == ["job:44", "job:45"]
    assert journal.pending(paths) == []


def test_a_full_queue_and_an_exit_lose_nothing(paths: NodePaths, store: GatedStore) -> None:
    recorder = EventRecorder(lambda: store, paths, "n1", bound=2)  # type: ignore[arg-type,return-value]
    store.open.clear()
    at = dt.datetime.now(dt.UTC)

    def record(n: int) -> None:
        recorder.record({"kind": "gate", "severity": "INFO", "source": "prolog",
                         "target": f"job:{n}"}, at)  # fmt: skip

    record(0)
    poll("the writer holding the first", lambda: recorder._queue.qsize() == 0)
    for n in range(1, 5):  # two in the queue, the rest in the journal
        record(n)
    assert len(journal.pending(paths)) == 2
    recorder.close(timeout=0.1)  # the daemon exits while the store still waits
    kept = sorted(str(journal.read_entry(p).event["target"]) for p in journal.pending(paths))
    assert kept == [f"job:{n}" for n in range(1, 5)]  # the one in flight is the writer's
    store.open.set()  # the store answers again: the write in flight, then the journal's
    poll("every event in the store", lambda: len(gate_events(store)) == 5)
    assert sorted(e.target for e in gate_events(store)) == [f"job:{n}" for n in range(5)]
    assert journal.pending(paths) == []


def test_the_rails_are_read_again_after_the_reply_once_they_are_old(
    tmp_path: Path, paths: NodePaths, store: GatedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from healthd import launch_gate

    gate = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    reads: list[float] = []
    real = gate._rails
    monkeypatch.setattr(gate, "_rails", lambda: [reads.append(0.0), real()][1])
    gate.launch(5.0, job_id="46")  # nothing in memory yet: read before the answer
    assert gate.recorder.flush(10) and len(reads) == 1
    gate.launch(5.0, job_id="47")  # fresh: from memory
    assert gate.recorder.flush(10) and len(reads) == 1
    monkeypatch.setattr(launch_gate, "RAILS_FRESH", -1.0)
    gate.launch(5.0, job_id="48")  # old: from memory, read again after the write
    assert gate.recorder.flush(10) and len(reads) == 2


def test_records_made_for_a_request_wait_for_its_reply(
    tmp_path: Path, paths: NodePaths, store: GatedStore
) -> None:
    gate = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    with gate.recorder.after_reply():  # the socket writes its reply inside this block
        gate.launch(5.0, fresh_only=True, job_id="49")
        assert gate.recorder.flush(0.0)  # nothing queued yet
    assert gate.recorder.flush(10)
    assert [e.target for e in gate_events(store)] == ["job:49"]


@pytest.mark.parametrize(
    ("state", "allow"),
    [("applied", True), ("restoring", True), ("intent", False), ("restored", False)],
)
def test_the_gate_leaves_out_a_gpu_the_open_episode_isolated(
    tmp_path: Path, paths: NodePaths, store: GatedStore, state: str, allow: bool
) -> None:
    """Only a GPU out of Slurm's GRES (applied, or drained to come back) is left out: at
    `intent` the apply command may not have run."""
    from remediation import episodes as ep

    bad = fault("gpu_xid", Status.CRITICAL, "gpu.xid.95", "XID 95", target="5")
    record = {"gpus": [5], "gpus_total": 8, "state": state}
    ep.EpisodeStore(store.store).open_episode(
        "n1", state=ep.WAITING_IDLE, fault_class="gpu.xid.95", target="5", check="gpu_xid",
        recommendation="gpu_reset", rung=1, message="XID 95", evidence={"isolation": record},
    )  # fmt: skip
    reply = make_gate(tmp_path, paths, store, bad).launch(5.0, job_id="50")
    assert reply["allow"] is allow
    other = fault("gpu_xid", Status.CRITICAL, "gpu.xid.95", "XID 95", target="4")
    assert not make_gate(tmp_path, paths, store, other).launch(5.0, job_id="51")["allow"]

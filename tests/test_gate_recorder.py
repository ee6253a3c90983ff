"""The prolog's hot path: a gate decision is answered from memory and written after the reply
(healthd.gate_recorder); the hook's reply is the decision, not every result; nothing is lost
when the store refuses the write, the queue is full, or the daemon exits with writes queued."""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event as sa_event

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
        self.batches: list[list[str]] = []  # the targets of each add_events call

    def add_event(self, node: str, **kwargs: Any) -> Any:
        assert self.open.wait(30)
        if self.down:
            raise OSError("database is locked")
        self.writes += 1
        return self.store.add_event(node, **kwargs)

    def add_events(self, events: list[dict[str, Any]]) -> int:
        assert self.open.wait(30)
        if self.down:
            raise OSError("database is locked")
        self.writes += 1
        self.batches.append([str(e.get("target")) for e in events])
        return self.store.add_events(events)

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


def counted_rail_reads(gate: LaunchGate, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The gate's own reads of the rails from now on, one entry each."""
    reads: list[float] = []
    real = gate._rails
    monkeypatch.setattr(gate, "_rails", lambda: [reads.append(0.0), real()][1])
    return reads


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
    recorder = EventRecorder(lambda: store, paths, "n1", bound=2, linger=0)  # type: ignore[arg-type,return-value]
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
    assert kept == [f"job:{n}" for n in range(5)]  # the one being written too
    store.open.set()  # the store answers: the write in flight gets through after all...
    poll("the journal's in the store", lambda: len(gate_events(store)) == 5)
    assert sorted(e.target for e in gate_events(store)) == [f"job:{n}" for n in range(5)]
    assert journal.pending(paths) == []  # ...and its entry went: each event once


def test_the_rails_are_read_again_after_the_reply_once_they_are_old(
    tmp_path: Path, paths: NodePaths, store: GatedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from healthd import launch_gate

    gate = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    reads = counted_rail_reads(gate, monkeypatch)
    gate.launch(5.0, job_id="46")  # nothing in memory yet: read before the answer
    assert gate.recorder.flush(10) and len(reads) == 1
    gate.launch(5.0, job_id="47")  # fresh: from memory
    assert gate.recorder.flush(10) and len(reads) == 1
    monkeypatch.setattr(launch_gate, "RAILS_FRESH", -1.0)
    gate.launch(5.0, job_id="48")  # old: from memory, read again after the write
    assert gate.recorder.flush(10) and len(reads) == 2


def test_the_rails_are_read_at_most_once_per_rails_fresh_whatever_the_launch_rate(
    tmp_path: Path, paths: NodePaths, store: GatedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from healthd import launch_gate

    gate = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    reads = counted_rail_reads(gate, monkeypatch)
    gate.launch(5.0, job_id="60")
    assert gate.recorder.flush(10) and len(reads) == 1

    def age_rails(seconds: float) -> None:
        seen = gate._rails_seen
        assert seen is not None
        gate._rails_seen = (time.monotonic() - seconds, *seen[1:])

    age_rails(launch_gate.RAILS_FRESH + 0.5)  # older than RAILS_FRESH: read after the reply
    store.open.clear()  # a burst of job starts queues behind the writer
    for job in range(61, 81):
        reply = gate.launch(5.0, fresh_only=True, job_id=str(job))
        assert reply["allow"]
    assert len(reads) == 1  # none before a reply
    store.open.set()
    assert gate.recorder.flush(10)
    assert len(reads) == 2  # twenty launches, each asking: one read
    gate.launch(5.0, fresh_only=True, job_id="81")  # just read: from memory
    assert gate.recorder.flush(10) and len(reads) == 2
    age_rails(launch_gate.RAILS_MAX_AGE + 0.5)  # too old to answer from: read before the reply
    gate.launch(5.0, fresh_only=True, job_id="82")
    assert len(reads) == 3
    assert gate.recorder.flush(10) and len(reads) == 3
    assert launch_gate.RAILS_FRESH < launch_gate.RAILS_MAX_AGE - 1  # a launch a second: no
    # read before a reply while launches keep coming


def test_an_rma_ticket_refuses_jobs_once_the_rails_are_read_again(
    tmp_path: Path, paths: NodePaths, store: GatedStore
) -> None:
    from healthd import launch_gate
    from remediation import tickets

    gate = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    assert gate.launch(5.0, job_id="90")["allow"]
    tickets.open_ticket(store.store, "n1", "gpu.xid.79", "fell off the bus", [], {}, "test")
    assert gate.launch(5.0, job_id="91")["allow"]  # the rails in memory: within the bound
    seen = gate._rails_seen
    assert seen is not None
    gate._rails_seen = (time.monotonic() - launch_gate.RAILS_MAX_AGE - 0.1, *seen[1:])
    reply = gate.launch(5.0, job_id="92")
    assert not reply["allow"] and "RMA" in reply["why"]


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


# -- batches ------------------------------------------------------------------------------


def gate_event(n: int | str, **more: Any) -> dict[str, Any]:
    return {"kind": "gate", "severity": "INFO", "source": "prolog", "target": f"job:{n}", **more}


def journal_targets(paths: NodePaths) -> list[str]:
    return [str(journal.read_entry(p).event["target"]) for p in journal.pending(paths)]


def stored(store: GatedStore) -> list[tuple[str, dt.datetime]]:
    """(target, at) of the gate events, in the order the store took them."""
    events = sorted(store.store.events("n1", kind="gate"), key=lambda e: e.id)
    return [(e.target, e.at) for e in events]


def record_held(recorder: EventRecorder, store: GatedStore, events: list[dict[str, Any]]) -> None:
    """The first event is being written (the store waits) while the others queue behind."""
    base = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
    store.open.clear()
    for n, event in enumerate(events):
        recorder.record(event, base + dt.timedelta(seconds=n))
        if n == 0:
            poll("the writer holding the first", lambda: recorder._queue.qsize() == 0)


def test_what_is_queued_is_written_in_one_transaction_in_order_with_its_times(
    paths: NodePaths, store: GatedStore
) -> None:
    recorder = EventRecorder(lambda: store, paths, "n1", linger=0)  # type: ignore[arg-type,return-value]
    record_held(recorder, store, [gate_event(n) for n in range(6)])
    store.open.set()
    assert recorder.flush(10)
    assert store.batches == [["job:0"], [f"job:{n}" for n in range(1, 6)]]
    base = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
    assert stored(store) == [(f"job:{n}", base + dt.timedelta(seconds=n)) for n in range(6)]


def test_flush_waits_for_the_batch_being_written_and_what_queued_behind_it(
    paths: NodePaths, store: GatedStore
) -> None:
    recorder = EventRecorder(lambda: store, paths, "n1", linger=0)  # type: ignore[arg-type,return-value]
    record_held(recorder, store, [gate_event(n) for n in range(3)])
    assert not recorder.flush(0.05)  # the batch in flight counts
    flushed: list[bool] = []
    waiter = threading.Thread(target=lambda: flushed.append(recorder.flush(30)))
    waiter.start()
    assert flushed == []  # still waiting: the store has not answered
    store.open.set()
    waiter.join(30)
    assert flushed == [True]
    assert [t for t, _ in stored(store)] == ["job:0", "job:1", "job:2"]


@pytest.fixture
def failing(store: GatedStore) -> Iterator[dict[str, bool]]:
    """SQLite fails, inside the transaction, on the row for job:3 while `on`: an error the
    store raises midway through a batch (the rows before it were inserted, then rolled back)."""
    switch = {"on": True}

    def fail() -> int:
        if switch["on"]:
            raise RuntimeError("disk I/O error")
        return 0

    engine = store.store.engine
    sa_event.listen(engine, "connect", lambda conn, _: conn.create_function("medic_fail", 0, fail))
    engine.dispose()  # the pool's connections get the function too
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TRIGGER fail_job_3 BEFORE INSERT ON events WHEN NEW.target = 'job:3' "
            "BEGIN SELECT medic_fail(); END"
        )
    yield switch


def test_a_batch_the_store_fails_midway_goes_to_the_journal_in_order_and_is_replayed(
    paths: NodePaths, store: GatedStore, failing: dict[str, bool]
) -> None:
    recorder = EventRecorder(lambda: store, paths, "n1", linger=0)  # type: ignore[arg-type,return-value]
    record_held(recorder, store, [gate_event(n) for n in range(6)])
    store.open.set()
    assert recorder.flush(10)
    assert [t for t, _ in stored(store)] == ["job:0"]  # job:1 and job:2 were rolled back
    assert journal_targets(paths) == [f"job:{n}" for n in range(1, 6)]  # in their order
    failing["on"] = False
    recorder.record(gate_event(6), dt.datetime(2026, 11, 25, 12, 1, tzinfo=dt.UTC))
    assert recorder.flush(10)
    assert journal.pending(paths) == []
    targets = [t for t, _ in stored(store)]
    assert sorted(targets) == sorted(f"job:{n}" for n in range(7))  # each once
    assert targets[:2] == ["job:0", "job:6"]
    assert targets[-5:] == [f"job:{n}" for n in range(1, 6)]  # replayed in their order
    # (after job:6, whose write showed the store back: `medic events` orders by time)
    at = dict(stored(store))
    assert at["job:4"] == dt.datetime(2026, 11, 25, 12, 0, 4, tzinfo=dt.UTC)  # its own time


@pytest.mark.parametrize("refusal", ["checked", "database"])
def test_a_bad_event_in_a_batch_loses_none_of_the_others(
    paths: NodePaths,
    store: GatedStore,
    refusal: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One the store's checks refuse (a NUL), or one the database refuses (a trigger): the
    others are written one by one, the bad one kept aside with one line saying why."""
    if refusal == "database":
        with store.store.engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse_job_3 BEFORE INSERT ON events WHEN NEW.target = 'job:3' "
                "BEGIN SELECT RAISE(ABORT, 'job 3 is refused'); END"
            )
    events = [gate_event(n) for n in range(6)]
    if refusal == "checked":
        events[3] = gate_event(3, message="a NUL \x00 here")
    recorder = EventRecorder(lambda: store, paths, "n1", linger=0)  # type: ignore[arg-type,return-value]
    record_held(recorder, store, events)
    store.open.set()
    assert recorder.flush(10)
    assert [t for t, _ in stored(store)] == ["job:0", "job:1", "job:2", "job:4", "job:5"]
    [line] = [r.getMessage() for r in caplog.records if "not stored" in r.getMessage()]
    assert "job:3" in line and ("NUL" in line or "job 3 is refused" in line)
    # Kept in the journal, and set aside at its replay (the writes after it): not retried.
    assert journal.pending(paths) == []
    [aside] = (paths.state_dir / "journal").glob("*.bad")
    assert json.loads(aside.read_text())["event"]["target"] == "job:3"


def test_an_exit_while_the_write_fails_keeps_each_event_once(
    paths: NodePaths, store: GatedStore
) -> None:
    recorder = EventRecorder(lambda: store, paths, "n1", bound=2, linger=0)  # type: ignore[arg-type,return-value]
    record_held(recorder, store, [gate_event(n) for n in range(5)])  # 1, 2 queued; 3, 4 over
    recorder.close(timeout=0.05)
    store.down = True  # the write in flight fails after the exit kept it
    store.open.set()
    poll("the writer done", lambda: recorder.flush(0.0))
    assert sorted(journal_targets(paths)) == [f"job:{n}" for n in range(5)]
    recorder.record(gate_event(5))  # after close: straight to the journal
    assert sorted(journal_targets(paths)) == [f"job:{n}" for n in range(6)]
    assert gate_events(store) == []


# -- every event ends in the store or the journal exactly once --------------------------------


class FakeStore:
    """A store in memory: down or up; refuses an event whose target starts with "bad"."""

    def __init__(self) -> None:
        self.down = False
        self.rows: list[tuple[str, str]] = []  # (target, "batch" or "replay")
        self.lock = threading.Lock()

    def _check(self, events: list[dict[str, Any]]) -> None:
        if self.down:
            raise OSError("could not connect to server")
        if any(str(e["target"]).startswith("bad") for e in events):
            raise ValueError("event message contains a NUL character")

    def add_events(self, events: list[dict[str, Any]]) -> int:
        with self.lock:
            self._check(events)
            self.rows += [(str(e["target"]), "batch") for e in events]
        return len(events)

    def add_event(self, node: str, **event: Any) -> None:
        with self.lock:
            self._check([event])
            self.rows.append((str(event["target"]), "replay"))


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.booleans()),  # a good event, or a bad one
        st.tuples(st.sampled_from(["down", "up", "flush"]), st.just(False)),
    ),
    max_size=25,
)


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(ops=OPS, exit_at_end=st.booleans())
def test_every_event_ends_in_the_store_or_the_journal_exactly_once(
    ops: list[tuple[str, bool]], exit_at_end: bool
) -> None:
    with tempfile.TemporaryDirectory(prefix="medic-recorder-") as tmp:
        paths = NodePaths(state_dir=Path(tmp) / "state", socket=Path(tmp) / "run" / "h.sock")
        fake = FakeStore()
        recorder = EventRecorder(lambda: fake, paths, "n1", bound=4, linger=0)  # type: ignore[arg-type,return-value]
        targets: list[str] = []
        for op, good in ops:
            if op == "record":
                target = f"{'job' if good else 'bad'}:{len(targets)}"
                targets.append(target)
                recorder.record(gate_event(len(targets) - 1, target=target))
            elif op == "flush":
                assert recorder.flush(30)
            else:
                fake.down = op == "down"
        if exit_at_end:
            recorder.close(timeout=0.0)
        assert recorder.flush(30)

        def everywhere() -> list[str]:
            kept = journal_targets(paths)
            aside = [
                str(json.loads(p.read_text())["event"]["target"])
                for p in (paths.state_dir / "journal").glob("*.bad")
            ]
            return sorted([t for t, _ in fake.rows] + kept + aside)

        assert everywhere() == sorted(targets)  # nothing lost, nothing twice
        direct = [int(t.split(":")[1]) for t, how in fake.rows if how == "batch"]
        assert direct == sorted(direct)  # written in the order recorded
        fake.down = False  # the store is back: the journal empties into it
        journal.replay(paths, lambda e: fake.add_event(e.node, **e.event))
        assert everywhere() == sorted(targets)
        assert sorted(t for t, _ in fake.rows) == sorted(t for t in targets if t[:3] == "job")


def test_the_writer_lingers_for_more_and_a_flush_cuts_it_short(
    paths: NodePaths, store: GatedStore
) -> None:
    """A busy node's starts share a transaction: the writer waits `linger` after the first
    event; a flush (job_summary, exit) does not wait for the linger."""
    store.open.set()
    recorder = EventRecorder(lambda: store, paths, "n1", linger=30)  # type: ignore[arg-type,return-value]
    for n in range(3):
        recorder.record(gate_event(n), at=dt.datetime(2026, 11, 25, 12, 0, n, tzinfo=dt.UTC))
    begin = time.monotonic()
    assert recorder.flush(10)
    assert time.monotonic() - begin < 10  # far below the 30 s linger
    assert store.batches == [[f"job:{n}" for n in range(3)]]
    recorder.record(gate_event(3))
    assert recorder.flush(10)  # a second flush after a batch: again without lingering
    assert store.batches[-1] == ["job:3"]


def test_rails_the_ladder_read_spare_the_gate_its_own_read_and_refuse_at_once(
    tmp_path: Path, paths: NodePaths, store: GatedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remediation import tickets

    gate = make_gate(tmp_path, paths, store, ok("gpu_count", "8 GPUs"))
    reads = counted_rail_reads(gate, monkeypatch)
    assert gate.launch(5.0, job_id="100")["allow"]
    assert gate.recorder.flush(10) and len(reads) == 1
    tickets.open_ticket(store.store, "n1", "gpu.xid.79", "fell off the bus", [], {}, "test")
    gate.observe_rails(tickets.read_rails(store.store, "n1"))  # the ladder's tick, say
    reply = gate.launch(5.0, job_id="101")
    assert not reply["allow"] and "RMA" in reply["why"]  # at once, not within RAILS_MAX_AGE
    assert gate.recorder.flush(10) and len(reads) == 1  # and without a read of its own

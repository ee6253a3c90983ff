"""The node's write-ahead journal (hardening issue, item 9): an event the store cannot take
(its disk full, PostgreSQL down) is kept locally and replayed, with its own time, once the
store is back. Real processes: the inline prolog with the daemon down, its gate decision
recorded against a store that refuses the write."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healthd.fixtures import write_host_tree
from medic_core import journal, proc
from medic_core.config import NodePaths, load_config
from medic_core.store import open_store
from remediation.actions import replay_journal

VENV_BIN = Path(sys.executable).parent
FUZZ = settings(max_examples=200, derandomize=True, database=None, deadline=None)


def _paths(tmp_path: Path) -> NodePaths:
    return NodePaths(state_dir=tmp_path / "state", socket=tmp_path / "run" / "healthd.sock")


def _event(n: int) -> dict[str, object]:
    return {"kind": "gate", "severity": "INFO", "source": "prolog", "message": f"job {n}",
            "target": f"job:{n}", "evidence": {"job_id": str(n)}}  # fmt: skip


def test_entries_are_replayed_oldest_first_with_their_own_time(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    t0 = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    for n in range(3):
        journal.write_ahead(paths, "n1", _event(n), t0 + dt.timedelta(seconds=n))
    assert len(journal.pending(paths)) == 3
    entry = paths.state_dir / journal.JOURNAL
    assert (entry.stat().st_mode & 0o777) == 0o700
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in journal.pending(paths))
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as store:
        got: list[str] = []

        def add(e: journal.Entry) -> None:
            got.append(str(e.event["message"]))
            store.add_event(node=e.node, at=e.at, kind=str(e.event["kind"]), severity="INFO",
                            source="prolog", message=str(e.event["message"]))  # fmt: skip

        done = journal.replay(paths, add)
        assert (done.delivered, done.left, done.set_aside, done.stopped) == (3, 0, [], "")
        assert got == ["job 0", "job 1", "job 2"]
        assert sorted(e.at for e in store.events("n1")) == [
            t0 + dt.timedelta(seconds=n) for n in range(3)
        ]
    assert journal.pending(paths) == []


def test_a_store_still_down_stops_the_replay_and_keeps_every_entry(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    for n in range(3):
        journal.write_ahead(paths, "n1", _event(n))

    def down(e: journal.Entry) -> None:
        raise ConnectionRefusedError("connection refused")

    done = journal.replay(paths, down)
    assert (done.delivered, done.left) == (0, 3)
    assert done.stopped == "ConnectionRefusedError: connection refused"


def test_an_entry_that_is_not_one_is_set_aside_and_the_rest_replayed(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    journal.write_ahead(paths, "n1", _event(1))
    junk = paths.state_dir / journal.JOURNAL / "00000000000000000000-1-aa.json"
    junk.write_bytes(b"\xff{not json")
    done = journal.replay(paths, lambda e: None)
    assert (done.delivered, done.left) == (1, 0)
    assert done.set_aside == [f"{junk}: not JSON (UnicodeDecodeError)"]
    assert junk.with_name(junk.name + ".bad").exists()


def test_a_full_state_dir_falls_back_to_the_runtime_dir(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    paths.state_dir.mkdir()
    (paths.state_dir / journal.JOURNAL).write_text("a file where the directory should be")
    kept = journal.write_ahead(paths, "n1", _event(1))
    assert kept.parent == paths.socket.parent / journal.JOURNAL
    assert journal.pending(paths) == [kept]


@FUZZ
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_file_in_the_journal_is_an_entry_or_one_line(raw: bytes) -> None:
    """The property for the journal's reader: a clear ValueError or an entry, nothing else."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.json"
        path.write_bytes(raw)
        try:
            entry = journal.read_entry(path)
        except ValueError as exc:
            assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)
        else:
            assert entry.at.tzinfo is not None and entry.event["kind"]


@FUZZ
@given(
    doc=st.fixed_dictionaries(
        {
            "format": st.sampled_from([1, 1, "1", None]),
            "node": st.text(max_size=5) | st.none(),
            "at": st.sampled_from(["2025-01-01T00:00:00+00:00", "2025-01-01T00:00:00", "", "x"])
            | st.integers(),
            "event": st.dictionaries(
                st.sampled_from(["kind", "x"]), st.text(max_size=3) | st.integers()
            ),
        }
    )
)
def test_any_json_in_the_journal_is_an_entry_or_one_line(doc: dict[str, object]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.json"
        path.write_text(json.dumps(doc))
        try:
            journal.read_entry(path)
        except ValueError as exc:
            assert str(exc).startswith(f"{path}: ")


# --- end to end: the inline prolog's gate decision ---------------------------------------------

DISK_FULL = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # SQLite's WAL cannot grow
# Nor can a .pyc: Python would leave the project's bytecode cut at 4096 bytes for every
# later process ("marshal data too short").
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
os.execv(sys.argv[1], sys.argv[1:])
"""


def _config(tmp_path: Path, store_url: str) -> Path:
    root = tmp_path / "host"
    if not root.exists():
        write_host_tree(root)
    path = tmp_path / "medic.toml"
    path.write_text(
        f"""
[node]
host_root = "{root}"
state_dir = "{tmp_path / "state"}"
socket = "{tmp_path / "run" / "healthd.sock"}"
[slurm]
conf = "{tmp_path / "no-slurm.conf"}"
[store]
url = "{store_url}"
[healthd]
gpus = "none"
# Burn-in off: these tests judge a node in service, not one never burnt in
# (tests/test_burn_in_gate.py).
[remediation.burn_in]
new_node = []
[hooks]
release_held = false
"""
    )
    return path


@pytest.mark.parametrize("failure", ["disk full", "PostgreSQL down"])
def test_the_gate_decision_survives_a_store_that_refuses_it(tmp_path: Path, failure: str) -> None:
    """Before: `medic: could not record gate: ...` and the decision was gone."""
    db = tmp_path / "store" / "medic.db"
    open_store(f"sqlite:///{db}").close()  # an existing store, as on a running node
    down_url = "postgresql+psycopg://medic@127.0.0.1:1/medic"  # nothing listens on port 1
    config = _config(tmp_path, f"sqlite:///{db}" if failure == "disk full" else down_url)
    env = {"PATH": "/usr/bin:/bin", "MEDIC_CONFIG": str(config), "MEDIC_NODE_NAME": "plain1",
           "SLURM_JOB_ID": "42"}  # fmt: skip
    prolog = str(VENV_BIN / "medic-prolog")
    argv = [sys.executable, "-c", DISK_FULL, prolog] if failure == "disk full" else [prolog]
    before = dt.datetime.now(dt.UTC)
    done = proc.run(argv, env=env, timeout=60)
    after = dt.datetime.now(dt.UTC)
    assert done.returncode == 0, done.stderr  # a healthy node: the job runs
    paths = load_config(config).paths
    kept = journal.pending(paths)
    assert len(kept) == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("medic: could not record gate: ")
    assert line.endswith(f"kept in {kept[0]}, replayed when the store is back")
    with open_store(f"sqlite:///{db}") as store:
        assert store.events("plain1", kind="gate") == []
    # The store is back (the disk has room again; PostgreSQL's events go to a store that
    # takes them): the next health check replays the decision, with the time it was made.
    config = _config(tmp_path, f"sqlite:///{db}")
    line = replay_journal(load_config(config))
    assert line == "journal: 1 events replayed into the store, 0 left"
    with open_store(f"sqlite:///{db}") as store:
        (gate,) = store.events("plain1", kind="gate")
    assert before <= gate.at <= after
    assert gate.target == "job:42" and gate.evidence["allow"] is True
    assert gate.message == "job 42 allowed (OK)"
    assert journal.pending(paths) == [] and replay_journal(load_config(config)) == ""


def test_a_store_that_takes_the_event_leaves_no_journal_entry(tmp_path: Path) -> None:
    db = tmp_path / "store" / "medic.db"
    config = _config(tmp_path, f"sqlite:///{db}")
    env = {"PATH": "/usr/bin:/bin", "MEDIC_CONFIG": str(config), "MEDIC_NODE_NAME": "plain1",
           "SLURM_JOB_ID": "43"}  # fmt: skip
    done = proc.run([str(VENV_BIN / "medic-prolog")], env=env, timeout=60)
    assert done.returncode == 0 and "could not record" not in done.stderr, done.stderr
    assert journal.pending(load_config(config).paths) == []
    with open_store(f"sqlite:///{db}") as store:
        assert [e.target for e in store.events("plain1", kind="gate")] == ["job:43"]
    assert os.listdir(tmp_path / "state" / journal.JOURNAL) == []

"""The socket's authorization matrix (issue 23, finding 1): every op the daemon's socket
answers has an entry in healthd.socket_matrix.MATRIX naming the peers that may send it and
the fields they may send; what the entry does not grant is refused in one line before it
runs. The real socket server (SocketApi.serve) of an in-process HealthDaemon, with scripted
checks, asked by real peers: root (this process), and through setpriv `nobody` as a member
of the socket group (by its primary group, and by a supplementary one) and as a peer in no
group of the socket's (the socket's mode opened for the test, as a stray ACL would).
Everything waits by polling with a deadline."""

from __future__ import annotations

import ast
import contextlib
import grp
import inspect
import json
import os
import pwd
import shutil
import socket
import textwrap
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from healthd.checks.base import CheckContext, Result, Tier, ok
from healthd.launch_gate import POST_JOB_CHECKS
from healthd.runner import Runner
from healthd.socket_api import JOB_END_QUEUE, SOCKET_OPS, AfterJobQueue, SocketApi
from healthd.socket_matrix import MATRIX, Caller, matrix_table
from medic_core import proc
from medic_core.config import load_config
from medic_core.store import Store, open_configured_store
from tests.conftest import poll
from tests.installed import installed_medic
from tests.test_checks_runner import make_spec
from tests.test_daemon import plain_config

REPO = Path(__file__).resolve().parent.parent
NOBODY = pwd.getpwnam("nobody")
SOCKET_GROUP = grp.getgrgid(NOBODY.pw_gid).gr_name  # nogroup: nobody's own
OTHER_GID = grp.getgrnam("daemon").gr_gid  # a group that is not the socket's

# One request each op's hook (or operator) sends: a new op needs one here, and an entry in
# the matrix, or test_every_op_has_an_example_and_an_entry fails.
EXAMPLES: dict[str, dict[str, Any]] = {
    "ping": {"op": "ping"},
    "status": {"op": "status"},
    "metrics": {"op": "metrics"},
    "launch": {"op": "launch", "budget": 2, "job_id": "7"},
    "job_end": {"op": "job_end", "job_id": "8"},
    "job_summary": {"op": "job_summary", "job_id": "9", "budget": 2},
    "event": {
        "op": "event", "kind": "gate", "severity": "INFO", "source": "prolog",
        "target": "job:10", "message": "job 10 allowed (OK)", "fault_class": "",
        "evidence": {"job_id": "10", "allow": True},
    },
    "check": {"op": "check", "checks": ["cpus"], "budget": 5},
    "adopt": {"op": "adopt"},
}  # fmt: skip

# A peer that sends a list of requests, one connection each, and prints the raw replies.
CLIENT = """
import json, socket, sys
out = []
for request in json.loads(sys.argv[2]):
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(sys.argv[1])
            s.sendall(json.dumps(request).encode() + b"\\n")
            out.append(json.loads(s.makefile("rb").readline()))
    except OSError as exc:
        out.append({"oserror": type(exc).__name__})
print(json.dumps(out))
"""

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


@dataclass
class Served:
    api: SocketApi
    store: Store
    socket: Path
    ran: list[str]  # the scripted checks' runs, in order

    def as_root(self, request: dict[str, Any]) -> dict[str, Any]:
        return ask_raw(self.socket, request)


def ask_raw(path: Path, request: dict[str, Any]) -> dict[str, Any]:
    """One request; the reply as the daemon wrote it (medic_core.api.ask raises on errors)."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(30)
        conn.connect(str(path))
        conn.sendall(json.dumps(request).encode() + b"\n")
        line = conn.makefile("rb").readline()
    assert line.endswith(b"\n") and line.count(b"\n") == 1, line
    reply: dict[str, Any] = json.loads(line)
    return reply


def scripted(name: str, ran: list[str], tier: Tier = Tier.PERIODIC) -> Any:
    def behaviour() -> list[Result]:
        ran.append(name)
        return [ok(name, f"{name} fine")]

    tiers = (tier, Tier.LAUNCH) if tier is Tier.PERIODIC else (tier,)
    return make_spec(name, behaviour, tiers=tiers)


@contextlib.contextmanager
def served_daemon(top: Path) -> Iterator[Served]:
    from healthd.daemon import HealthDaemon

    config_path = plain_config(top)
    text = config_path.read_text().replace('socket_group = ""', f'socket_group = "{SOCKET_GROUP}"')
    config_path.write_text(text)
    config = load_config(config_path)
    store = open_configured_store(config)
    daemon = HealthDaemon(config, store, CheckContext.for_root(config.paths.host_root))
    ran: list[str] = []
    specs = [scripted(n, ran) for n in ("cpus", *POST_JOB_CHECKS)]
    specs += [scripted(n, ran, Tier.DEEP) for n in ("deep_dcgm", "deep_fs_io")]
    daemon.runner = Runner(daemon.ctx, specs=specs)
    api = SocketApi(daemon, daemon.gate)
    server = api.serve(config.paths.socket)
    try:
        yield Served(api, store, config.paths.socket, ran)
    finally:
        server.shutdown()
        server.server_close()
        poll("the post-job worker done", lambda: api.after_jobs.pending() == 0, timeout=30)
        api.gate.recorder.flush(5.0)
        store.close()


@pytest.fixture
def served() -> Iterator[Served]:
    """The socket in a directory `nobody` can traverse (pytest's own is root-only)."""
    top = Path(f"/tmp/medic-matrix-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    top.mkdir(mode=0o755)
    try:
        with served_daemon(top) as s:
            yield s
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_peer(path: Path, requests: list[dict[str, Any]], *ids: str) -> list[dict[str, Any]]:
    """`requests` sent by `nobody` with the setpriv options `ids` (its group(s))."""
    done = proc.run(
        ["setpriv", f"--reuid={NOBODY.pw_uid}", *ids, "--", str(installed_medic().python), "-I",
         "-c", CLIENT, str(path), json.dumps(requests)],
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    replies: list[dict[str, Any]] = json.loads(done.stdout)
    return replies


PEERS: dict[str, tuple[Caller, tuple[str, ...]]] = {
    "socket group (primary)": (Caller.GROUP, (f"--regid={NOBODY.pw_gid}", "--clear-groups")),
    "socket group (supplementary)": (
        Caller.GROUP,
        (f"--regid={OTHER_GID}", f"--groups={NOBODY.pw_gid}"),
    ),
    "anyone": (Caller.ANYONE, (f"--regid={OTHER_GID}", "--clear-groups")),
}


def granted(op: str, caller: Caller) -> bool:
    return any(caller in g.callers for g in MATRIX[op].grants)


# --- the matrix is whole --------------------------------------------------------------------


def answered_ops() -> set[str]:
    """The ops SocketApi.handle compares `op` with: what it answers."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(SocketApi.handle)))
    found = set()
    for node in ast.walk(tree):
        left = node.left if isinstance(node, ast.Compare) else None
        if isinstance(node, ast.Compare) and isinstance(left, ast.Name) and left.id == "op":
            found |= {c.value for c in node.comparators if isinstance(c, ast.Constant)}
    return found


def test_every_op_has_an_example_and_an_entry() -> None:
    """An op added to the socket without an entry in the matrix fails here (and, sent, is
    refused as unknown: the matrix is asked before anything runs)."""
    assert answered_ops() == set(MATRIX) == set(EXAMPLES) == set(SOCKET_OPS)
    for entry in MATRIX.values():
        assert entry.grants and entry.sent_by
        callers = [c for g in entry.grants for c in g.callers]
        assert len(callers) == len(set(callers)), f"{entry.op}: a caller in two grants"


def test_docs_security_md_shows_the_matrix() -> None:
    text = (REPO / "docs" / "security.md").read_text()
    assert matrix_table() in text, "docs/security.md: paste healthd.socket_matrix.matrix_table()"


# --- real peers -----------------------------------------------------------------------------


@needs_root
def test_each_peer_gets_what_the_matrix_grants_and_no_more(served: Served) -> None:
    ops = list(EXAMPLES)
    for name, (caller, ids) in PEERS.items():
        if caller is Caller.ANYONE:  # the shipped mode keeps it out at connect()
            refused = as_peer(served.socket, [EXAMPLES["ping"]], *ids)
            assert refused == [{"oserror": "PermissionError"}], name
            os.chmod(served.socket, 0o666)  # a stray mode or ACL: the matrix still holds
        replies = as_peer(served.socket, [EXAMPLES[op] for op in ops], *ids)
        for op, reply in zip(ops, replies, strict=True):
            denied = reply.get("error", "").startswith(f"{op}: permission denied for uid ")
            assert denied != granted(op, caller), f"{name} {op}: {reply}"
            assert "oserror" not in reply and "internal error" not in str(reply), (name, reply)
            if not denied:
                assert "error" not in reply or reply["error"].startswith("busy"), (name, reply)
    for op in ops:  # root: every op
        reply = served.as_root(EXAMPLES[op])
        assert "error" not in reply, (op, reply)


@needs_root
def test_job_summary_runs_only_the_daemons_post_job_checks(served: Served) -> None:
    """Before: the socket group named deep_dcgm and deep_fs_io and root's deep tier ran."""
    hostile = {"op": "job_summary", "job_id": "5", "checks": ["deep_dcgm", "deep_fs_io"]}
    group = PEERS["socket group (primary)"][1]
    [reply] = as_peer(served.socket, [hostile], *group)
    assert reply == {"error": "job_summary: field 'checks' is not accepted"}
    assert served.as_root(hostile)["error"].startswith("job_summary: field 'checks'")
    [summary] = as_peer(served.socket, [{"op": "job_summary", "job_id": "5"}], *group)
    assert sorted(r["check"] for r in summary["results"]) == sorted(POST_JOB_CHECKS)
    assert not {"deep_dcgm", "deep_fs_io"} & set(served.ran)


@needs_root
def test_the_socket_group_cannot_write_a_job_action(served: Served) -> None:
    """Before: a job_action from the socket group was stored, and a forged job appeared in
    `medic report`. The group may record only the prolog's gate decision for a job."""
    forged = [
        {"op": "event", "kind": "job_action", "target": "job:666", "message": "requeued",
         "evidence": {"job_id": "666", "action": "requeued"}},
        {"op": "event", "kind": "gate", "source": "release", "target": "job:666"},
        {"op": "event", "kind": "gate", "target": "job:666", "evidence": {"job_id": "1"}},
        {"op": "event", "kind": "gate", "target": "node:x"},
        {"op": "event", "kind": "gate", "target": "job:666", "at": "2020-01-01"},
        {"op": "event", "kind": "gate", "target": "job:666", "message": "x" * 5000},
    ]  # fmt: skip
    replies = as_peer(served.socket, forged, *PEERS["socket group (primary)"][1])
    assert all(set(r) == {"error"} for r in replies), replies
    assert replies[0]["error"] == "event: kind is not one of gate"
    assert not served.store.events(kind="job_action")
    assert not [e for e in served.store.events(kind="gate") if e.target == "job:666"]
    # root (the releaser medic-healthd starts) still records one
    assert "event_id" in served.as_root({**forged[0], "source": "release"})
    assert [e.target for e in served.store.events(kind="job_action")] == ["job:666"]


def test_a_flood_of_job_end_is_queued_or_told_busy_and_starts_one_thread(
    tmp_path: Path,
) -> None:
    """Before: one thread per job_end; 400 under TasksMax=256 gave 66 'can't start new
    thread' errors. Now one worker thread; JOB_END_QUEUE wait; the rest are told busy."""
    release, running = threading.Event(), threading.Event()
    done: list[str] = []

    def after_job(job_id: str) -> None:
        running.set()
        release.wait(60)
        done.append(job_id)

    top = tmp_path / "d"
    top.mkdir()
    with served_daemon(top) as served:
        served.api.after_jobs = AfterJobQueue(after_job)
        threads = threading.active_count()
        try:
            replies = [served.as_root({"op": "job_end", "job_id": str(j)}) for j in range(600)]
            poll("the worker on its first job", running.is_set)
            # one post-job worker, a socket worker or two and the gate's recorder: not 600
            assert threading.active_count() <= threads + 8
            assert [t.name for t in threading.enumerate()].count("after-job") == 1
            queued = [r for r in replies if r.get("queued")]
            busy = [r for r in replies if "error" in r]
            assert len(queued) + len(busy) == 600
            # the first job taken by the worker at once, or not yet: the queue holds the rest
            assert JOB_END_QUEUE <= len(queued) <= JOB_END_QUEUE + 1
            assert {r["error"] for r in busy} == {
                f"busy: {JOB_END_QUEUE} ended jobs wait for checks"
            }
            again = served.as_root({"op": "job_end", "job_id": queued[-1]["job_id"]})
            assert again.get("queued") is True  # already queued: once
        finally:
            release.set()  # a failure must not leave the worker held
        poll("the queue drained", lambda: served.api.after_jobs.pending() == 0, timeout=30)
        assert sorted(done, key=int) == [r["job_id"] for r in queued]
        poll("the worker gone", lambda: "after-job" not in [t.name for t in threading.enumerate()])


def test_the_queue_answers_busy_when_no_thread_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    queue = AfterJobQueue(lambda job: None)

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    assert queue.submit("1") is False and queue.pending() == 0
    monkeypatch.undo()
    assert queue.submit("1") is True
    poll("the job run", lambda: queue.pending() == 0)


# --- hostile request lines ------------------------------------------------------------------


def hostile_lines() -> Any:
    from hypothesis import strategies as st

    fields = sorted({a.name for e in MATRIX.values() for g in e.grants for a in g.args})
    scalars = (
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
        | st.sampled_from(["deep_dcgm", "job:1", "gate", "job_action", "INFO", "deep", "1"])
    )  # fmt: skip
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=8,
    )
    keys = st.sampled_from([*fields, "uid", "at", "op"]) | st.text(max_size=10)
    request = st.fixed_dictionaries(
        {"op": st.sampled_from([*MATRIX, "nope", ""]) | values},
        optional={k: values for k in fields},
    ) | st.dictionaries(keys, values, max_size=6)
    as_line = request.map(lambda r: json.dumps(r).encode())
    raw = st.binary(max_size=200).filter(lambda b: b"\n" not in b)
    return as_line | raw | values.map(lambda v: json.dumps(v).encode())


def test_fuzzed_request_lines_get_one_line_never_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Any line from any peer: one JSON object back, an error in one short line, at once
    (the scripted checks answer in microseconds), and no traceback in the daemon's log."""
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from healthd.socket_matrix import ROOT_PEER, Peer

    peers = [ROOT_PEER, Peer(4242, 4242, 4242), Peer(-1, -1, -1)]
    top = tmp_path / "d"
    top.mkdir()
    with served_daemon(top) as served:
        api = served.api
        api.socket_gid = 4242
        api.after_jobs = AfterJobQueue(lambda job: None)

        @settings(
            max_examples=400, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )  # fmt: skip
        @given(hostile_lines(), st.sampled_from(peers))
        def one(line: bytes, peer: Peer) -> None:
            begin = time.monotonic()
            op, reply = api.reply(line, peer)
            assert time.monotonic() - begin < 10, line
            assert b"\n" not in reply and op in (*MATRIX, "invalid")
            answer = json.loads(reply)
            assert isinstance(answer, dict)
            if "error" in answer:
                error = answer["error"]
                assert isinstance(error, str) and "\n" not in error and len(error) < 400
                assert "internal error" not in error and "Traceback" not in error, line

        one()
        # Found by the fuzz: an op that is a large object was echoed whole in the refusal.
        _, reply = api.reply(json.dumps({"op": {str(i) * 30: None for i in range(20)}}).encode(),
                             ROOT_PEER)  # fmt: skip
        assert len(json.loads(reply)["error"]) < 200
        for line in (b"[" * 100_000, b'{"op": "event", "evidence": ' + b"[" * 5000):
            _, reply = api.reply(line, ROOT_PEER)
            assert json.loads(reply)["error"].startswith("bad request: ")
        assert "pid" in ask_raw(served.socket, {"op": "ping"})  # still serving
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not [r for r in caplog.records if r.exc_info]


def test_refusals_are_one_line_and_name_the_field() -> None:
    from healthd.socket_matrix import ROOT_PEER, refusal

    cases: list[tuple[dict[str, Any], str]] = [
        ({"op": "check", "tier": "bogus"}, "check: tier is not one of"),
        ({"op": "check", "budget": float("inf")}, "check: budget is not a number of seconds"),
        ({"op": "launch", "budget": True}, "launch: budget is not a number"),
        ({"op": "launch", "job_id": "1; rm"}, "launch: job_id is not a Slurm job id"),
        ({"op": "job_end"}, "job_end: job_id is required"),
        ({"op": "job_end", "job_id": 8}, "job_end: job_id is not a Slurm job id"),
        ({"op": "event", "kind": "admin"}, "event: kind is not one of gate, job_summary"),
        ({"op": "ping", "x": 1}, "ping: field 'x' is not accepted"),
        ({"op": ["status"]}, "unknown op ['status']"),
    ]
    for request, start in cases:
        why = refusal(request["op"], request, ROOT_PEER, Caller.ROOT)
        assert why.startswith(start) and "\n" not in why, (request, why)

"""The bounded servers' worker pool and accept loop (healthd.metrics.BoundedServerMixIn, issue
15): no timer wakes the loop when nothing happens, shutdown is immediate, a few persistent
workers serve one connection after another, and a handler's exception never costs a worker.
A small Unix-socket server with an echo handler; the loop's sleeps are recorded through its
selector (the timeout of every poll). Everything waits by polling with a deadline."""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import socketserver
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.metrics import BoundedServerMixIn
from tests.conftest import poll


class Echo(socketserver.StreamRequestHandler):
    """`ok <line>` back; `boom` raises, `exit` raises SystemExit, `hold` waits for the test."""

    server: Pool

    def handle(self) -> None:
        line = self.rfile.readline()
        if not line:
            return
        self.server.request_read(self.request)
        word = line.strip()
        if word == b"boom":
            raise RuntimeError("boom")
        if word == b"exit":
            raise SystemExit(3)
        if word == b"hold":
            with self.server.lock:
                self.server.holding += 1  # its request is read: never evicted from here on
            self.server.release.wait(10)
        self.wfile.write(b"ok " + line)


class Pool(BoundedServerMixIn, socketserver.UnixStreamServer):
    max_connections = 3
    idle_seconds = 5.0
    deadline = 30.0
    busy_reply = b"busy\n"
    timeouts: list[float | None]  # each poll's timeout, recorded as the loop goes to sleep
    release: threading.Event
    holding: int  # `hold` requests read and waiting for `release`
    lock: threading.Lock


@contextlib.contextmanager
def running(path: Path, **bounds: Any) -> Iterator[Pool]:
    timeouts: list[float | None] = []

    class Recording(selectors.PollSelector):
        def select(self, timeout: float | None = None) -> Any:
            timeouts.append(timeout)
            return super().select(timeout)

    name = f"pool-{uuid.uuid4().hex[:8]}"
    attributes = {"selector_class": Recording, "worker_name": name, **bounds}
    server: Pool = type("TestPool", (Pool,), attributes)(str(path), Echo)
    server.timeouts, server.release = timeouts, threading.Event()
    server.holding, server.lock = 0, threading.Lock()
    loop = threading.Thread(target=server.serve_forever, daemon=True)
    loop.start()
    try:
        poll("the loop asleep", lambda: bool(timeouts))
        yield server
    finally:
        server.release.set()
        stopped = stops(server)
        server.server_close()
    assert stopped, "shutdown() still waiting for serve_forever after 5 s"
    loop.join(5)
    poll("the workers gone with the server", lambda: workers(server) == 0)


def stops(server: Pool) -> bool:
    """shutdown() returns within 5 s (a generous bound: it returns at once, and without the
    wake-up pipe it would wait for the loop's next event, forever on an idle server)."""
    stopper = threading.Thread(target=server.shutdown, daemon=True)
    stopper.start()
    stopper.join(5)
    return not stopper.is_alive()


def workers(server: Pool) -> int:
    return sum(t.name == server.worker_name for t in threading.enumerate())


def connect(server: Pool) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(server.server_address)  # type: ignore[arg-type]
    return s


def ask(server: Pool, line: bytes) -> bytes:
    with connect(server) as s:
        s.sendall(line + b"\n")
        return s.makefile("rb").readline()


def ask_in_turn(server: Pool, line: bytes) -> bytes:
    """One client after the other, as the prolog's: the last one's worker is idle again (a
    client has its reply a moment before the worker is done with the connection)."""
    poll("the last connection done", lambda: server.active == 0)
    return ask(server, line)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "p.sock"


def asleep(server: Pool, polls: int) -> bool:
    """The loop has gone back to poll() more than `polls` times, the last without a
    timeout: it sleeps until a client or shutdown() wakes it."""
    return len(server.timeouts) > polls and server.timeouts[-1] is None


def test_an_idle_server_sleeps_without_a_timeout_and_again_after_serving(path: Path) -> None:
    with running(path, deadline=0.2) as server:
        assert server.timeouts == [None]  # no 0.5 s poll: nothing wakes it but an event
        for i in range(5):
            polls = len(server.timeouts)
            assert ask(server, b"hi %d" % i) == b"ok hi %d\n" % i
            poll("the loop asleep again", lambda: asleep(server, polls))  # noqa: B023
        # Woken only by each connection, and at most once more by its request's deadline
        # (the loop cuts unread connections itself): never by a timer of its own.
        assert all(t is None or 0 <= t <= 0.2 for t in server.timeouts)


def test_an_unread_connection_is_cut_at_its_deadline_by_the_loop_alone(path: Path) -> None:
    with running(path, deadline=0.3) as server, connect(server) as idle:
        assert idle.recv(100) == b""  # cut by the loop at its deadline, no reaper thread
        poll("the slot freed", lambda: server.active == 0)
        poll("the loop asleep again", lambda: asleep(server, 1))
        assert 0 < max(t for t in server.timeouts if t is not None) <= 0.3
        assert not [t for t in threading.enumerate() if t.name == "conn-reaper"]


@pytest.mark.parametrize("client", [False, True], ids=["idle", "with-an-unread-client"])
def test_shutdown_returns_at_once_not_at_a_poll(path: Path, client: bool) -> None:
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(running(path, deadline=600.0))
        if client:  # the loop sleeps until that client's deadline, 10 minutes away
            stack.enter_context(connect(server))
            poll("the loop asleep on the deadline", lambda: (server.timeouts[-1] or 0) > 500)
        assert stops(server), "shutdown() still waiting for serve_forever after 5 s"


def test_shutdown_before_serving_returns_and_the_loop_then_exits(path: Path) -> None:
    server = type("Early", (Pool,), {})(str(path), Echo)
    try:
        server.shutdown()  # returns (socketserver's own would wait forever)
        loop = threading.Thread(target=server.serve_forever, daemon=True)
        loop.start()
        loop.join(5)
        assert not loop.is_alive()
    finally:
        server.server_close()


def test_one_worker_serves_sequential_connections(path: Path) -> None:
    with running(path) as server:
        for i in range(30):
            assert ask_in_turn(server, b"%d" % i) == b"ok %d\n" % i
        poll("the worker idle", lambda: server.active == 0)
        assert server.workers == workers(server) == 1


def test_workers_never_exceed_the_bound_and_are_kept_after_a_burst(path: Path) -> None:
    with running(path) as server:
        held = [connect(server) for _ in range(Pool.max_connections)]
        for s in held:
            s.sendall(b"hold\n")
        # Every slot busy with its request read (accepted alone is not enough: a request not
        # yet read is one to evict, a race a CI run lost), so nothing unread to evict:
        poll("every slot holding", lambda: server.holding == Pool.max_connections)
        # told busy at once, before it says anything (a request
        # sent now could meet the closed socket: EPIPE, a race the CI run lost).
        with connect(server) as extra:
            assert extra.makefile("rb").readline() == b"busy\n"
        assert server.rejected == 1 and server.evicted == 0
        server.release.set()
        for s in held:
            assert s.makefile("rb").readline() == b"ok hold\n"
            s.close()
        for i in range(20):
            assert ask_in_turn(server, b"%d" % i) == b"ok %d\n" % i
        assert server.workers == workers(server) == Pool.max_connections


def test_a_full_pool_cuts_its_oldest_unread_connection_for_a_speaking_client(
    path: Path,
) -> None:
    with running(path) as server:
        idle = [connect(server) for _ in range(Pool.max_connections)]
        poll("every slot taken", lambda: server.active == Pool.max_connections)
        assert ask(server, b"speaks") == b"ok speaks\n"
        assert idle[0].recv(100) == b""  # the oldest: cut
        assert server.evicted == 1 and server.rejected == 0
        for s in idle:
            s.close()
        assert server.workers == Pool.max_connections


def test_a_slow_client_does_not_hold_up_the_next(path: Path) -> None:
    with running(path) as server, connect(server) as slow:
        slow.sendall(b"half a li")  # and nothing more
        poll("the slow one taken", lambda: server.active == 1)
        assert ask(server, b"quick") == b"ok quick\n"


@pytest.mark.parametrize("word", [b"boom", b"exit"])
def test_a_handler_raising_leaves_the_pool_serving(
    path: Path, word: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with running(path, max_connections=1) as server:
        assert ask(server, b"first") == b"ok first\n"
        with caplog.at_level(logging.ERROR, logger="medic.healthd"):
            assert ask_in_turn(server, word) == b""  # that connection closed, no reply
            poll("the slot freed", lambda: server.active == 0)
        assert "handler failed" in caplog.text
        for i in range(3):  # the one worker goes on
            assert ask_in_turn(server, b"%d" % i) == b"ok %d\n" % i
        assert server.workers == workers(server) == 1


def test_a_flood_of_clients_leaks_no_slot_and_no_worker(path: Path) -> None:
    """8 clients at once, 25 requests each, against 3 slots: each is answered, told busy, or
    cut as the oldest unread (a race the bound allows); afterwards every slot is free, the
    workers never outnumber the slots, and the pool serves as before."""
    with running(path) as server:
        replies: list[bytes] = []
        lock = threading.Lock()

        def client(n: int) -> None:
            for i in range(25):
                try:
                    reply = ask(server, b"c%d-%d" % (n, i))
                except OSError:  # reset: cut while sending
                    reply = b""
                with lock:
                    replies.append(reply)

        clients = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(30)
        assert len(replies) == 200
        assert {r[:3] for r in replies} <= {b"ok ", b"bus", b""}
        assert any(r.startswith(b"ok ") for r in replies)
        poll("every slot free", lambda: server.active == 0)
        assert server.workers == workers(server) <= Pool.max_connections
        for i in range(5):
            assert ask_in_turn(server, b"after %d" % i) == b"ok after %d\n" % i

"""Idle and slow clients cannot exhaust medic-healthd (issue 11, item 5): the metrics
endpoint binds loopback by default, and both servers bound their connections and idle
time. Everything waits by polling with a deadline."""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.metrics import METRICS_MAX_CONNECTIONS, DaemonMetrics, MetricsServer
from medic_core.api import HealthdUnavailable, ask
from medic_core.settings import DaemonSettings
from tests.conftest import poll
from tests.test_daemon import plain_config, start_daemon, stop_daemon

IDLE = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int, timeout: float = 2.0) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def _answered(fn: object) -> bool:
    try:
        fn()  # type: ignore[operator]
    except (OSError, HealthdUnavailable):
        return False
    return True


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


@contextlib.contextmanager
def idle_clients(connect: object, n: int) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(connect())  # type: ignore[operator]
        yield socks
    finally:
        for s in socks:
            s.close()


def test_metrics_bind_loopback_by_default() -> None:
    assert DaemonSettings().metrics_address == "127.0.0.1"


def test_300_idle_connections_do_not_stop_the_daemon_answering(tmp_path: Path) -> None:
    port = _free_port()
    config = plain_config(tmp_path)
    text = config.read_text().replace("metrics_port = 0", f"metrics_port = {port}")
    config.write_text(text)
    pid = start_daemon(tmp_path, config)
    sock_path = tmp_path / "healthd.sock"
    try:
        poll("the metrics endpoint", lambda: _answered(lambda: _scrape(port)))
        before = _threads(pid)

        def tcp() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=5)

        def unix() -> socket.socket:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock_path))  # blocking: waits for room in the listen backlog
            s.settimeout(5)
            return s

        with idle_clients(tcp, IDLE), idle_clients(unix, IDLE):
            begin = time.monotonic()
            poll(
                "a ping on the socket",
                lambda: _answered(lambda: ask(sock_path, {"op": "ping"}, timeout=2)),
                timeout=8,
            )
            ping_s = time.monotonic() - begin
            begin = time.monotonic()
            poll("a scrape", lambda: _answered(lambda: _scrape(port)), timeout=8)
            scrape_s = time.monotonic() - begin
            # bounded: at most 64 socket + 16 metrics handlers (and a reaper each) more
            assert _threads(pid) <= before + 64 + METRICS_MAX_CONNECTIONS + 4
            status = ask(sock_path, {"op": "status"}, timeout=5)
            assert status["node"] == "plain1"
        print(f"\n{IDLE}+{IDLE} idle: ping after {ping_s:.2f}s, scrape after {scrape_s:.2f}s")
        assert ping_s < 8 and scrape_s < 8
    finally:
        stop_daemon(pid, tmp_path / "healthd.log")


class _Tiny(MetricsServer):
    max_connections = 2
    idle_seconds = 0.5
    deadline = 1.0


@pytest.fixture
def tiny() -> Iterator[MetricsServer]:
    server = DaemonMetrics("n1").serve("127.0.0.1", 0)
    server.__class__ = type("TinyMetrics", (_Tiny,), {"address_family": socket.AF_INET})
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_full_server_cuts_its_oldest_idle_connection_for_a_real_request(
    tiny: MetricsServer,
) -> None:
    port = tiny.server_address[1]
    with idle_clients(lambda: socket.create_connection(("127.0.0.1", port), 5), 2) as idle:
        poll("both slots taken", lambda: tiny.active == 2)
        begin = time.monotonic()
        assert "medic_" in _scrape(port)  # at once, not after idle_seconds
        assert time.monotonic() - begin < 0.5
        assert idle[0].recv(100) == b""  # the oldest idle one was cut
        assert vars(tiny)["evicted"] == 1
    poll("the slots freed", lambda: tiny.active == 0)


def test_a_dripping_client_is_cut_at_the_deadline(tiny: MetricsServer) -> None:
    port = tiny.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as drip:
        begin = time.monotonic()
        drip.sendall(b"GET /metrics HTTP/1.0\r\n")
        closed = False
        while time.monotonic() - begin < 5:
            try:
                drip.sendall(b"X")  # a byte well within idle_seconds, forever
            except OSError:
                closed = True
                break
            drip.settimeout(0.2)
            try:
                if drip.recv(100) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue  # still open: drip on
            except OSError:  # reset
                closed = True
                break
        elapsed = time.monotonic() - begin
    assert closed and elapsed < 3, f"still open after {elapsed:.1f}s"
    poll("the slot freed", lambda: tiny.active == 0)

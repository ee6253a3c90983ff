"""Prometheus metrics of the node daemon, named `medic_<subsystem>_<what>_<unit>`.

One registry per daemon (not the process-global default), so tests can run several
daemons in one process and the exposition holds nothing but Medic's own series.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import sys
import threading
import time
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
)

from healthd.checks.base import Result, Status, worst
from healthd.runner import RunReport

log = logging.getLogger("medic.healthd")

# The metrics endpoint: a scrape is one short request. At most this many at once, each
# closed when it sends nothing for METRICS_IDLE_SECONDS or is not done in METRICS_DEADLINE.
METRICS_MAX_CONNECTIONS = 16
METRICS_IDLE_SECONDS = 3.0
METRICS_DEADLINE = 10.0

# A full server cuts its oldest idle connection and waits this long for the slot it frees.
EVICT_WAIT_SECONDS = 1.0

# The value each status is exported as in medic_check_status_code / medic_condition_...
STATUS_CODES = {
    Status.NOT_APPLICABLE: -1,
    Status.OK: 0,
    Status.WARN: 1,
    Status.UNKNOWN: 2,
    Status.CRITICAL: 3,
}


class DaemonMetrics:
    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry()
        self.node = node
        self.runs = Counter(
            "medic_check_runs_total",
            "Check runs by outcome (done, error, timeout, hung, unavailable).",
            ["check", "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "medic_check_duration_seconds",
            "Wall time of one check run.",
            ["check"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.check_status = Gauge(
            "medic_check_status_code",
            "Worst status of a check's last run: -1 n/a, 0 OK, 1 WARN, 2 UNKNOWN, 3 CRITICAL.",
            ["check"],
            registry=self.registry,
        )
        self.node_status = Gauge(
            "medic_node_status_code",
            "Worst status over every check's last run (same codes).",
            registry=self.registry,
        )
        self.faults = Gauge(
            "medic_node_faults_count",
            "Current non-OK findings by status and fault class.",
            ["status", "fault_class"],
            registry=self.registry,
        )
        self.gpus = Gauge(
            "medic_gpu_devices_count", "GPUs NVML lists on this node.", registry=self.registry
        )
        self.gpu_events = Counter(
            "medic_gpu_events_total",
            "NVML events received by the listener (xid, ecc_dbe, ecc_sbe, gpu_lost, error).",
            ["kind", "gpu"],
            registry=self.registry,
        )
        self.socket_requests = Counter(
            "medic_socket_requests_total",
            "Requests on the local socket by operation.",
            ["op"],
            registry=self.registry,
        )
        self.socket_seconds = Histogram(
            "medic_socket_request_duration_seconds",
            "Time to answer one socket request.",
            ["op"],
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
            registry=self.registry,
        )

    def observe_report(self, report: RunReport) -> None:
        for outcome in report.outcomes:
            self.runs.labels(outcome.name, outcome.state.value).inc()
            self.duration.labels(outcome.name).observe(outcome.seconds)
            status = worst([r.status for r in outcome.results])
            self.check_status.labels(outcome.name).set(STATUS_CODES[status])
            if outcome.name == "gpu_count":
                counts = [r.evidence.get("count") for r in outcome.results]
                count = next((c for c in counts if isinstance(c, int)), None)
                if count is not None:
                    self.gpus.set(count)

    def observe_current(self, results: list[Result]) -> None:
        self.node_status.set(STATUS_CODES[worst([r.status for r in results])])
        self.faults.clear()
        for r in results:
            if r.status in (Status.WARN, Status.CRITICAL, Status.UNKNOWN):
                self.faults.labels(r.status.value, r.fault_class or "").inc()

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()

    def serve(self, address: str, port: int) -> MetricsServer:
        """The Prometheus endpoint on address:port in its own threads, bounded (see
        BoundedServerMixIn): idle or slow clients cannot exhaust the daemon's threads."""
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsServer", (MetricsServer,), {"address_family": family})
        server: MetricsServer = server_class((address, port), _QuietHandler)
        server.set_app(make_wsgi_app(self.registry))
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server


class BoundedServerMixIn(socketserver.ThreadingMixIn):
    """A thread per connection, but at most `max_connections` at once: when full, the
    connection that has waited longest without sending its request is cut to make room,
    and if none is idle the new one is sent `busy_reply` (best effort, never blocking) and
    closed. Each connection's socket times out after `idle_seconds` without progress, and
    is shut down `deadline` seconds after it was accepted unless the handler calls
    `request_read(sock)` first (the Unix socket does once it has the request line: a launch
    check may then legitimately take long). One reaper thread enforces the deadlines, so a
    client dripping a byte at a time cannot hold a slot. Check scheduling never runs in
    these threads."""

    daemon_threads = True
    block_on_close = False  # never wait for a stuck client when closing
    request_queue_size = 128
    max_connections = 16
    idle_seconds = 5.0
    deadline = 10.0
    busy_reply = b""

    def _bounds(self) -> tuple[threading.BoundedSemaphore, threading.Condition]:
        state = vars(self)
        if "_slots" not in state:
            state["_slots"] = threading.BoundedSemaphore(self.max_connections)
            state["_deadlines"] = {}
            state["_cond"] = threading.Condition()
            state["rejected"] = 0
            state["evicted"] = 0
            state["_active"] = 0
            threading.Thread(target=self._reap, name="conn-reaper", daemon=True).start()
        return state["_slots"], state["_cond"]

    def process_request(self, request: Any, client_address: Any) -> None:
        slots, cond = self._bounds()
        if not slots.acquire(blocking=False) and not (
            self._evict_oldest_unread() and slots.acquire(timeout=EVICT_WAIT_SECONDS)
        ):
            vars(self)["rejected"] += 1
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(self.busy_reply)
            self.shutdown_request(request)
            return
        with cond:
            vars(self)["_active"] += 1
        try:
            request.settimeout(self.idle_seconds)
            with cond:
                vars(self)["_deadlines"][request] = time.monotonic() + self.deadline
                cond.notify()
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: Any) -> None:
        slots, cond = self._bounds()
        with cond:
            vars(self)["_deadlines"].pop(request, None)
            vars(self)["_active"] -= 1
        slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or timed out: one line, not socketserver's traceback."""
        error = sys.exc_info()[1]
        log.info("%s: connection dropped: %s", type(self).__name__, error or "unknown error")

    if TYPE_CHECKING:

        def shutdown_request(self, request: Any) -> None: ...

    def _evict_oldest_unread(self) -> bool:
        """Full: cut the connection that has waited longest without sending its request (an
        idle one, by definition), so a flood of idle connections cannot lock out a client
        that speaks at once. A connection whose request is in is never cut."""
        _, cond = self._bounds()
        with cond:
            deadlines: dict[Any, float] = vars(self)["_deadlines"]
            if not deadlines:
                return False
            oldest = min(deadlines, key=deadlines.__getitem__)
            del deadlines[oldest]
            vars(self)["evicted"] += 1
        with contextlib.suppress(OSError):
            oldest.shutdown(socket.SHUT_RDWR)  # its handler returns and frees the slot
        return True

    def request_read(self, request: Any) -> None:
        """The request is in: no deadline on this connection from now on."""
        _, cond = self._bounds()
        with cond:
            vars(self)["_deadlines"].pop(request, None)

    @property
    def active(self) -> int:
        """Connections being handled now."""
        _, cond = self._bounds()
        with cond:
            return int(vars(self)["_active"])

    def _reap(self) -> None:
        cond = vars(self)["_cond"]
        deadlines: dict[Any, float] = vars(self)["_deadlines"]
        with cond:
            while True:
                now = time.monotonic()
                for sock in [s for s, d in deadlines.items() if d <= now]:
                    del deadlines[sock]
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)  # unblocks the handler's read
                soonest = min(deadlines.values(), default=None)
                cond.wait(None if soonest is None else max(0.01, soonest - now))


class MetricsServer(BoundedServerMixIn, WSGIServer):
    max_connections = METRICS_MAX_CONNECTIONS
    idle_seconds = METRICS_IDLE_SECONDS
    deadline = METRICS_DEADLINE
    busy_reply = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n\r\n"


class _QuietHandler(WSGIRequestHandler):
    timeout = METRICS_IDLE_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        pass

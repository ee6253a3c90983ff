"""Prometheus metrics of the node daemon, named `medic_<subsystem>_<what>_<unit>`.

One registry per daemon (not the process-global default), so tests can run several
daemons in one process and the exposition holds nothing but Medic's own series, the
process's (`process_*`, `python_info`) and `medic_build_info`.

Counters and histograms are updated as checks run; they are exported without their
`_created` series (a second series per counter that Prometheus does not need). What
describes the node now (its status, faults, GPUs, episodes, RMA tickets, Slurm's view) is
built at scrape time by `healthd.node_metrics` from the daemon's last recorded check round
(`observe_round`), its memory and one store read with a deadline, so a scrape never sees a
gauge half cleared and refilled, and never hangs on a store that does not answer.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from healthd.checks.base import worst
from healthd.node_metrics import STATUS_CODES, NodeCollector, RoundSource
from healthd.runner import RunReport

log = logging.getLogger("medic.healthd")

# The metrics endpoint: a scrape is one short request. At most this many at once, each
# closed when it sends nothing for METRICS_IDLE_SECONDS or is not done in METRICS_DEADLINE.
METRICS_MAX_CONNECTIONS = 16
METRICS_IDLE_SECONDS = 3.0
METRICS_DEADLINE = 10.0

# A full server cuts its oldest idle connection and waits this long for the slot it frees.
EVICT_WAIT_SECONDS = 1.0

# Few buckets: every check is a label value, and each bucket is one more series per check
# (11 buckets over 17 checks were 255 of a GPU node's 310 samples). They answer "how many
# runs of this check took over 0.1 s, 1 s, 10 s"; _sum / _count give the mean.
CHECK_DURATION_BUCKETS = (0.1, 1.0, 10.0)
SOCKET_DURATION_BUCKETS = (0.01, 0.1, 1.0, 10.0)


def medic_version() -> str:
    try:
        return metadata.version("slurm-medic")
    except metadata.PackageNotFoundError:
        return "unknown"


class _WithoutCreated(Collector):
    """The families of `inner` without their `_created` samples (prometheus_client's
    `disable_created_metrics()` does this for the whole process; this is per registry)."""

    def __init__(self, inner: CollectorRegistry) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Metric]:
        for family in self.inner.collect():
            created = f"{family.name}_created"
            family.samples = [s for s in family.samples if s.name != created]
            yield family


class DaemonMetrics:
    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry()
        self.node = node
        self.version = medic_version()
        self.now = NodeCollector(node, self.version)  # the node's state, built at each scrape
        instruments = CollectorRegistry()
        self.runs = Counter(
            "medic_check_runs_total",
            "Check runs by outcome (done, error, timeout, hung, unavailable).",
            ["check", "outcome"],
            registry=instruments,
        )
        self.duration = Histogram(
            "medic_check_duration_seconds",
            "Wall time of one check run.",
            ["check"],
            buckets=CHECK_DURATION_BUCKETS,
            registry=instruments,
        )
        self.check_status = Gauge(
            "medic_check_status_code",
            "Worst status of a check's last run: -1 n/a, 0 OK, 1 WARN, 2 UNKNOWN, 3 CRITICAL.",
            ["check"],
            registry=instruments,
        )
        self.gpus = Gauge(
            "medic_gpu_devices", "GPUs NVML lists on this node.", registry=instruments
        )
        self.gpu_events = Counter(
            "medic_gpu_events_total",
            "NVML events received by the listener (xid, ecc_dbe, ecc_sbe, gpu_lost, error).",
            ["kind", "gpu"],
            registry=instruments,
        )
        self.socket_requests = Counter(
            "medic_socket_requests_total",
            "Requests on the local socket by operation.",
            ["op"],
            registry=instruments,
        )
        self.socket_seconds = Histogram(
            "medic_socket_request_duration_seconds",
            "Time to answer one socket request.",
            ["op"],
            buckets=SOCKET_DURATION_BUCKETS,
            registry=instruments,
        )
        self.registry.register(_WithoutCreated(instruments))
        self.registry.register(self.now)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

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

    def observe_round(self, source: RoundSource) -> None:
        """A check round is recorded: keep its results (the daemon calls this holding the
        lock its results are written under) and the daemon, for the scrapes to come."""
        self.now.observe_round(source)

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

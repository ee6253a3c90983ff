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
import os
import queue
import selectors
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


class BoundedServerMixIn(socketserver.BaseServer):
    """A server whose connections are served by a few persistent worker threads, at most
    `max_connections` connections at once: when full, the connection that has waited longest
    without sending its request is cut to make room, and if none is idle the new one is sent
    `busy_reply` (best effort, never blocking) and closed. Each connection's socket times out
    after `idle_seconds` without progress, and is shut down `deadline` seconds after it was
    accepted unless the handler calls `request_read(sock)` first (the Unix socket does once it
    has the request line: a launch check may then legitimately take long), so a client
    dripping a byte at a time cannot hold a slot. Check scheduling never runs in these threads.

    Nothing here wakes on a timer when nothing happens (issue 15: the daemon's idle CPU). The
    accepting thread (`serve_forever`) sleeps in poll() with no timeout, woken by a client, by
    `shutdown()` (a byte on a pipe of its own, so the stop is immediate), or by the deadline of
    a connection still waiting for its request: it cuts those itself, no reaper thread. A
    connection is handed to an idle worker; a new worker is started only when none is idle, so
    there are never more workers than `max_connections`, and they wait for their next
    connection on a queue (which costs nothing) instead of a thread being started for each.
    A handler's exception ends its connection, never its worker."""

    request_queue_size = 128
    max_connections = 16
    idle_seconds = 5.0
    deadline = 10.0
    busy_reply = b""
    worker_name = "conn"  # the workers' thread name
    # What serve_forever sleeps in (tests record its timeouts through a subclass).
    selector_class: type[selectors.BaseSelector] = selectors.PollSelector

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._cond = threading.Condition()  # guards the counts and the deadlines below
        self._active = 0  # connections accepted and not yet closed: at most max_connections
        self._idle = 0  # workers waiting on the queue with no connection promised to them
        self._workers = 0
        self._queue: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._deadlines: dict[Any, float] = {}  # the connections whose request is not in yet
        self.rejected = 0
        self.evicted = 0
        self._stop = False
        self._stopped = threading.Event()
        self._stopped.set()  # not serving
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Last: a bind that fails calls server_close, which needs the above.
        super().__init__(*args, **kwargs)

    if TYPE_CHECKING:

        def fileno(self) -> int: ...

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept connections until `shutdown()`. `poll_interval` is ignored: the loop sleeps
        until something happens (see the class)."""
        self._stopped.clear()
        try:
            with self.selector_class() as selector:
                selector.register(self.fileno(), selectors.EVENT_READ, "accept")
                selector.register(self._wake_r, selectors.EVENT_READ, "wake")
                while not self._stop:
                    ready = selector.select(self._reap())
                    if self._stop:
                        break
                    for key, _ in ready:
                        if key.data == "accept":
                            self._accept()
                        else:  # shutdown() wrote a byte (and _stop is set): drain it
                            with contextlib.suppress(OSError):
                                os.read(self._wake_r, 512)
                    self.service_actions()
        finally:
            self._stop = False
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait until it has returned: at once, not at a poll's end.
        (Called before `serve_forever` started, it returns and that loop exits at once.)"""
        self._stop = True
        with contextlib.suppress(OSError):  # a full pipe has woken the loop already
            os.write(self._wake_w, b"\0")
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        with self._cond:
            workers, self._workers, self._idle = self._workers, 0, 0
        for _ in range(workers):  # each exits when it takes this (after its connection)
            self._queue.put(None)
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _accept(self) -> None:
        try:
            request, client_address = self.get_request()
        except OSError:
            return
        if not self.verify_request(request, client_address):
            self.shutdown_request(request)
            return
        try:
            self.process_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        cond, full = self._cond, self.max_connections
        with cond:
            if self._active >= full and self._evict_oldest_unread():
                cond.wait_for(lambda: self._active < full, timeout=EVICT_WAIT_SECONDS)
            room = self._active < full
            if room:
                self._active += 1
                self._deadlines[request] = time.monotonic() + self.deadline
                start = self._idle == 0  # no worker free: one more (never over `full`)
                if start:
                    self._workers += 1
                else:
                    self._idle -= 1  # promised to this connection
        if not room:
            self.rejected += 1
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(self.busy_reply)
            self.shutdown_request(request)
            return
        try:
            request.settimeout(self.idle_seconds)
            if start:
                name = self.worker_name
                threading.Thread(target=self._work, name=name, daemon=True).start()
        except BaseException:
            with cond:
                self._deadlines.pop(request, None)
                self._active -= 1
                if start:
                    self._workers -= 1
                else:
                    self._idle += 1
                cond.notify()
            raise
        self._queue.put((request, client_address))

    def _work(self) -> None:
        """A worker: one connection after another, until the server is closed."""
        while (item := self._queue.get()) is not None:
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except BaseException:  # the handler's error ends its connection, not this worker
                self.handle_error(request, client_address)
            finally:
                try:
                    self.shutdown_request(request)
                finally:
                    with self._cond:  # idle again before the slot frees: never over the bound
                        self._deadlines.pop(request, None)
                        self._active -= 1
                        self._idle += 1
                        self._cond.notify()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or timed out: one line, not socketserver's traceback; a
        handler's own bug: logged whole (its worker goes on)."""
        error = sys.exc_info()[1]
        if error is None or isinstance(error, OSError):
            log.info("%s: connection dropped: %s", type(self).__name__, error or "unknown error")
        else:
            log.error("%s: handler failed", type(self).__name__, exc_info=error)

    def _evict_oldest_unread(self) -> bool:
        """Full: cut the connection that has waited longest without sending its request (an
        idle one, by definition), so a flood of idle connections cannot lock out a client
        that speaks at once. A connection whose request is in is never cut. Holds _cond."""
        deadlines = self._deadlines
        if not deadlines:
            return False
        oldest = min(deadlines, key=deadlines.__getitem__)
        del deadlines[oldest]
        self.evicted += 1
        with contextlib.suppress(OSError):
            oldest.shutdown(socket.SHUT_RDWR)  # its handler returns and frees the slot
        return True

    def request_read(self, request: Any) -> None:
        """The request is in: no deadline on this connection from now on."""
        with self._cond:
            self._deadlines.pop(request, None)

    @property
    def active(self) -> int:
        """Connections being handled now."""
        with self._cond:
            return self._active

    @property
    def workers(self) -> int:
        """Worker threads started (each kept, waiting, for the next connection)."""
        with self._cond:
            return self._workers

    def _reap(self) -> float | None:
        """Cut the connections past their deadline without a request; the seconds until the
        next deadline, or None when no connection waits for its request (nothing to wake
        up for)."""
        with self._cond:
            deadlines = self._deadlines
            if not deadlines:
                return None
            now = time.monotonic()
            for sock in [s for s, d in deadlines.items() if d <= now]:
                del deadlines[sock]
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # unblocks the handler's read
            soonest = min(deadlines.values(), default=None)
        return None if soonest is None else max(0.0, soonest - now)


class MetricsServer(BoundedServerMixIn, WSGIServer):
    max_connections = METRICS_MAX_CONNECTIONS
    idle_seconds = METRICS_IDLE_SECONDS
    deadline = METRICS_DEADLINE
    busy_reply = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n\r\n"
    worker_name = "metrics-conn"


class _QuietHandler(WSGIRequestHandler):
    timeout = METRICS_IDLE_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        pass

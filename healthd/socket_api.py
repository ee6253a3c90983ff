"""The daemon's local socket: one JSON line in, one JSON line out, for the Slurm hooks, the
health check and the CLI (docs/operator-guide.md, "The local socket", lists the ops).

`SocketApi.handle` answers one request; `SocketApi.serve` listens on a Unix socket with a
bound of its own (a few connections at a time, a deadline for the request line) and hands
each request to `handle` on one of its worker threads (healthd.metrics.BoundedServerMixIn).
The launch gate answers the hooks' ops; the daemon (`SocketHost`) answers the rest.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import socket
import socketserver
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from healthd.checks.base import Result, Tier, worst
from healthd.launch_gate import LaunchGate
from healthd.metrics import BoundedServerMixIn, DaemonMetrics
from healthd.results import result_json
from healthd.runner import Runner, RunReport
from healthd.socket_matrix import MATRIX, ROOT_PEER, Caller, Peer, caller_of, refusal
from medic_core.hygiene_settings import hygiene_on
from medic_core.settings import DaemonSettings
from medic_core.store import Store
from remediation.episodes import EpisodeStore

log = logging.getLogger("medic.healthd")

SOCKET_OPS = tuple(MATRIX)
# Ops only root may send (healthd.socket_matrix has every op's callers and fields): "check"
# runs any check the caller names, the deep tier included (an hour of GPU burn-in).
ROOT_ONLY_OPS = frozenset(
    op for op, e in MATRIX.items() if all(g.callers == {Caller.ROOT} for g in e.grants)
)
# Hooks, the health check and the CLI: a few at a time. A client must send its request line
# within SOCKET_IDLE seconds of connecting (then the op may take as long as it needs); one
# more than SOCKET_MAX is told "busy" and closed.
SOCKET_MAX, SOCKET_IDLE = 64, 5.0
# The epilog's job_end is answered at once and its post-job checks queued for one worker
# thread (they go through the runner one run at a time anyway); a job already queued is not
# queued twice, and one more than JOB_END_QUEUE is told "busy". 400 epilogs at once once
# started 400 threads, 66 of them refused under the unit's TasksMax=256.
JOB_END_QUEUE = 512


def peer_of(connection: socket.socket) -> Peer:
    """The connecting process as the kernel tells it (SO_PEERCRED), not from anything it
    says; pid, uid and gid -1 (no rights beyond `anyone`'s) if the kernel does not tell."""
    try:
        raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return Peer(-1, -1, -1)
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(int(pid), int(uid), int(gid))


class AfterJobQueue:
    """The post-job checks of ended jobs, run one job after another by one worker thread,
    started when a job is queued and gone when the queue is empty (no thread while idle)."""

    def __init__(self, run: Callable[[str], object], limit: int = JOB_END_QUEUE) -> None:
        self._run, self.limit = run, limit
        self._lock = threading.Lock()
        self._jobs: deque[str] = deque()
        self._working = False

    def submit(self, job_id: str) -> bool:
        """Queue `job_id` (once): False when the queue is full or no thread can start."""
        with self._lock:
            if job_id in self._jobs:
                return True
            if len(self._jobs) >= self.limit:
                return False
            self._jobs.append(job_id)
            start, self._working = not self._working, True
        if start:
            try:
                threading.Thread(target=self._work, name="after-job", daemon=True).start()
            except RuntimeError:  # no thread to be had (TasksMax): busy, not an error
                with self._lock:
                    self._working = False
                    self._jobs.remove(job_id)
                return False
        return True

    def pending(self) -> int:
        with self._lock:
            return len(self._jobs) + self._working

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._working = False
                    return
                job_id = self._jobs.popleft()
            try:
                self._run(job_id)
            except Exception:  # after_job logs its own; this worker goes on regardless
                log.exception("post-job checks for job %s failed", job_id)


class SocketHost(Protocol):
    """What the socket needs of the daemon: its current results, a way to run checks, and
    where to count requests."""

    @property
    def node(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def settings(self) -> DaemonSettings: ...

    @property
    def metrics(self) -> DaemonMetrics: ...

    @property
    def checks(self) -> Runner: ...

    def current(self) -> list[Result]: ...

    def run_checks(
        self,
        names: Iterable[str] | None = None,
        *,
        tier: Tier | None = None,
        budget: float | None = None,
        wait: float | None = None,
    ) -> RunReport: ...


class SocketApi:
    def __init__(
        self, host: SocketHost, gate: LaunchGate, episodes: EpisodeStore | None = None
    ) -> None:
        self.host = host
        self.gate = gate
        self.episodes = episodes  # the remediation episodes, for "status"
        self.after_jobs = AfterJobQueue(gate.after_job)
        self.socket_gid: int | None = None  # the socket group's, once serve() has shared it

    def handle(self, request: Mapping[str, Any], peer: Peer = ROOT_PEER) -> dict[str, Any]:
        """The reply to one request from `peer` (SO_PEERCRED): refused in one line unless
        the matrix (healthd.socket_matrix) grants the op, its fields and their values."""
        host = self.host
        op = request.get("op")
        caller = caller_of(peer, self.socket_gid)
        why = refusal(op, request, peer, caller)
        if why:
            if isinstance(op, str) and op in MATRIX:
                log.warning("socket: %s refused to uid %d (%s): %s", op, peer.uid, caller, why)
            return {"error": why}
        if op == "ping":  # `ready`: its watchers and ladder started (HealthDaemon.ready)
            return {"node": host.node, "pid": os.getpid(), "ready": getattr(host, "ready", True)}
        if op == "status":
            results = host.current()
            reply: dict[str, Any] = {
                "node": host.node,
                "status": worst([r.status for r in results]).value,
                "rma_open": [],
                "remediation_episode": None,
                "hung": {k: v.isoformat() for k, v in host.checks.hung().items()},
                "results": [result_json(r) for r in results],
            }
            try:  # from the store: the rest is the daemon's memory, answered whatever it does
                from remediation.tickets import read_rails

                rails = read_rails(host.store, host.node)  # one snapshot of both
                episode = rails.episode if self.episodes else None
                reply["rma_open"] = rails.open_tickets
            except Exception as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                reply["store"] = f"unavailable: {first[:200]}"
                return reply
            if episode is not None:
                reply["remediation_episode"] = {
                    "id": episode.id,
                    "state": episode.state,
                    "rung": episode.rung,
                }
            return reply
        if op == "adopt":  # Slurm's own drain seen by the health check: the ladder decides
            ladder = getattr(host, "ladder", None)
            said = ladder.adopt() if ladder is not None else "not adopted: no ladder here"
            return {"node": host.node, "adopt": said}
        if op == "event":  # the hooks' records (gate decisions, job summaries) go through us
            return self.gate.record_hook_event(request)
        if op == "job_summary":
            return self.gate.job_summary(
                request["job_id"],
                min(float(request.get("budget", 10.0)), host.settings.launch_budget),
            )
        if op == "metrics":  # the Prometheus exposition, for nodes without the HTTP port
            return {"node": host.node, "text": host.metrics.exposition()}
        if op == "launch":  # "budget": what is left of the prolog's one deadline
            configured = self.gate.launch_budget()
            budget = min(float(request.get("budget", configured)), configured)
            job_id = request.get("job_id")
            return self.gate.launch(
                max(0.0, budget),
                fresh_only=bool(request.get("fresh_only")),
                job_id=None if job_id is None else str(job_id),
                partition=str(request.get("partition", "")),
                account=str(request.get("account", "")),
            )
        if op == "job_end":  # the epilog: answered at once, judged in the background
            job_id = request["job_id"]
            if not self.after_jobs.submit(job_id):
                log.warning("socket: job_end for job %s: the post-job queue is full", job_id)
                return {"error": f"busy: {self.after_jobs.limit} ended jobs wait for checks"}
            # "hygiene": the compiled front then execs `medic-epilog --hygiene`.
            return {"node": host.node, "job_id": job_id, "queued": True,
                    "hygiene": hygiene_on(self.gate.host.config)}  # fmt: skip
        if op == "check":
            tier = Tier(request["tier"]) if request.get("tier") else None
            names = request.get("checks")
            limit = request.get("budget")
            report = host.run_checks(
                names, tier=tier, budget=None if limit is None else float(limit)
            )
            return {
                "node": host.node,
                "tier": tier.value if tier else None,
                "status": worst([r.status for r in report.results]).value,
                "seconds": round(report.seconds, 3),
                "results": [result_json(r) for r in report.results],
            }
        raise AssertionError(f"op {op!r} is in the matrix but not answered")  # test_socket_matrix

    def reply(self, line: bytes, peer: Peer) -> tuple[str, bytes]:
        """(the op, for the metrics' label: one of the matrix's or "invalid"; the reply line
        without its newline) for one request line from `peer`. Whatever the line holds, the
        reply is one JSON object; an error is one line of text, never a traceback."""
        op = "invalid"
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is one JSON object on one line")
            if isinstance(request.get("op"), str) and request["op"] in MATRIX:
                op = request["op"]
            reply = self.handle(request, peer)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            # A bad request (JSON, a field of the wrong type or value): one line in the log
            # and the reply, no traceback, nothing of the daemon's insides.
            why = " ".join(str(exc).split())[:200] or type(exc).__name__
            log.warning("socket: bad %s request: %s", op, why)
            reply = {"error": f"bad request: {why}"}
        except Exception:  # a bug of ours: logged whole; the daemon goes on
            log.exception("socket: %s request failed", op)
            reply = {"error": f"{op}: internal error in medic-healthd (see its log)"}
        return op, json.dumps(reply).encode()

    def serve(self, socket_path: Path) -> socketserver.UnixStreamServer:
        """Listen on `socket_path` (root plus `socket_group` only) on a thread of its own."""
        api, metrics = self, self.host.metrics

        class Handler(socketserver.StreamRequestHandler):
            timeout = SOCKET_IDLE  # per read or write; the request line also has a deadline
            op = "invalid"  # the request's op, for the metrics

            def handle(self) -> None:
                begin = time.monotonic()
                try:
                    line = self.rfile.readline(1 << 20)
                except OSError:  # idle past SOCKET_IDLE, or cut off at the deadline
                    return
                server.request_read(self.request)  # in: the op may now take its time
                if not line:  # connected and closed without a word
                    return
                # The gate's records are written once the reply is out (gate_recorder).
                with api.gate.recorder.after_reply():
                    self.op, reply = api.reply(line, peer_of(self.request))
                    self.wfile.write(reply + b"\n")
                metrics.socket_requests.labels(self.op).inc()
                metrics.socket_seconds.labels(self.op).observe(time.monotonic() - begin)

        class Server(BoundedServerMixIn, socketserver.UnixStreamServer):
            # Its own bound, apart from the metrics endpoint's: a flood there never
            # reaches the hooks' socket.
            max_connections = SOCKET_MAX
            idle_seconds = SOCKET_IDLE
            deadline = SOCKET_IDLE
            worker_name = "socket-conn"
            busy_reply = b'{"error": "busy: too many connections to medic-healthd"}\n'

        socket_path.parent.mkdir(parents=True, exist_ok=True)
        socket_path.unlink(missing_ok=True)
        old_umask = os.umask(0o177)  # no window in which the socket is open to everyone
        try:
            server = Server(str(socket_path), Handler)
        finally:
            os.umask(old_umask)
        self._share_socket(socket_path)
        threading.Thread(target=server.serve_forever, name="socket", daemon=True).start()
        return server

    def _share_socket(self, socket_path: Path) -> None:
        """root plus SlurmUser's group (the prolog runs as SlurmdUser, the healthcheck as
        root): mode 0660 with that group, else 0600."""
        group = self.host.settings.socket_group
        if not group:
            return
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            log.warning(
                "socket_group %r does not exist: socket %s is root-only", group, socket_path
            )
            return
        try:
            os.chown(socket_path, -1, gid)
            os.chmod(socket_path, 0o660)
            self.socket_gid = gid
        except OSError as exc:  # e.g. a sandbox without CAP_CHOWN
            log.error(
                "socket %s stays root-only: cannot give it to group %r: %s", socket_path, group, exc
            )

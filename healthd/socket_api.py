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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from healthd.checks.base import Result, Tier, worst
from healthd.launch_gate import LaunchGate
from healthd.metrics import BoundedServerMixIn, DaemonMetrics
from healthd.results import result_json
from healthd.runner import Runner, RunReport
from medic_core.settings import DaemonSettings
from medic_core.store import Store
from remediation.episodes import EpisodeStore

log = logging.getLogger("medic.healthd")

SOCKET_OPS = ("ping", "status", "launch", "check", "job_end", "job_summary", "event", "metrics")
# Who may ask what. root: every op. Anyone else the socket lets in (socket_group: SlurmdUser's
# group, for hooks slurmd does not run as root): what the hooks send. "check" runs any check
# the caller names, the deep tier included (an hour of GPU burn-in): root only.
ROOT_ONLY_OPS = frozenset({"check"})
# Hooks, the health check and the CLI: a few at a time. A client must send its request line
# within SOCKET_IDLE seconds of connecting (then the op may take as long as it needs); one
# more than SOCKET_MAX is told "busy" and closed.
SOCKET_MAX, SOCKET_IDLE = 64, 5.0


def peer_uid(connection: socket.socket) -> int:
    """The connecting process's user id, from the kernel (SO_PEERCRED), not from anything
    it says; -1 (no rights beyond the socket's) if the kernel does not tell."""
    try:
        raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return -1
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


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

    def handle(self, request: Mapping[str, Any], uid: int = 0) -> dict[str, Any]:
        """The reply to one request from a peer with user id `uid` (SO_PEERCRED)."""
        host = self.host
        op = request.get("op")
        if op in ROOT_ONLY_OPS and uid != 0:
            log.warning("socket: %s refused to uid %d (root only)", op, uid)
            return {"error": f"{op}: permission denied for uid {uid}: root only"}
        if op == "ping":
            return {"node": host.node, "pid": os.getpid()}
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
        if op == "event":  # the hooks' records (gate decisions, job summaries) go through us
            return self.gate.record_hook_event(request)
        if op == "job_summary":
            return self.gate.job_summary(
                str(request.get("job_id", "")),
                [str(c) for c in request.get("checks", [])],
                min(float(request.get("budget", 10.0)), host.settings.launch_budget),
            )
        if op == "metrics":  # the Prometheus exposition, for nodes without the HTTP port
            return {"node": host.node, "text": host.metrics.exposition()}
        if op == "launch":  # "budget": what is left of the prolog's one deadline
            configured = self.gate.launch_budget()
            try:
                budget = min(float(request.get("budget", configured)), configured)
            except (TypeError, ValueError):
                return {"error": f"launch: budget {request.get('budget')!r} is not a number"}
            job_id = request.get("job_id")
            return self.gate.launch(
                max(0.0, budget),
                fresh_only=bool(request.get("fresh_only")),
                job_id=None if job_id is None else str(job_id),
            )
        if op == "job_end":  # the epilog: answered at once, judged in the background
            job_id = str(request.get("job_id", ""))
            threading.Thread(target=self.gate.after_job, args=(job_id,), daemon=True).start()
            return {"node": host.node, "job_id": job_id, "queued": True}
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
        return {"error": f"unknown op {op!r}: use one of {', '.join(SOCKET_OPS)}"}

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
                    self.wfile.write(self.reply_to(line) + b"\n")
                metrics.socket_requests.labels(self.op).inc()
                metrics.socket_seconds.labels(self.op).observe(time.monotonic() - begin)

            def reply_to(self, line: bytes) -> bytes:
                try:
                    request = json.loads(line)
                    if not isinstance(request, dict):
                        raise ValueError("a request is one JSON object on one line")
                    self.op = str(request.get("op"))[:40]
                    reply = api.handle(request, peer_uid(self.request))
                except (ValueError, TypeError, KeyError, RecursionError) as exc:
                    # A bad request (JSON, a field of the wrong type or value): one line in
                    # the log and the reply, no traceback, nothing of the daemon's insides.
                    why = " ".join(str(exc).split())[:200] or type(exc).__name__
                    log.warning("socket: bad %s request: %s", self.op, why)
                    reply = {"error": f"bad request: {why}"}
                except Exception:  # a bug of ours: logged whole; the daemon goes on
                    log.exception("socket: %s request failed", self.op)
                    reply = {"error": f"{self.op}: internal error in medic-healthd (see its log)"}
                return json.dumps(reply).encode()

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
        except OSError as exc:  # e.g. a sandbox without CAP_CHOWN
            log.error(
                "socket %s stays root-only: cannot give it to group %r: %s", socket_path, group, exc
            )

"""The store at fleet scale: N simulated node daemons against one real PostgreSQL.

Each simulated daemon drives the real store code through its own `Store` (its own engine and
pool, made by `open_store` as `medic-healthd` makes it), on two chains that run concurrently
as the daemon's two threads do:

- start-up: `open_store` (the schema check), the node's conditions read (`conditions(node)`),
  then every check's first write;
- the scheduler chain: every check's conditions rewritten through `set_conditions(node, ...)`
  once per REFRESH (300 s: the daemon rewrites an unchanged condition only that often; 600 s
  for gpu.driver), 76 conditions per node in 20 checks (12 node-wide, 8 GPU checks x 8 GPUs,
  as bench/cli_nodes.py); one event (`add_event`) per node every EVENT_EVERY (600 s); a
  `prune` every 3600 s. A write that fails is kept and written at the next round (the
  daemon's unsynced conditions and its journal), so nothing should be lost;
- the ladder chain, every 2 s as the ladder thread: `EpisodeStore.open_for(node)`,
  `tickets.open_tickets`, `tickets.needs_requalification`, then the webhook outbox: with
  `--outbox poll` every daemon reads the due rows (`due_rows`, as before the election);
  with `--outbox elect` only the elected sender does (`SenderElection`, the real code).

`--scale S` stretches every period (and the election's) S times: the fleet is time-scaled and
the rates a real fleet offers are the measured ones times S (said in the output). A daemon
whose store cannot be opened is started again 5 s later (systemd's RestartSec).

Measured: client backends on the server (pg_stat_activity, sampled each second), statements/s
and writes/s, client-side p50/p99 statement latency (cursor execute, from SQLAlchemy events)
and p50/p99 of whole store calls (pool checkout and commit included), errors by kind; with
`--restart-at T` PostgreSQL is stopped (fast shutdown) T seconds into the measurement and
started again `--down` seconds later: errors seen, seconds from "back" until no daemon call
fails and until a webhook sender holds the lock again, and whether anything was lost (every
node's 76 conditions and every event the daemons wrote are in the store at the end).

Prints one JSON object. Run:
  .venv/bin/python -m bench.fleet_store --daemons 1000 --scale 5 --seconds 60 [--restart-at 20]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import heapq
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event, make_url
from sqlalchemy.pool import QueuePool

from medic_core.proc import spawn
from medic_core.store import ConditionUpdate, Status, Store, open_store
from remediation import tickets
from remediation.episodes import EpisodeStore
from remediation.webhook import SENDER_LOCK_KEY, SenderElection, due_rows

GPUS = 8
NODE_CHECKS = {
    "cpus": [""],
    "memory": [""],
    "filesystems": ["/", "/scratch"],
    "ib.port": ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"],
    "kernel_log": [""],
    "services": [""],
    "gpu.count": [""],
    "gpu.driver": [""],
}
GPU_CHECKS = [
    "gpu.xid", "gpu.ecc", "gpu.remapped_rows", "gpu.retired_pages", "gpu.nvlink",
    "gpu.pcie", "gpu.thermal", "gpu.persistence",
]  # fmt: skip
CHECKS: dict[str, list[str]] = {
    **NODE_CHECKS,
    **{name: [str(g) for g in range(GPUS)] for name in GPU_CHECKS},
}
CONDITIONS_PER_NODE = sum(len(t) for t in CHECKS.values())  # 76
REFRESH = 300.0
SLOW_REFRESH = {"gpu.driver": 600.0}
LADDER_EVERY = 2.0
EVENT_EVERY = 600.0
PRUNE_EVERY = 3600.0
RESTART_SEC = 5.0  # systemd's RestartSec for a daemon that could not open its store
WRITE_VERBS = ("INSERT", "UPDATE", "DELETE")


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


def first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    line = text[0] if text else ""
    # One kind per cause: drop what differs between occurrences (pids, paths).
    for marker in ('connection to server on socket "', "connection to server at "):
        if marker in line:
            line = line.split(marker)[0] + "connection to server ...: " + line.rsplit(": ", 1)[-1]
    return f"{type(exc).__name__}: {line[:160]}"


@dataclass
class Stats:
    """One worker's measurements (sent to the parent as plain data)."""

    stmt: list[tuple[float, float, bool]] = field(default_factory=list)  # end, secs, write
    calls: list[tuple[float, float, str]] = field(default_factory=list)  # end, secs, what
    errors: list[tuple[float, str, str]] = field(default_factory=list)  # at, what, first line
    checkouts: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class SimDaemon:
    def __init__(self, index: int, url: str, cfg: dict[str, Any], stats: Stats) -> None:
        self.index = index
        self.node = node_name(index)
        self.url = url
        self.cfg = cfg
        self.stats = stats
        self.store: Store | None = None
        self.episodes: EpisodeStore | None = None
        self.election: SenderElection | None = None
        self.rng = random.Random(index)
        self.next_write: dict[str, float] = {}
        self.next_event = 0.0
        self.next_prune = 0.0
        self.unsynced: dict[tuple[str, str], ConditionUpdate] = {}
        self.journal: list[dict[str, Any]] = []
        self.events_written = 0
        self.written: set[tuple[str, str]] = set()  # conditions the store took
        self.events_made = 0
        self.starts_failed = 0
        self.first_round = True

    # -- what the daemon does -------------------------------------------------------------

    def start(self, now: float) -> bool:
        t0 = time.monotonic()
        try:
            store = open_store(self.url, **self.cfg.get("open_args", {}))
        except Exception as exc:
            self.starts_failed += 1
            self._error("start", exc)
            return False
        self._listen(store)
        self.store = store
        self.episodes = EpisodeStore(store)
        scale = self.cfg["scale"]
        self.election = SenderElection(store, period=self.cfg["election_period"])
        try:
            store.conditions(self.node)
        except Exception as exc:
            self._error("start.conditions", exc)
        self._call("start", t0)
        for name in CHECKS:  # everything is due at start
            self.next_write[name] = now
        if self.cfg["steady"]:  # a fleet that has run a while: refreshes spread out
            for name in CHECKS:
                self.next_write[name] = now + self.rng.random() * REFRESH * scale
        self.first_round = not self.cfg["steady"]
        self.next_event = now + self.rng.uniform(0, EVENT_EVERY * scale)
        self.next_prune = now + self.rng.uniform(0, PRUNE_EVERY * scale)
        return True

    def ladder_tick(self) -> None:
        assert self.store is not None and self.episodes is not None and self.election
        t0 = time.monotonic()
        try:
            self.episodes.open_for(self.node)
            tickets.open_tickets(self.store, self.node)
            tickets.needs_requalification(self.store, self.node)
            if self.cfg["outbox"] == "poll" or self.election.is_sender():
                due_rows(self.store, dt.datetime.now(dt.UTC))
        except Exception as exc:
            self._error("ladder", exc)
            return
        self._call("ladder", t0)

    def scheduler_round(self, now: float) -> float:
        """Writes what is due; returns when the next round is due."""
        assert self.store is not None
        scale = self.cfg["scale"]
        at = dt.datetime.now(dt.UTC)
        for name, targets in CHECKS.items():
            if self.next_write[name] > now:
                continue
            period = SLOW_REFRESH.get(name, REFRESH) * scale
            # After the start-up writes, refreshes fall anywhere in the period, as they do
            # once a fleet has run a while (checks find changes at their own times).
            period *= self.rng.random() if self.first_round else 1.0
            self.next_write[name] = now + period
            status = Status.WARN if self.rng.random() < 0.01 else Status.OK
            for target in targets:
                self.unsynced[(name, target)] = ConditionUpdate(
                    name, status, target=target, message=f"{name} {status.value}"
                )
        self.first_round = False
        if self.unsynced:
            self._write_conditions(at)
        if now >= self.next_event:
            self.next_event = now + EVENT_EVERY * scale
            self.events_made += 1
            self.journal.append(
                {
                    "kind": "job_summary",
                    "severity": "INFO",
                    "source": "bench",
                    "message": f"job {self.events_made} on {self.node}",
                }
            )
        if self.journal:
            self._write_events(at)
        if now >= self.next_prune:
            self.next_prune = now + PRUNE_EVERY * scale
            t0 = time.monotonic()
            try:
                self.store.prune(at, 90)
                self._call("prune", t0)
            except Exception as exc:
                self._error("prune", exc)
        due = [*self.next_write.values(), self.next_event, self.next_prune]
        soon = min(due)
        if self.unsynced or self.journal:  # the store was down: retry a round later
            soon = min(soon, now + self.cfg["retry"])
        return soon

    def flush(self) -> None:
        """The end of the run: whatever waits is written (the daemon would, once back)."""
        at = dt.datetime.now(dt.UTC)
        if self.unsynced:
            self._write_conditions(at)
        if self.journal:
            self._write_events(at)

    def _write_conditions(self, at: dt.datetime) -> None:
        assert self.store is not None
        by_type: dict[str, list[ConditionUpdate]] = {}
        for (name, _), update in self.unsynced.items():
            by_type.setdefault(name, []).append(update)
        for updates in by_type.values():  # one set_conditions per check, as a round
            t0 = time.monotonic()
            try:
                self.store.set_conditions(self.node, updates, at)
            except Exception as exc:
                self._error("set_conditions", exc)
                return
            self._call("set_conditions", t0)
            for u in updates:
                del self.unsynced[(u.type, u.target)]
                self.written.add((u.type, u.target))

    def _write_events(self, at: dt.datetime) -> None:
        assert self.store is not None
        while self.journal:
            t0 = time.monotonic()
            try:
                self.store.add_event(self.node, at=at, **self.journal[0])
            except Exception as exc:
                self._error("add_event", exc)
                return
            self._call("add_event", t0)
            self.journal.pop(0)
            self.events_written += 1

    # -- measuring ------------------------------------------------------------------------

    def _listen(self, store: Store) -> None:
        stats = self.stats

        def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            conn.info["bench_t0"] = time.monotonic()

        def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            end = time.monotonic()
            t0 = conn.info.pop("bench_t0", end)
            stats.stmt.append((end, end - t0, statement.lstrip().startswith(WRITE_VERBS)))

        def checkout(*args: Any) -> None:
            stats.checkouts.append(time.monotonic())  # each one pings first (pool_pre_ping)

        event.listen(store.engine.pool, "checkout", checkout)
        event.listen(store.engine, "before_cursor_execute", before)
        event.listen(store.engine, "after_cursor_execute", after)

    def _call(self, what: str, t0: float) -> None:
        end = time.monotonic()
        self.stats.calls.append((end, end - t0, what))

    def _error(self, what: str, exc: BaseException) -> None:
        self.stats.errors.append((time.monotonic(), what, first_line(exc)))


def worker(
    indexes: list[int], url: str, cfg: dict[str, Any], t_start: float, t_end: float, out: Any
) -> None:
    """One process's share of the fleet: a heap of due chains run by `threads` threads;
    a daemon's ladder and scheduler chains may run at once (two threads in the daemon),
    each chain never overlaps itself."""
    stats = Stats()
    daemons = [SimDaemon(i, url, cfg, stats) for i in indexes]
    heap: list[tuple[float, int, str]] = []
    ramp = cfg["ramp"]
    for d in daemons:
        heapq.heappush(heap, (t_start + random.Random(d.index).uniform(0, ramp), d.index, "start"))
    lookup = {d.index: d for d in daemons}
    lock = threading.Condition()
    pool = ThreadPoolExecutor(max_workers=cfg["threads"])
    running = [0]
    scale = cfg["scale"]

    def schedule(at: float, index: int, chain: str) -> None:
        with lock:
            heapq.heappush(heap, (at, index, chain))
            lock.notify()

    def run(index: int, chain: str) -> None:
        d = lookup[index]
        now = time.monotonic()
        try:
            if chain == "start":
                if d.start(now):
                    schedule(now, index, "ladder")
                    schedule(now, index, "scheduler")
                else:
                    schedule(now + RESTART_SEC, index, "start")
            elif chain == "ladder":
                d.ladder_tick()
                schedule(time.monotonic() + LADDER_EVERY * scale, index, "ladder")
            else:
                schedule(d.scheduler_round(now), index, "scheduler")
        finally:
            with lock:
                running[0] -= 1
                lock.notify()

    while True:
        with lock:
            now = time.monotonic()
            if now >= t_end:
                break
            if not heap or heap[0][0] > now or running[0] >= cfg["threads"] * 4:
                wait = heap[0][0] - now if heap else 0.5
                lock.wait(timeout=max(0.001, min(wait, t_end - now, 0.5)))
                continue
            _, index, chain = heapq.heappop(heap)
            running[0] += 1
        pool.submit(run, index, chain)
    pool.shutdown(wait=True)
    # What waited for the store is written now (retried until a deadline).
    deadline = time.monotonic() + 60.0
    pending = [d for d in daemons if d.store is not None and (d.unsynced or d.journal)]
    while pending and time.monotonic() < deadline:
        for d in pending:
            d.flush()
        pending = [d for d in pending if d.unsynced or d.journal]
    pools = [kept(d) for d in daemons if d.store is not None]
    out.send(
        {
            "stmt": stats.stmt,
            "calls": stats.calls,
            "checkouts": stats.checkouts,
            "errors": stats.errors,
            "started": sum(1 for d in daemons if d.store is not None),
            "starts_failed": sum(d.starts_failed for d in daemons),
            "events_written": sum(d.events_written for d in daemons),
            "conditions_written": sum(len(d.written) for d in daemons),
            "events_made": sum(d.events_made for d in daemons),
            "unsynced_left": sum(len(d.unsynced) for d in daemons),
            "journal_left": sum(len(d.journal) for d in daemons),
            "pool_connections": pools,
            "cpu_s": resource.getrusage(resource.RUSAGE_SELF).ru_utime
            + resource.getrusage(resource.RUSAGE_SELF).ru_stime,
        }
    )
    out.close()
    for d in daemons:
        if d.store is not None:
            with contextlib.suppress(Exception):
                d.store.close()


def kept(d: SimDaemon) -> int:
    """The connections a daemon's engine keeps open: its pool's, or with no pool (NullPool)
    only the webhook sender's held one."""
    assert d.store is not None
    pool = d.store.engine.pool
    if isinstance(pool, QueuePool):
        return pool.checkedin() + pool.checkedout()
    return 1 if d.election is not None and d.election.holding else 0


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def postgres_pss_mb(postmaster: int) -> float:
    """The proportional set size of the server's processes (the postmaster and its
    children), in MB: shared memory is counted once across them."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if int(entry.name) != postmaster:
                with open(f"/proc/{entry.name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) != postmaster:
                        continue
            with open(f"/proc/{entry.name}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            continue
    return round(total / 1024, 1)


class Sampler(threading.Thread):
    """pg_stat_activity and the sender lock, once a second, as the superuser (reserved
    connection slots keep it in when the daemons' role has used all the others)."""

    def __init__(self, dsn: str, database: str, data: Path) -> None:
        super().__init__(daemon=True)
        self.data = data
        self.dsn = dsn
        self.database = database
        self.samples: list[tuple[float, int, int, int, int]] = []  # t, total, idle, active, senders
        self.pss: list[tuple[float, float]] = []  # t, MB of all postgres processes
        self.server: list[tuple[float, int, int]] = []  # t, transactions, rows written
        self.stop = threading.Event()

    def postmaster(self) -> int:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return -1

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        ticks = 0
        while not self.stop.wait(1.0):
            ticks += 1
            if ticks % 10 == 5:
                self.pss.append((time.monotonic(), postgres_pss_mb(self.postmaster())))
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                row = conn.execute(
                    "SELECT count(*), count(*) FILTER (WHERE state = 'idle'),"
                    " count(*) FILTER (WHERE state <> 'idle'),"
                    " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    "  AND classid = %s AND objid = %s)"
                    " FROM pg_stat_activity WHERE datname = %s AND usename = 'medic'",
                    (
                        (SENDER_LOCK_KEY >> 32) & 0xFFFFFFFF,
                        SENDER_LOCK_KEY & 0xFFFFFFFF,
                        self.database,
                    ),
                ).fetchone()
                assert row is not None
                db = conn.execute(
                    "SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted"
                    " FROM pg_stat_database WHERE datname = %s",
                    (self.database,),
                ).fetchone()
                assert db is not None
                self.server.append((time.monotonic(), int(db[0]), int(db[1])))
                self.samples.append((time.monotonic(), int(row[0]), int(row[1]), int(row[2]),
                                     int(row[3])))  # fmt: skip
            except Exception:
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
                self.samples.append((time.monotonic(), -1, -1, -1, -1))  # server down


def prefill(url: str, daemons: int) -> None:
    """Every node's conditions, as a fleet that has run a while has them (bulk insert)."""
    from sqlalchemy import insert

    from medic_core.store.models import ConditionRow

    at = dt.datetime.now(dt.UTC)
    with open_store(url) as store, store.engine.begin() as conn:
        for start in range(0, daemons, 500):
            rows = [
                {
                    "node": node_name(i),
                    "type": name,
                    "target": target,
                    "status": "OK",
                    "reason": "",
                    "message": f"{name} OK",
                    "evidence": {},
                    "since": at,
                    "updated_at": at,
                }
                for i in range(start, min(daemons, start + 500))
                for name, targets in CHECKS.items()
                for target in targets
            ]
            conn.execute(insert(ConditionRow), rows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.pg import PostgresServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries: apt-get install postgresql")
    server = PostgresServer(
        bindir,
        {
            "max_connections": str(args.max_connections),
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "shared_buffers": "256MB",
        },
    )
    server.start()
    try:
        url = server.create_database("fleet")
        database = make_url(url).database or ""
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE medic LOGIN")
            conn.execute(f'ALTER DATABASE "{database}" OWNER TO medic'.encode())
        daemon_url = url.replace("postgres@", "medic@", 1)
        open_store(daemon_url).close()  # the schema, as `medic store migrate` would
        if args.steady:
            prefill(daemon_url, args.daemons)
        args.filled_at = dt.datetime.now(dt.UTC)  # what the daemons write is newer
        bouncer = None
        if args.pgbouncer:
            bouncer = start_pgbouncer(server, args)
            daemon_url = f"postgresql+psycopg://medic@/{database}?host={bouncer[1]}&port=6432"
        try:
            return drive(args, server, daemon_url, database)
        finally:
            if bouncer is not None:  # its own session: the launcher and pgbouncer
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(bouncer[0], signal.SIGTERM)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(bouncer[0], 0)
    finally:
        server.stop()


def start_pgbouncer(server: Any, args: argparse.Namespace) -> tuple[int, Path]:
    """A private pgbouncer in transaction mode in front of `server`, on a Unix socket in the
    server's directory (port 6432); trust auth, as the server's."""
    base = Path(server.base)
    sock = base / "bouncer"
    sock.mkdir()
    users = base / "bouncer.users"
    users.write_text('"medic" ""\n"postgres" ""\n')
    ini = base / "bouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = host={server.socket_dir} port=5432\n"
        "[pgbouncer]\n"
        "listen_addr =\n"
        "listen_port = 6432\n"
        f"unix_socket_dir = {sock}\n"
        "auth_type = trust\n"
        f"auth_file = {users}\n"
        "pool_mode = transaction\n"
        f"max_client_conn = {args.daemons * 2 + 100}\n"
        f"default_pool_size = {args.bouncer_pool}\n"
        "server_login_retry = 1\n"
        f"logfile = {base / 'bouncer.log'}\n"
        "log_connections = 0\nlog_disconnections = 0\n"
    )
    for path in (sock, users, ini, base):
        shutil.chown(path, "postgres", "postgres")
    pid = spawn(["runuser", "-u", "postgres", "--", "pgbouncer", str(ini)], log_path=base / "b.out")
    deadline = time.monotonic() + 30
    while True:
        try:
            dsn = f"host={sock} port=6432 user=medic dbname=postgres"
            with psycopg.connect(dsn, connect_timeout=2, prepare_threshold=None):
                break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # polled with a deadline
    return pid, sock


def drive(args: argparse.Namespace, server: Any, url: str, database: str) -> dict[str, Any]:
    cfg = {
        "scale": args.scale,
        "outbox": args.outbox,
        "threads": args.threads,
        "ramp": args.ramp,
        "retry": args.retry,
        # [store] pool and pool_size, given only when not the defaults
        "open_args": (
            {"pool": args.pool, "pool_size": args.pool_size}
            if (args.pool, args.pool_size) != ("queue", 5)
            else {}
        ),
        "steady": args.steady,
        "election_period": args.election_period,
    }
    indexes = list(range(args.daemons))
    shares = [indexes[p :: args.procs] for p in range(args.procs)]
    t_start = time.monotonic() + 1.0
    t_measure = t_start + args.ramp + args.warmup
    t_end = t_measure + args.seconds
    ctx = mp.get_context("fork")
    pipes, procs = [], []
    for share in shares:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=worker, args=(share, url, cfg, t_start, t_end, child))
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    sampler = Sampler(server.dsn("postgres"), database, Path(server.data))
    sampler.start()
    restart: dict[str, Any] = {}
    if args.restart_at is not None:
        at = t_measure + args.restart_at
        while time.monotonic() < at:
            time.sleep(min(0.2, max(0.0, at - time.monotonic())))  # the schedule, not a wait
        stopped = time.monotonic()
        server.outage()
        restart["stop_s"] = round(time.monotonic() - stopped, 2)
        down_until = stopped + args.down
        while time.monotonic() < down_until:
            time.sleep(min(0.2, max(0.0, down_until - time.monotonic())))
        server.back()
        restart["down_s"] = round(time.monotonic() - stopped, 2)
        restart["_stopped"], restart["_back"] = stopped, time.monotonic()
    results = [pipe.recv() for pipe in pipes]
    for p in procs:
        p.join()
    sampler.stop.set()
    sampler.join()
    return summarise(args, results, sampler, restart, t_measure, t_end, server, database)


def server_rates(sampler: Sampler, t0: float, t1: float) -> dict[str, Any]:
    """Transactions and rows written per second, from pg_stat_database (server side; the
    counters restart with the server, so only a window without a restart is rated)."""
    inside = [s for s in sampler.server if t0 <= s[0] < t1]
    runs: list[list[tuple[float, int, int]]] = [[]]
    for s in inside:  # split where the counters went back (a restart)
        if runs[-1] and s[1] < runs[-1][-1][1]:
            runs.append([])
        runs[-1].append(s)
    best = max(runs, key=len)
    if len(best) < 2:
        return {}
    span = best[-1][0] - best[0][0]
    return {
        "server_transactions_per_s": round((best[-1][1] - best[0][1]) / span, 1),
        "server_rows_written_per_s": round((best[-1][2] - best[0][2]) / span, 1),
    }


def summarise(
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    sampler: Sampler,
    restart: dict[str, Any],
    t_measure: float,
    t_end: float,
    server: Any,
    database: str,
) -> dict[str, Any]:
    window = t_end - t_measure
    stmt = [s for r in results for s in r["stmt"] if t_measure <= s[0] < t_end]
    calls = [c for r in results for c in r["calls"] if t_measure <= c[0] < t_end]
    errors = [e for r in results for e in r["errors"]]
    lat = [s[1] * 1000 for s in stmt]
    call_lat = [c[1] * 1000 for c in calls]
    samples = [s for s in sampler.samples if t_measure <= s[0] < t_end and s[1] >= 0]
    pools = [n for r in results for n in r["pool_connections"]]
    out: dict[str, Any] = {
        "benchmark": "fleet_store",
        "daemons": args.daemons,
        "scale": args.scale,
        "outbox": args.outbox,
        "steady": args.steady,
        "pool": args.pool,
        "pool_size": args.pool_size if args.pool == "queue" else None,
        "pgbouncer": args.pgbouncer and f"transaction mode, default_pool_size {args.bouncer_pool}",
        "max_connections": args.max_connections,
        "seconds": round(window, 1),
        "procs": args.procs,
        "threads_per_proc": args.threads,
        "loadavg_start": args.loadavg_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "client_cpu_s": round(sum(r["cpu_s"] for r in results), 1),
        "daemons_started": sum(r["started"] for r in results),
        "starts_failed": sum(r["starts_failed"] for r in results),
        "server_connections_max": max((s[1] for s in samples), default=None),
        "server_connections_median": statistics.median([s[1] for s in samples])
        if samples
        else None,
        "server_connections_idle_median": (
            statistics.median([s[2] for s in samples]) if samples else None
        ),
        "postgres_pss_mb_max": max((p[1] for p in sampler.pss), default=None),
        "pool_connections_per_daemon_mean": round(statistics.mean(pools), 2) if pools else None,
        "pool_connections_per_daemon_max": max(pools, default=None),
        "statements_per_s": round(len(stmt) / window, 1),
        "writes_per_s": round(sum(1 for s in stmt if s[2]) / window, 1),
        "statement_ms_p50": round(pct(lat, 0.5) or 0, 2),
        "statement_ms_p99": round(pct(lat, 0.99) or 0, 2),
        "call_ms_p50": round(pct(call_lat, 0.5) or 0, 2),
        "call_ms_p99": round(pct(call_lat, 0.99) or 0, 2),
        "calls_per_s": {k: round(v / window, 1) for k, v in Counter(c[2] for c in calls).items()},
        "real_time_statements_per_s": round(len(stmt) / window * args.scale, 1),
        "real_time_writes_per_s": round(sum(1 for s in stmt if s[2]) / window * args.scale, 1),
        "pool_checkouts_per_s": round(
            sum(1 for r in results for c in r["checkouts"] if t_measure <= c < t_end) / window, 1
        ),
        **server_rates(sampler, t_measure, t_end),
        "senders_median": statistics.median([s[4] for s in samples]) if samples else None,
        "errors": dict(Counter(f"{e[1]}: {e[2]}" for e in errors).most_common(8)),
        "errors_total": len(errors),
    }
    if restart:
        stopped, back = restart.pop("_stopped"), restart.pop("_back")
        after = [e for e in errors if e[0] >= stopped]
        restart["errors"] = len(after)
        restart["last_error_after_back_s"] = (
            round(max(e[0] for e in after) - back, 2) if after else None
        )
        senders = [s for s in sampler.samples if s[0] >= back and s[4] >= 1]
        restart["sender_again_after_back_s"] = round(senders[0][0] - back, 2) if senders else None
        conns = [s for s in sampler.samples if s[0] >= back and s[1] >= 0]
        restart["connections_after_back_max"] = max((s[1] for s in conns), default=None)
        out["restart"] = restart
    # Anything lost: every started node's conditions and every event written are there.
    with psycopg.connect(server.dsn(database), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM conditions WHERE updated_at > %s", (args.filled_at,)
        ).fetchone()
        events = conn.execute("SELECT count(*) FROM events").fetchone()
    assert rows is not None and events is not None
    out["lost"] = {
        "conditions_written": sum(r["conditions_written"] for r in results),
        "conditions_updated_in_store": int(rows[0]),
        "events_written": sum(r["events_written"] for r in results),
        "events_in_store": int(events[0]),
        "events_not_written_at_end": sum(r["journal_left"] for r in results),
        "conditions_not_written_at_end": sum(r["unsynced_left"] for r in results),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemons", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=1.0, help="every period times this")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--ramp", type=float, default=20.0, help="daemons start over this")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument(
        "--steady",
        action="store_true",
        help="store prefilled, start-up writes spread over the refresh period (no start storm)",
    )
    parser.add_argument(
        "--election-period", type=float, default=60.0, help="real seconds, not scaled"
    )
    parser.add_argument("--outbox", choices=["poll", "elect"], default="elect")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8, help="per process")
    parser.add_argument("--retry", type=float, default=5.0, help="seconds between store retries")
    parser.add_argument("--max-connections", type=int, default=2500)
    parser.add_argument("--restart-at", type=float, help="seconds into the measured window")
    parser.add_argument("--down", type=float, default=5.0, help="seconds PostgreSQL is down")
    parser.add_argument("--pool", choices=["queue", "null"], default="queue", help="[store] pool")
    parser.add_argument("--pool-size", type=int, default=5, help="[store] pool_size")
    parser.add_argument("--pgbouncer", action="store_true", help="through pgbouncer (transaction)")
    parser.add_argument("--bouncer-pool", type=int, default=20, help="its default_pool_size")
    args = parser.parse_args(argv)
    args.loadavg_start = [round(x, 2) for x in os.getloadavg()]
    # SIGTERM ends the run through the clean-up (the server and pgbouncer stopped).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

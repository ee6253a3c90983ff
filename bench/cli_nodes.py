"""`medic nodes --json` on a synthetic fleet: 10,000 nodes x 8 GPUs, 90 days of history.

The store is filled through bulk inserts (SQLAlchemy Core executemany): a condition for every
node-wide check and every GPU check of every GPU (76 per node), 1-3 events per node per day,
and remediation episodes with their steps (most resolved, some open, some waiting for a
human). Slurm's node list is injected as data (10,000 NodeInfo objects), so what is timed is
the function behind the command: `fleet()` (three queries) + `select_views()` +
`report_json()` + `json.dumps`, for the default view (nodes needing attention) and `--all`.

SQLite in a temporary file, and PostgreSQL at --pg-url or, when none is given, on a private
server started like the tests' (tests/pg.py; skipped when no server binaries are installed).

Prints one JSON object. Run: .venv/bin/python -m bench.cli_nodes [--nodes 10000] [--days 90]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Table, insert, text

from cli.nodes import fleet, report_json, select_views
from medic_core.slurm import NodeInfo
from medic_core.store import Store, open_store
from medic_core.store.models import ConditionRow, EventRow
from remediation import episodes as ep

GPUS = 8
NODE_CHECKS = [
    ("cpus", ""), ("memory", ""), ("filesystems", "/"), ("filesystems", "/scratch"),
    ("ib.port", "mlx5_0:1"), ("ib.port", "mlx5_1:1"), ("ib.port", "mlx5_2:1"),
    ("ib.port", "mlx5_3:1"), ("kernel_log", ""), ("services", ""), ("gpu.count", ""),
    ("gpu.driver", ""),
]  # fmt: skip
GPU_CHECKS = [
    "gpu.xid", "gpu.ecc", "gpu.remapped_rows", "gpu.retired_pages", "gpu.nvlink",
    "gpu.pcie", "gpu.thermal", "gpu.persistence",
]  # fmt: skip
FAULTS = ["gpu.xid.79", "gpu.xid.48", "gpu.ecc.dbe", "gpu.nvlink.down", "ib.port.down"]
EVENT_KINDS = ["gpu_xid", "kernel_log", "gate", "job_summary", "job_action"]
BATCH = 20_000
FLOOR_SECONDS = 1.0


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


def batched(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def conditions(nodes: int, now: dt.datetime, rng: random.Random) -> Iterator[dict[str, Any]]:
    for i in range(nodes):
        name = node_name(i)
        sick = rng.random()  # 1% CRITICAL, 2% WARN, the rest OK
        bad_gpu = rng.randrange(GPUS)
        types = [(t, target) for t, target in NODE_CHECKS]
        types += [(t, str(g)) for g in range(GPUS) for t in GPU_CHECKS]
        for type_, target in types:
            status, reason, message = "OK", "", ""
            if target == str(bad_gpu) and type_ == "gpu.xid" and sick < 0.01:
                status, reason, message = "CRITICAL", rng.choice(FAULTS), "Xid on the GPU"
            elif target == str(bad_gpu) and type_ == "gpu.thermal" and sick < 0.03:
                status, reason, message = "WARN", "gpu.thermal.slowdown", "clocks throttled"
            since = now - dt.timedelta(seconds=rng.randrange(90 * 86400))
            yield {
                "node": name, "type": type_, "target": target, "status": status,
                "reason": reason, "message": message, "evidence": {},
                "since": since, "updated_at": now - dt.timedelta(seconds=rng.randrange(300)),
            }  # fmt: skip


def events(nodes: int, days: int, now: dt.datetime, rng: random.Random) -> Iterator[dict[str, Any]]:
    for i in range(nodes):
        name = node_name(i)
        for day in range(days):
            for _ in range(rng.randint(1, 3)):
                at = now - dt.timedelta(days=day, seconds=rng.randrange(86400))
                kind = rng.choice(EVENT_KINDS)
                yield {
                    "node": name, "at": at, "kind": kind, "fault_class": "",
                    "target": f"job:{rng.randrange(10**6)}", "severity": "INFO",
                    "message": f"{kind} on {name}", "evidence": {"n": day},
                    "source": "bench",
                }  # fmt: skip


def episodes_and_steps(
    nodes: int, days: int, now: dt.datetime, rng: random.Random
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """About one episode per 300 node-days; the newest on 1% of nodes is still open."""
    episode_rows: list[dict[str, Any]] = []
    step_rows: list[dict[str, Any]] = []
    count = max(1, nodes * days // 300)
    for _ in range(count):
        node = rng.randrange(nodes)
        opened = now - dt.timedelta(seconds=rng.randrange(days * 86400))
        episode_rows.append(
            {
                "node": node_name(node), "state": ep.RESOLVED,
                "fault_class": rng.choice(FAULTS), "target": str(rng.randrange(GPUS)),
                "check_name": "gpu_xid", "recommendation": "restart_bm", "first_rung": 3,
                "rung": 3, "attempts": {"3": 1}, "message": "bench", "evidence": {},
                "failed_requalifications": 0, "ticket_id": None, "opened_at": opened,
                "updated_at": opened + dt.timedelta(minutes=20),
                "closed_at": opened + dt.timedelta(minutes=20),
            }
        )  # fmt: skip
    for i in rng.sample(range(nodes), max(1, nodes // 100)):
        opened = now - dt.timedelta(hours=rng.randrange(1, 48))
        state = rng.choice([*ep.OPEN_STATES, ep.NEEDS_HUMAN, ep.RMA])
        episode_rows.append(
            {
                "node": node_name(i), "state": state, "fault_class": rng.choice(FAULTS),
                "target": str(rng.randrange(GPUS)), "check_name": "gpu_xid",
                "recommendation": "restart_bm", "first_rung": 1, "rung": rng.randint(1, 3),
                "attempts": {"1": 1}, "message": "bench", "evidence": {},
                "failed_requalifications": 0, "ticket_id": None, "opened_at": opened,
                "updated_at": opened, "closed_at": None,
            }
        )  # fmt: skip
    episode_rows.sort(key=lambda r: r["opened_at"])
    for n, row in enumerate(episode_rows, start=1):
        row["id"] = n
        for attempt in range(1, rng.randint(1, 3) + 1):
            step_rows.append(
                {
                    "episode_id": n, "rung": row["rung"], "action": "reboot",
                    "attempt": attempt, "state": "done", "argv": ["scontrol", "reboot"],
                    "returncode": 0, "output": "", "boot_id": "b", "started_at": row["opened_at"],
                    "ended_at": row["updated_at"],
                }
            )  # fmt: skip
    return episode_rows, step_rows


def slurm_nodes(nodes: int, rng: random.Random) -> list[NodeInfo]:
    out = []
    for i in range(nodes):
        roll = rng.random()
        if roll < 0.01:
            info = NodeInfo(
                node_name(i),
                "IDLE",
                frozenset({"DRAIN"}),
                "medic: gpu.xid.79 gpu3 GPU has fallen off the bus",
                "root",
                ("gpu",),
            )
        elif roll < 0.015:
            info = NodeInfo(
                node_name(i), "DOWN", frozenset({"DRAIN"}), "admin: fan", "ops", ("gpu",)
            )
        else:
            info = NodeInfo(node_name(i), rng.choice(["IDLE", "ALLOCATED", "MIXED"]),
                            frozenset(), "", "", ("gpu",))  # fmt: skip
        out.append(info)
    return out


def fill(store: Store, nodes: int, days: int, now: dt.datetime, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    started = time.perf_counter()
    counts = {"conditions": 0, "events": 0, "episodes": 0, "steps": 0}
    table_c: Table = ConditionRow.__table__  # type: ignore[assignment]
    table_e: Table = EventRow.__table__  # type: ignore[assignment]
    for batch in batched(conditions(nodes, now, rng)):
        with store.engine.begin() as conn:
            conn.execute(insert(table_c), batch)
        counts["conditions"] += len(batch)
    for batch in batched(events(nodes, days, now, rng)):
        with store.engine.begin() as conn:
            conn.execute(insert(table_e), batch)
        counts["events"] += len(batch)
    episode_rows, step_rows = episodes_and_steps(nodes, days, now, rng)
    with store.engine.begin() as conn:
        conn.execute(insert(ep.episodes), episode_rows)
        conn.execute(insert(ep.steps), step_rows)
        if store.backend == "postgresql":
            conn.execute(
                text(
                    "SELECT setval(pg_get_serial_sequence('remediation_episodes', 'id'), "
                    "(SELECT max(id) FROM remediation_episodes))"
                )
            )
    counts["episodes"], counts["steps"] = len(episode_rows), len(step_rows)
    with store.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text("ANALYZE"))
    counts["fill_seconds"] = round(time.perf_counter() - started, 1)
    return counts


def nodes_json(
    store: Store, slurm: list[NodeInfo], show_all: bool, now: dt.datetime
) -> tuple[str, int]:
    """The function behind `medic nodes --json [--all]`, Slurm's list given. `now` is the
    fleet's own time: its daemons wrote their conditions in the 5 minutes before it, as a
    live fleet's do (a later clock would find every daemon silent while the data loads)."""
    views = fleet(store, slurm, now)
    shown = select_views(views, show_all=show_all)
    control = ep.EpisodeStore(store).control()
    return json.dumps(report_json(views, shown, control, now), indent=2), len(shown)


def measure(url: str, slurm: list[NodeInfo], runs: int, now: dt.datetime) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for label, show_all in (("attention", False), ("all", True)):
        times = []
        shown = 0
        for _ in range(runs):
            started = time.perf_counter()
            with open_store(url) as store:  # as the command does: open (schema check), query
                _, shown = nodes_json(store, slurm, show_all, now)
            times.append(time.perf_counter() - started)
        result[label] = {
            "nodes_listed": shown,
            "first_s": round(times[0], 3),
            "median_s": round(statistics.median(times), 3),
            "max_s": round(max(times), 3),
            "floor_ok": max(times) <= FLOOR_SECONDS,
        }
    return result


def run_backend(url: str, args: argparse.Namespace, now: dt.datetime) -> dict[str, Any]:
    with open_store(url) as store:
        filled = fill(store, args.nodes, args.days, now, args.seed)
        backend = store.backend
    slurm = slurm_nodes(args.nodes, random.Random(args.seed))
    return {"backend": backend, **filled, **measure(url, slurm, args.runs, now)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pg-url", help="an empty PostgreSQL database (default: a private one)")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)
    now = dt.datetime.now(dt.UTC)
    out: dict[str, Any] = {
        "bench": "cli_nodes",
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS,
        "days": args.days,
        "floor_s": FLOOR_SECONDS,
    }
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        out["sqlite"] = run_backend(f"sqlite:///{Path(tmp) / 'medic.db'}", args, now)
    if args.pg_url:
        out["postgresql"] = run_backend(args.pg_url, args, now)
    elif not args.no_pg:
        from tests.pg import PostgresServer, find_bindir

        bindir = find_bindir()
        if bindir is None or not (bindir / "postgres").exists():
            out["postgresql"] = (
                "skipped: no PostgreSQL server binaries (apt-get install postgresql)"
            )
        else:
            server = PostgresServer(bindir)
            try:
                server.start()
                out["postgresql"] = run_backend(server.create_database("bench"), args, now)
            finally:
                server.stop()
    print(json.dumps(out))
    backends = [v for k, v in out.items() if k in ("sqlite", "postgresql") and isinstance(v, dict)]
    ok = all(b[label]["floor_ok"] for b in backends for label in ("attention", "all"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

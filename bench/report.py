"""`medic report --json` over the fleet of bench/cli_nodes.py: 10,000 nodes x 8 GPUs, 90 days.

The store is filled as bench/cli_nodes.py fills it (conditions, 1-3 events per node per day,
an episode per 300 node-days with its steps), and then every resolved episode gets the job
records a real fault leaves: the fault event, the drain, 1-3 resilient jobs of 4 nodes each
requeued off the node (one in ten of them not: budget spent), each job's gates before the
fault and after the requeue on 4 other nodes, its job summaries; one episode in fifty also
an RMA ticket. What is timed is the function behind the command, as a process runs it:
open the store, `gather()` (the queries), `build_report()` and `report_text()` (the
JSON), over the whole 90 days.

SQLite in a temporary file, and PostgreSQL at --pg-url or on a private server started like
the tests' (skipped without server binaries, or with --no-pg).

Prints one JSON object. Run: .venv/bin/python -m bench.report [--nodes 10000] [--days 90]
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

from sqlalchemy import Table, insert, select, text

from bench.cli_nodes import BATCH, GPUS, batched, fill, node_name
from cli.report_gather import gather
from cli.report_json import report_text
from medic_core.store import Store, open_store
from medic_core.store.models import EventRow, RmaTicketRow
from remediation import episodes as ep
from remediation import report as rp

CEILING_SECONDS = 5.0
JOB_NODES = 4


def job_events(store: Store, nodes: int, seed: int) -> tuple[int, int, int]:
    """The records of every job a resolved episode's fault interrupted; returns events,
    interruptions and tickets added."""
    rng = random.Random(seed + 1)
    with store.engine.connect() as conn:
        resolved = conn.execute(
            select(ep.episodes.c.node, ep.episodes.c.fault_class, ep.episodes.c.opened_at)
            .where(ep.episodes.c.state == ep.RESOLVED)
            .order_by(ep.episodes.c.id)  # the same jobs on both backends
        ).all()
    resolved = [
        (node, fault_class, opened if opened.tzinfo else opened.replace(tzinfo=dt.UTC))
        for node, fault_class, opened in resolved
    ]
    job_ids = iter(range(10_000_000, 20_000_000))
    interruptions = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal interruptions
        for node, fault_class, opened in resolved:
            known = opened - dt.timedelta(seconds=rng.uniform(0.1, 2))
            yield event(node, known, "gpu_xid", fault_class, "3", "CRITICAL", {"xid": 79})
            yield event(node, opened, "job_action", fault_class, "3", "CRITICAL", {"drain": "x"})
            for _ in range(rng.randint(1, 3)):
                job = next(job_ids)
                target = f"job:{job}"
                started = opened - dt.timedelta(hours=rng.uniform(1, 48))
                for n in [node, *(node_name(rng.randrange(nodes)) for _ in range(JOB_NODES - 1))]:
                    yield event(n, started, "gate", "", target, "INFO", {"allow": True})
                action = "requeued" if rng.random() < 0.9 else "budget_spent"
                evidence = {"action": action, "job_id": str(job)}
                yield event(node, opened, "job_action", fault_class, target, "WARN", evidence)
                yield event(node, opened + dt.timedelta(seconds=3), "job_summary", "", target,
                            "CRITICAL", {})  # fmt: skip
                interruptions += 1
                if action != "requeued":
                    continue
                back = opened + dt.timedelta(seconds=rng.uniform(5, 900))
                for _ in range(JOB_NODES):
                    n = node_name(rng.randrange(nodes))
                    yield event(n, back, "gate", "", target, "INFO", {"allow": True})
                end = back + dt.timedelta(hours=rng.uniform(1, 48))
                yield event(n, end, "job_summary", "", target, "INFO", {})

    count = 0
    table: Table = EventRow.__table__  # type: ignore[assignment]
    for batch in batched(rows()):
        with store.engine.begin() as conn:
            conn.execute(insert(table), batch)
        count += len(batch)
    by_key = {
        (node, fault_class): {
            "node": node,
            "state": "open",
            "fault_class": fault_class,
            "summary": "bench",
            "gpus": [],
            "evidence": {},
            "resolution": "",
            "requalify": False,
            "external_id": "",
            "external_url": "",
            "created_at": opened,
            "updated_at": opened,
            "closed_at": None,
        }
        for node, fault_class, opened in resolved[::50]
    }  # fmt: skip  (one open ticket per node and fault class)
    tickets = list(by_key.values())
    ticket_table: Table = RmaTicketRow.__table__  # type: ignore[assignment]
    with store.engine.begin() as conn:
        conn.execute(insert(ticket_table), tickets)
    return count, interruptions, len(tickets)


def event(
    node: str,
    at: dt.datetime,
    kind: str,
    fault_class: str,
    target: str,
    severity: str,
    evidence: dict[str, Any],
) -> dict[str, Any]:
    return {
        "node": node, "at": at, "kind": kind, "fault_class": fault_class, "target": target,
        "severity": severity, "message": f"{kind} on {node}", "evidence": evidence,
        "source": "bench",
    }  # fmt: skip


def report_once(url: str, since: dt.datetime, until: dt.datetime) -> tuple[str, rp.Report]:
    with open_store(url) as store:
        data = gather(
            store, since, until, fleet_nodes=None, gpus_per_node=GPUS, lemon=rp.LemonRule()
        )
    report = rp.build_report(data)
    return report_text(report, 20), report


def run_backend(url: str, args: argparse.Namespace, now: dt.datetime) -> dict[str, Any]:
    with open_store(url) as store:
        filled = fill(store, args.nodes, args.days, now, args.seed)
        added, interruptions, tickets = job_events(store, args.nodes, args.seed)
        with store.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(text("ANALYZE"))
        backend = store.backend
    return measure(url, args, now) | {
        "backend": backend, **filled, "job_events": added,
        "events_total": filled["events"] + added, "rma_tickets": tickets,
        "interruptions_recorded": interruptions,
    }  # fmt: skip


def measure(url: str, args: argparse.Namespace, now: dt.datetime) -> dict[str, Any]:
    since = now - dt.timedelta(days=args.days)
    times = []
    report = None
    for _ in range(args.runs):
        started = time.perf_counter()
        _, report = report_once(url, since, now)
        times.append(time.perf_counter() - started)
    assert report is not None
    return {
        "report": {
            "jobs": len(report.jobs),
            "interruptions": sum(len(j.interruptions) for j in report.jobs),
            "episodes": report.fleet.episodes,
            "nodes_listed": len(report.fleet.by_node),
            "mttr_s": round(report.mttr_s or 0, 1),
        },
        "first_s": round(times[0], 3),
        "median_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
        "ceiling_ok": max(times) <= CEILING_SECONDS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pg-url", help="an empty PostgreSQL database (default: a private one)")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument(
        "--sqlite",
        metavar="PATH",
        help="keep the SQLite fleet in PATH (and its time in PATH.json); a fleet already there"
        " is measured again without refilling",
    )
    args = parser.parse_args(argv)
    now = dt.datetime.now(dt.UTC)
    out: dict[str, Any] = {
        "bench": "report",
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS,
        "days": args.days,
        "batch": BATCH,
        "ceiling_s": CEILING_SECONDS,
    }
    if args.sqlite:
        path = Path(args.sqlite).absolute()
        meta = Path(f"{path}.json")
        if path.exists() and meta.exists():
            now = dt.datetime.fromisoformat(json.loads(meta.read_text())["now"])
            out["sqlite"] = {"reused": str(path), **measure(f"sqlite:///{path}", args, now)}
        else:
            out["sqlite"] = run_backend(f"sqlite:///{path}", args, now)
            meta.write_text(json.dumps({"now": now.isoformat()}))
    else:
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
    return 0 if all(b["ceiling_ok"] for b in backends) else 1


if __name__ == "__main__":
    sys.exit(main())

"""`medic rma list` on the synthetic fleet of bench/cli_nodes.py (10,000 nodes x 8 GPUs, 90
days of conditions, events and episodes) with a realistic RMA history.

About 3,000 tickets over the 90 days (an RMA rate far above most sites', so pessimistic):
those older than three weeks closed (5 % cancelled early), younger ones spread over open,
submitted, acknowledged and replaced by age; each change has its audit row and its webhook
outbox row (delivered; the payload carries the ticket's evidence, about 3 KB); tickets closed
in the last day still wait for re-qualification, older ones have their re-qualified row.

What is timed is the command itself, through click's test runner, opening the store as it
does (`medic rma list --store URL [--all] [--json]`), for the default view (tickets not
closed) and `--all`, as a table and as JSON; p50 and p99 over --runs each.

SQLite in a temporary file, and PostgreSQL at --pg-url or, when none is given, on a private
server started like the tests' (tests/pg.py; skipped when no server binaries are installed).

Prints one JSON object. Run: .venv/bin/python -m bench.cli_rma [--tickets 3000] [--no-fleet]
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
import uuid
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from sqlalchemy import insert, text

from bench.cli_nodes import FAULTS, GPUS, fill, node_name
from cli.rma import rma_command
from medic_core.store import Store, open_store
from medic_core.store.models import RmaAuditRow, RmaOutboxRow, RmaTicketRow

FLOOR_SECONDS = 1.0
PATH = ["submitted", "acknowledged", "replaced", "closed"]
ACTORS = ["alice", "bob", "carol", "dave", "medic-ladder"]
VARIANTS: dict[str, list[str]] = {
    "open_table": [],
    "open_json": ["--json"],
    "all_table": ["--all"],
    "all_json": ["--all", "--json"],
}


def evidence(
    rng: random.Random, node: str, gpu: int, fault: str, at: dt.datetime
) -> dict[str, Any]:
    """About 3 KB, shaped like the ladder's (healthd/ladder_host.py open_rma)."""
    return {
        "episode": rng.randrange(10**5),
        "why": "every rung tried",
        "fault": {"fault_class": fault, "target": str(gpu), "message": f"{fault} on GPU {gpu}"},
        "steps": [
            {"action": a, "state": "done", "rc": 1, "output": "reset failed: GPU busy"}
            for a in ("gpu_reset", "driver_reload", "reboot")
        ],
        "conditions": [
            {"type": "gpu_xid", "target": str(gpu), "status": "CRITICAL", "reason": fault}
        ],
        "events": [
            {
                "at": (at - dt.timedelta(minutes=5 * i)).isoformat(),
                "kind": "gpu_xid",
                "fault_class": fault,
                "message": f"NVRM: Xid (PCI:0000:{40 + gpu:02x}:00): 79, GPU fell off the bus",
            }
            for i in range(20)
        ],
    }


def _schedule(rng: random.Random, created: dt.datetime, now: dt.datetime) -> list[str]:
    """The states a ticket went through after `open`, by its age."""
    days = (now - created).total_seconds() / 86400
    if days > 21:
        if rng.random() < 0.05:  # cancelled early: the vendor found nothing, a false alarm
            return [*PATH[: rng.randrange(0, 3)], "closed"]
        return PATH
    if days > 10:
        return PATH[:3] if rng.random() < 0.6 else PATH
    if days > 3:
        return PATH[:2]
    if days > 1:
        return PATH[:1]
    return []


def tickets(count: int, nodes: int, days: int, now: dt.datetime, seed: int) -> dict[str, Any]:
    """Rows for rma_tickets, rma_audit and rma_outbox; at most one ticket that is not closed
    per node and fault class, as the partial unique index demands."""
    rng = random.Random(seed)
    ticket_rows: list[dict[str, Any]] = []
    audit_rows: list[dict[str, Any]] = []
    outbox_rows: list[dict[str, Any]] = []
    open_pairs: set[tuple[str, str]] = set()
    created_times = sorted(
        now - dt.timedelta(seconds=rng.randrange(days * 86400)) for _ in range(count)
    )
    for ticket_id, created in enumerate(created_times, start=1):
        node, fault = node_name(rng.randrange(nodes)), rng.choice(FAULTS)
        steps = _schedule(rng, created, now)
        if steps[-1:] != ["closed"]:
            while (node, fault) in open_pairs:
                node = node_name(rng.randrange(nodes))
            open_pairs.add((node, fault))
        gpu = rng.randrange(GPUS)
        bundle = evidence(rng, node, gpu, fault, created)
        at, state, changes = created, "open", [(None, "open", created, "medic-ladder", "opened")]
        for nxt in steps:
            at = min(now, at + dt.timedelta(hours=rng.uniform(2, 72)))
            note = "vendor found no fault" if nxt == "closed" and state != "replaced" else nxt
            changes.append((state, nxt, at, rng.choice(ACTORS[:4]), note))
            state = nxt
        closed = state == "closed"
        resolution = ("replaced" if changes[-2][1] == "replaced" else "cancelled") if closed else ""
        requalify = closed and (now - at) < dt.timedelta(days=1)
        if closed and not requalify:
            at = min(now, at + dt.timedelta(hours=rng.uniform(1, 6)))
            changes.append(("closed", "closed", at, "medic-ladder", "node re-qualified"))
        ticket_rows.append(
            {
                "id": ticket_id, "node": node, "state": state, "fault_class": fault,
                "summary": f"{fault} on {node}: every rung tried",
                "gpus": [{"index": gpu, "uuid": f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
                          "serial": f"16543{rng.randrange(10**8):08d}",
                          "pci_bus_id": f"00000000:{40 + gpu:02x}:00.0"}],
                "evidence": bundle, "resolution": resolution, "requalify": requalify,
                "external_id": f"INC-{rng.randrange(10**6)}" if len(changes) > 1 else "",
                "external_url": "", "created_at": created, "updated_at": at,
                "closed_at": changes[-1][2] if closed else None,
            }
        )  # fmt: skip
        for from_state, to_state, when, who, note in changes:
            audit_rows.append(
                {"ticket_id": ticket_id, "at": when, "actor": who, "from_state": from_state,
                 "to_state": to_state, "note": note}
            )  # fmt: skip
            delivery = str(uuid.UUID(int=rng.getrandbits(128)))
            outbox_rows.append(
                {
                    "ticket_id": ticket_id, "delivery_id": delivery, "event": "ticket.transition",
                    "payload": {"delivery_id": delivery, "evidence": bundle},
                    "state": "delivered", "attempts": 1, "last_status": 200, "last_error": "",
                    "created_at": when, "next_attempt_at": when, "last_attempt_at": when,
                    "delivered_at": when,
                }
            )  # fmt: skip
    return {"tickets": ticket_rows, "audit": audit_rows, "outbox": outbox_rows}


def fill_tickets(store: Store, rows: dict[str, Any]) -> None:
    with store.engine.begin() as conn:
        conn.execute(insert(RmaTicketRow.__table__), rows["tickets"])
        conn.execute(insert(RmaAuditRow.__table__), rows["audit"])
        for start in range(0, len(rows["outbox"]), 2000):
            conn.execute(insert(RmaOutboxRow.__table__), rows["outbox"][start : start + 2000])
        if store.backend == "postgresql":
            conn.execute(
                text(
                    "SELECT setval(pg_get_serial_sequence('rma_tickets', 'id'), "
                    "(SELECT max(id) FROM rma_tickets))"
                )
            )
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))


def measure(url: str, runs: int) -> dict[str, Any]:
    runner = CliRunner()
    out: dict[str, Any] = {}
    for label, extra in VARIANTS.items():
        times: list[float] = []
        listed = 0
        for _ in range(runs):
            started = time.perf_counter()
            result = runner.invoke(rma_command, ["list", "--store", url, *extra])
            times.append(time.perf_counter() - started)
            if result.exit_code != 0:
                raise RuntimeError(f"medic rma list {' '.join(extra)}: {result.output}")
            if "--json" in extra:
                listed = len(json.loads(result.stdout))
        times.sort()
        p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
        out[label] = {
            "p50_s": round(statistics.median(times), 3),
            "p99_s": round(p99, 3),
            "max_s": round(times[-1], 3),
            "floor_ok": statistics.median(times) <= FLOOR_SECONDS and p99 <= FLOOR_SECONDS,
        }
        if listed:
            out[label]["tickets_listed"] = listed
    return out


def run_backend(url: str, args: argparse.Namespace, now: dt.datetime) -> dict[str, Any]:
    started = time.perf_counter()
    with open_store(url) as store:
        filled: dict[str, Any] = {}
        if args.fleet:
            filled = fill(store, args.nodes, args.days, now, args.seed)
        rows = tickets(args.tickets, args.nodes, args.days, now, args.seed)
        fill_tickets(store, rows)
        backend = store.backend
    filled.update(
        tickets=len(rows["tickets"]),
        audit_rows=len(rows["audit"]),
        outbox_rows=len(rows["outbox"]),
        open_tickets=sum(1 for t in rows["tickets"] if t["state"] != "closed"),
        fill_seconds=round(time.perf_counter() - started, 1),
    )
    return {"backend": backend, **filled, **measure(url, args.runs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--tickets", type=int, default=3_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-fleet",
        dest="fleet",
        action="store_false",
        help="tickets only, without the fleet's conditions, events and episodes",
    )
    parser.add_argument("--pg-url", help="an empty PostgreSQL database (default: a private one)")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)
    now = dt.datetime.now(dt.UTC)
    out: dict[str, Any] = {
        "bench": "cli_rma",
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS,
        "days": args.days,
        "fleet": args.fleet,
        "runs": args.runs,
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
    ok = all(b[label]["floor_ok"] for b in backends for label in VARIANTS)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

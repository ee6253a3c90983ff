"""`medic` as people run it: whole processes, Python's start-up and every import included,
on the synthetic fleet of bench/cli_nodes.py (10,000 nodes x 8 GPUs, 90 days) with the RMA
history of bench/cli_rma.py (3,000 tickets).

Timed, round-robin (one run of each in turn, so that all meet the same machine):

* help: `medic --help`
* complete: the completion of a command name (what bash runs at `medic no<Tab>`)
* nodes: `medic nodes --no-slurm --store URL` (Slurm is not asked: no Slurm knows the
  fleet's 10,000 nodes; with Slurm add its `scontrol show nodes --json`)
* nodes_json: the same with --json
* rma_list: `medic rma list --store URL`

Before timing, the conditions' `updated_at` is moved into the last 5 minutes, as a live
fleet's daemons keep it (else every node reads as silent and is listed).

With --baseline, a second medic's commands join the round-robin, and each command's
ratio (first / baseline) is the median of the ratios of its pairs of runs.

Per command: the wall time's median with a 95 % bootstrap interval, p90, min and max, and
the median CPU (user + system of the process, from the kernel's accounting); the machine's
1-minute load average before and after.

With --baseline-store, the baseline's commands read another store (the same fleet at the
schema the baseline knows: `medic nodes` of this Medic adds an index, schema version 6).
With --pg, a private PostgreSQL server is started (tests/pg.py), the fleet is built into it,
and with --baseline a copy of that database taken back to schema 5 serves the baseline.

Prints one JSON object. Run (builds the fleet first, ~1-4 min):
  .venv/bin/python -m bench.cli_startup --build /tmp/fleet.db [--runs 20]
  .venv/bin/python -m bench.cli_startup --store sqlite:////tmp/fleet.db [--medic PATH]
      [--baseline OLD_MEDIC --baseline-store sqlite:////tmp/fleet-v5.db]
  .venv/bin/python -m bench.cli_startup --pg [--baseline OLD_MEDIC]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from medic_core import proc

BOOTSTRAP = 1000


def commands(medic: str, store: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    complete = {"_MEDIC_COMPLETE": "bash_complete", "COMP_WORDS": "medic no", "COMP_CWORD": "1"}
    return {
        "help": ([medic, "--help"], {}),
        "complete": ([medic], complete),
        "nodes": ([medic, "nodes", "--no-slurm", "--store", store], {}),
        "nodes_json": ([medic, "nodes", "--no-slurm", "--json", "--store", store], {}),
        "rma_list": ([medic, "rma", "list", "--store", store], {}),
    }


def build(path: Path) -> str:
    return fill_fleet(f"sqlite:///{path}")


def fill_fleet(url: str) -> str:
    from bench.cli_nodes import fill
    from bench.cli_rma import fill_tickets, tickets
    from medic_core.store import open_store

    now = dt.datetime.now(dt.UTC)
    with open_store(url) as store:
        fill(store, 10_000, 90, now, 1)
        fill_tickets(store, tickets(3000, 10_000, 90, now, 1))
    return url


def as_schema_5(url: str) -> None:
    """The fleet as the previous release left it: schema 5, without version 6's index."""
    from sqlalchemy import text

    with _engine(url) as engine, engine.begin() as conn:
        conn.execute(text("DROP INDEX IF EXISTS ix_conditions_node_updated_at"))
        conn.execute(text("DELETE FROM schema_version WHERE version > 5"))


def pg_copy(server: Any, source_url: str, name: str) -> str:
    """A new database on `server` made from the one at `source_url` (CREATE DATABASE ...
    TEMPLATE)."""
    import psycopg

    source = source_url.split("?", 1)[0].rsplit("/", 1)[1]
    with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"'.encode())
    return str(server.url(name))


@contextlib.contextmanager
def _engine(url: str) -> Iterator[Any]:
    """An engine on the store that migrates nothing (the baseline's store stays at its
    schema)."""
    from medic_core.store.engine import make_engine, parse_url

    engine = make_engine(parse_url(url))
    try:
        yield engine
    finally:
        engine.dispose()


def make_live(url: str) -> None:
    """Every condition written in the last 5 minutes, as a fleet whose daemons run."""
    from sqlalchemy import text

    at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=60)
    with _engine(url) as engine, engine.begin() as conn:
        if engine.dialect.name == "sqlite":  # stored as naive UTC text
            at = at.replace(tzinfo=None)
        conn.execute(text("UPDATE conditions SET updated_at = :at"), {"at": at})
    if engine.dialect.name == "postgresql":
        with _engine(url) as engine, engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))


def run_once(argv: list[str], extra: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **extra}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = proc.run(argv, timeout=120, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(walls: list[float], cpus: list[float], rng: random.Random) -> dict[str, Any]:
    ordered = sorted(walls)
    medians = sorted(statistics.median(rng.choices(walls, k=len(walls))) for _ in range(BOOTSTRAP))
    return {
        "runs": len(walls),
        "median_s": round(statistics.median(walls), 3),
        "median_ci_s": [round(quantile(medians, 0.025), 3), round(quantile(medians, 0.975), 3)],
        "p90_s": round(quantile(ordered, 0.9), 3),
        "min_s": round(ordered[0], 3),
        "max_s": round(ordered[-1], 3),
        "cpu_median_s": round(statistics.median(cpus), 3),
    }


def paired_ratio(a: list[float], b: list[float]) -> float:
    """The median of the ratios of runs made one after the other."""
    return round(statistics.median(x / y for x, y in zip(a, b, strict=True)), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="a fleet built earlier (its URL)")
    where.add_argument("--build", type=Path, help="build the fleet into this SQLite file")
    where.add_argument(
        "--pg", action="store_true", help="build the fleet into a private PostgreSQL server"
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--medic", default=shutil.which("medic", path=str(Path(sys.executable).parent))
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--baseline",
        help="a second medic (an older checkout's) run in turn with the first; adds its "
        "figures and the ratio of each pair of runs",
    )
    parser.add_argument(
        "--baseline-store", help="the store the baseline reads (default: the same one)"
    )
    args = parser.parse_args(argv)
    if not args.pg:
        return measure(args, args.store or build(args.build), args.baseline_store)
    from tests.pg import PostgresServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries (apt-get install postgresql)")
    server = PostgresServer(bindir)
    try:
        server.start()
        url = fill_fleet(server.create_database("fleet"))
        before = None
        if args.baseline:
            before = pg_copy(server, url, "fleet_before")
            as_schema_5(before)
        return measure(args, url, before)
    finally:
        server.stop()


def measure(args: argparse.Namespace, url: str, baseline_url: str | None) -> int:
    make_live(url)
    todo = commands(str(args.medic), url)
    if args.baseline:
        if baseline_url:
            make_live(baseline_url)
        todo.update(
            {f"baseline.{k}": v for k, v in commands(args.baseline, baseline_url or url).items()}
        )
    walls: dict[str, list[float]] = {k: [] for k in todo}
    cpus: dict[str, list[float]] = {k: [] for k in todo}
    for argv_, extra in todo.values():  # one warm-up each: the page cache, the .pyc files
        run_once(argv_, extra)
    load_before = os.getloadavg()[0]
    for _ in range(args.runs):
        for name, (argv_, extra) in todo.items():
            wall, cpu = run_once(argv_, extra)
            walls[name].append(wall)
            cpus[name].append(cpu)
    rng = random.Random(args.seed)
    out: dict[str, Any] = {
        "benchmark": "cli_startup",
        "fleet_nodes": 10_000,
        "backend": url.split(":", 1)[0],
        **{name: summary(walls[name], cpus[name], rng) for name in todo},
        **{
            f"ratio.{name}": paired_ratio(walls[name], walls[f"baseline.{name}"])
            for name in todo
            if f"baseline.{name}" in walls
        },
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

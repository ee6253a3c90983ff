"""`medic` as people run it: whole processes, Python's start-up and every import included,
on the synthetic fleet of bench/cli_nodes.py (10,000 nodes x 8 GPUs, 90 days) with the RMA
history of bench/cli_rma.py (3,000 tickets).

Timed in rounds, one run of each command per round, in an order shuffled afresh each round
(seeded), so that all meet the same machine and no command always follows the same one:

* help: `medic --help`
* complete: the completion of a command name (what bash runs at `medic no<Tab>`)
* report_help: `medic report --help`
* what_if: `medic report what-if --nodes 512 --failure-rate 0.0005 --mttr 40m --mttr 4h
  --days 30` (arithmetic only: no store)
* config_check: `medic config check` on a valid medic.toml (the operator guide's example:
  three [checks.*] tables, gpu_count among them)
* config_check_bare: `medic config check` on an empty medic.toml (built-in defaults: no
  check has a table, so no check module is imported)
* ckpt_help: `medic ckpt --help`
* nodes: `medic nodes --no-slurm --store URL` (Slurm is not asked)
* nodes_json: the same with --json
* rma_list: `medic rma list --store URL`
* nodes_slurm (with --lab): `medic nodes --store URL` as a user runs it, Slurm asked: a
  5-node lab's `scontrol show nodes --json` beside the fleet's 10,000 nodes in the store

With --no-store only the commands that read no store run (no fleet is built).
Each command's "vs_help" is the median of its ratios to `medic --help` of the same round:
robust to the machine's load, which moves both alike.

Before timing, the conditions' `updated_at` is moved into the last 5 minutes, as a live
fleet's daemons keep it (else every node reads as silent and is listed).

With --baseline, a second medic's commands join the round-robin, and each command's
ratio (first / baseline) is the median of the ratios of its pairs of runs.

Per command: the wall time's median with a 95 % bootstrap interval, p90 (with >= 20 runs),
min and max, and the median CPU (user + system of the process, from the kernel's
accounting); the machine's 1-minute load average before and after, its CPUs, the date and
the commit measured (and whether the tree had uncommitted changes).

With --baseline-store, the baseline's commands read another store (the same fleet at the
schema the baseline knows: `medic nodes` of this Medic adds an index, schema version 6).
With --pg, a private PostgreSQL server is started (tests/pg.py), the fleet is built into it,
and with --baseline a copy of that database taken back to schema 5 serves the baseline.

Prints one JSON object. Run (builds the fleet first, ~1-4 min):
  .venv/bin/python -m bench.cli_startup --build /tmp/fleet.db [--runs 20]
  .venv/bin/python -m bench.cli_startup --store sqlite:////tmp/fleet.db [--medic PATH]
      [--baseline OLD_MEDIC --baseline-store sqlite:////tmp/fleet-v5.db]
  .venv/bin/python -m bench.cli_startup --pg [--baseline OLD_MEDIC]
  .venv/bin/python -m bench.cli_startup --no-store [--runs 20] [--baseline OLD_MEDIC]
  .venv/bin/python -m bench.cli_startup --store sqlite:////tmp/fleet.db --lab
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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from medic_core import proc

BOOTSTRAP = 1000
P90_MIN_RUNS = 20

# The operator guide's /etc/medic/medic.toml, its paths in a scratch directory.
CONFIG = """\
[node]
host_root = "/"
state_dir = "{state}"
socket = "{state}/healthd.sock"

[store]
url = "sqlite:///{state}/medic.db"
event_retention_days = 90

[healthd]
gpus = "auto"
jitter = 0.1
launch_max_age = 60.0
nvml_call_timeout = 3.0
metrics_port = 9847
metrics_address = "127.0.0.1"
socket_group = "slurm"
slurmd_spool_dir = "/var/spool/slurmd"
prune_every = 3600.0

[checks.gpu_count]
expected_count = 8

[checks.ib]
expected_ports = 8
min_rate_gbps = 400

[checks.filesystems]
required_mounts = ["/", "/home", "/lustre"]
"""

Commands = dict[str, tuple[list[str], dict[str, str]]]


def storeless_commands(medic: str, config: Path) -> Commands:
    """What reads no store: help, completion, `report what-if`, `config check`, `ckpt`."""
    complete = {"_MEDIC_COMPLETE": "bash_complete", "COMP_WORDS": "medic no", "COMP_CWORD": "1"}
    what_if = ["report", "what-if", "--nodes", "512", "--failure-rate", "0.0005"]
    what_if += ["--mttr", "40m", "--mttr", "4h", "--days", "30"]
    return {
        "help": ([medic, "--help"], {}),
        "complete": ([medic], complete),
        "report_help": ([medic, "report", "--help"], {}),
        "what_if": ([medic, *what_if], {}),
        "config_check": ([medic, "config", "check", "--config", str(config)], {}),
        "config_check_bare": (
            [medic, "config", "check", "--config", str(config.with_name("empty.toml"))],
            {},
        ),
        "ckpt_help": ([medic, "ckpt", "--help"], {}),
    }


def commands(medic: str, store: str | None, config: Path) -> Commands:
    out = storeless_commands(medic, config)
    if store is not None:
        out["nodes"] = ([medic, "nodes", "--no-slurm", "--store", store], {})
        out["nodes_json"] = ([medic, "nodes", "--no-slurm", "--json", "--store", store], {})
        out["rma_list"] = ([medic, "rma", "list", "--store", store], {})
    return out


def write_config(directory: Path) -> Path:
    path = directory / "medic.toml"
    path.write_text(CONFIG.format(state=directory))
    (directory / "empty.toml").write_text("")  # config_check_bare's
    return path


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
    out: dict[str, Any] = {
        "runs": len(walls),
        "median_s": round(statistics.median(walls), 3),
        "median_ci_s": [round(quantile(medians, 0.025), 3), round(quantile(medians, 0.975), 3)],
    }
    if len(walls) >= P90_MIN_RUNS:
        out["p90_s"] = round(quantile(ordered, 0.9), 3)
    out.update(
        min_s=round(ordered[0], 3),
        max_s=round(ordered[-1], 3),
        cpu_median_s=round(statistics.median(cpus), 3),
    )
    return out


def paired_ratio(a: list[float], b: list[float]) -> float:
    """The median of the ratios of the runs of the same round."""
    return round(statistics.median(x / y for x, y in zip(a, b, strict=True)), 3)


def tree_of(medic: str) -> Path | None:
    """The source tree a `medic` console script runs: its interpreter (the script's first
    line) asked where the `cli` package is; None when that cannot be told."""
    try:
        first = Path(medic).read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    if not first.startswith("#!"):
        return None
    code = "import cli, pathlib; print(pathlib.Path(cli.__file__).resolve().parent.parent)"
    found = proc.run([first[2:].strip(), "-c", code], timeout=30)
    return Path(found.stdout.strip()) if found.returncode == 0 and found.stdout.strip() else None


def measured_commit(tree: Path | None) -> dict[str, Any]:
    """The commit of the tree measured (the `--medic` script's, not the bench's own
    checkout), and whether it had uncommitted changes; None outside a git checkout."""
    if tree is None:
        return {"commit": None}
    repo = tree
    head = proc.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], timeout=30)
    dirty = proc.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                     timeout=30)  # fmt: skip
    if head.returncode != 0:
        return {"commit": None}
    return {"commit": head.stdout.strip(), "uncommitted_changes": bool(dirty.stdout.strip())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="a fleet built earlier (its URL)")
    where.add_argument("--build", type=Path, help="build the fleet into this SQLite file")
    where.add_argument(
        "--pg", action="store_true", help="build the fleet into a private PostgreSQL server"
    )
    where.add_argument(
        "--no-store", action="store_true", help="only the commands that read no store (no fleet)"
    )
    parser.add_argument(
        "--lab",
        action="store_true",
        help="also time `medic nodes` with Slurm asked, on a 5-node lab started for it",
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
    if args.no_store and args.lab:
        parser.error("--lab times `medic nodes` over a fleet: give --store, --build or --pg")
    if args.no_store:
        return measure(args, None, None)
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


def measure(args: argparse.Namespace, url: str | None, baseline_url: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="medic-cli-startup-") as scratch:
        config = write_config(Path(scratch))
        with lab_env(args.lab) as slurm_env:
            return measure_with(args, url, baseline_url, config, slurm_env)


@contextlib.contextmanager
def lab_env(wanted: bool) -> Iterator[dict[str, str] | None]:
    """With `wanted`, a 5-node lab for the time of the runs: the environment that points
    `medic` at its Slurm."""
    if not wanted:
        yield None
        return
    from cli.lab.cluster import Lab
    from cli.lab.slurm_conf import LabSpec

    with tempfile.TemporaryDirectory(prefix="medic-lab-", dir="/tmp") as tmp:
        lab = Lab(Path(tmp))
        try:
            lab.up(LabSpec())
            yield lab.env()
        finally:
            lab.down()


def measure_with(
    args: argparse.Namespace,
    url: str | None,
    baseline_url: str | None,
    config: Path,
    slurm_env: dict[str, str] | None,
) -> int:
    if url is not None:
        make_live(url)
    todo = commands(str(args.medic), url, config)
    if url is not None and slurm_env is not None:
        todo["nodes_slurm"] = ([str(args.medic), "nodes", "--store", url], slurm_env)
    if args.baseline:
        if baseline_url:
            make_live(baseline_url)
        theirs = commands(args.baseline, baseline_url or url, config)
        if url is not None and slurm_env is not None:
            theirs["nodes_slurm"] = ([args.baseline, "nodes", "--store", url], slurm_env)
        todo.update({f"baseline.{k}": v for k, v in theirs.items()})
    walls: dict[str, list[float]] = {k: [] for k in todo}
    cpus: dict[str, list[float]] = {k: [] for k in todo}
    for argv_, extra in todo.values():  # one warm-up each: the page cache, the .pyc files
        run_once(argv_, extra)
    order = random.Random(args.seed)
    names = list(todo)
    load_before = os.getloadavg()[0]
    for _ in range(args.runs):
        order.shuffle(names)  # no command always runs first, or after the same one
        for name in names:
            argv_, extra = todo[name]
            wall, cpu = run_once(argv_, extra)
            walls[name].append(wall)
            cpus[name].append(cpu)
    rng = random.Random(args.seed)
    out: dict[str, Any] = {
        "benchmark": "cli_startup",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **measured_commit(tree_of(str(args.medic))),
        **(
            {"baseline_commit": measured_commit(tree_of(args.baseline))["commit"]}
            if args.baseline
            else {}
        ),
        "cpus": os.cpu_count(),
        "fleet_nodes": 10_000 if url is not None else 0,
        "backend": url.split(":", 1)[0] if url is not None else None,
        "slurm": "5-node lab" if slurm_env is not None else "not asked",
        "order": f"shuffled each round (seed {args.seed})",
        **{name: summary(walls[name], cpus[name], rng) for name in todo},
        **{
            f"vs_help.{name}": paired_ratio(walls[name], walls[help_of(name)])
            for name in todo
            if name != help_of(name)
        },
        **{
            f"ratio.{name}": paired_ratio(walls[name], walls[f"baseline.{name}"])
            for name in todo
            if f"baseline.{name}" in walls
        },
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(out))
    return 0


def help_of(name: str) -> str:
    """The `medic --help` a command is compared with: its own medic's."""
    return "baseline.help" if name.startswith("baseline.") else "help"


if __name__ == "__main__":
    sys.exit(main())

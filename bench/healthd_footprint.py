"""What `medic-healthd` costs a node: CPU (% of one core) and resident memory of the daemon
process over a long run, with 8 simulated GPUs and every check at a 10 s interval (six times
more often than the shipped defaults for most checks).

The daemon runs on one lab node (real pynvml against the NVML injection library, the lab's
SQLite store); the figures come from psutil on the daemon's PID only. The first interval
(start-up: imports, NVML init, first full round) is excluded from the CPU figure and
reported on its own.

Per thread (`threads`): CPU from /proc/<pid>/task/<tid>/schedstat (nanoseconds on a CPU)
and voluntary context switches (wake-ups, and waits for the interpreter) from its status, over
the measured run; threads are named by `py-spy dump` when py-spy is on PATH (`pip install
py-spy`; not a dependency of Medic: Python does not give its threads' names to the kernel),
else by thread id. Workers of one kind (check lanes, NVML sweeps) are summed under one name.

Memory: RSS is sampled every --sample-every seconds; reported are the first, last, median and
largest samples and the least-squares slope (MiB per hour) of the samples after --warmup.
The warm-up by default lasts until the trend checks' series book is full (120 points per
GPU and counter, one per run: 20 minutes at a 10 s interval) and a minute more: that book
grows until then by design (tracemalloc showed it as nearly all of the growth of a 300 s run)
and no further.
A slope above --max-slope (0.1 MiB/hour) fails the bench: measure 30 minutes or more after
the warm-up, as a short run's slope is mostly noise. --store-url runs the daemon on another
store (e.g. PostgreSQL) instead of the lab's SQLite file.

Prints one JSON object. Run: .venv/bin/python -m bench.healthd_footprint --seconds 3060
--launches-per-second 1 (30 minutes after the warm-up)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.stats import slope_per_hour
from cli.lab.cluster import Lab
from cli.lab.slurm_conf import LabSpec, with_check_options
from healthd.checks import registry
from medic_core import proc
from medic_core.api import ask

TREND_KEEP = 120  # gpu_trends' and host_trends' default `keep`


def footprint(
    seconds: float,
    interval: float,
    sample_every: float,
    launches_per_second: float = 0.0,
    warmup: float | None = None,
    store_url: str | None = None,
) -> dict[str, object]:
    if warmup is None:
        warmup = trend_fill_seconds(interval) + 60
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(LabSpec(nodes=1, gpus_per_node=8))
        try:
            config = Path(tmp) / "footprint.toml"
            options = {s.name: f"interval = {interval}" for s in registry()}
            text = with_check_options(lab.layout.medic_conf.read_text(), options)
            if store_url is not None:  # e.g. a PostgreSQL store instead of the lab's SQLite
                text = re.sub(r'(?m)^url = ".*"$', f'url = "{store_url}"', text, count=1)
            config.write_text(text)
            pid = lab.start_healthd("n1", config=config)
            process = psutil.Process(pid)
            time.sleep(interval)  # let start-up finish before measuring steady state
            startup_cpu = sum(process.cpu_times()[:2])
            tasks_before = _tasks(pid)
            rss: list[tuple[float, float]] = []  # (seconds into the run, MiB)
            begin_cpu, begin = startup_cpu, time.monotonic()
            next_sample, launches, job = begin + sample_every, 0, 0
            gap = 1.0 / launches_per_second if launches_per_second else sample_every
            while time.monotonic() - begin < seconds:
                time.sleep(gap)
                if launches_per_second:  # the compiled front's real request, as a job starts
                    job += 1
                    request = {"op": "launch", "fresh_only": True, "job_id": str(job)}
                    ask(lab.node("n1").socket, request, timeout=5)
                    launches += 1
                if time.monotonic() >= next_sample:
                    next_sample += sample_every
                    at = time.monotonic() - begin
                    rss.append((at, process.memory_info().rss / 2**20))
            cpu = sum(process.cpu_times()[:2]) - begin_cpu
            wall = time.monotonic() - begin
            threads = _per_thread(pid, tasks_before, _tasks(pid), wall, cpu)
            runs = _check_runs(lab, "n1")
        finally:
            lab.down()
    return {
        "benchmark": "healthd_footprint",
        "gpus": 8,
        "checks": len(registry()),
        "interval_seconds": interval,
        "measured_seconds": round(wall, 1),
        "cpu_percent_of_one_core": round(100 * cpu / wall, 3),
        "startup_cpu_seconds": round(startup_cpu, 2),
        "store": "sqlite (the lab's)" if store_url is None else store_url.split(":", 1)[0],
        "rss_mb_first": round(rss[0][1], 2),
        "rss_mb_last": round(rss[-1][1], 2),
        "rss_mb_median": round(statistics.median(v for _, v in rss), 2),
        "rss_mb_max": round(max(v for _, v in rss), 2),
        "rss_warmup_seconds": warmup,
        # Least squares over the samples after the warm-up: what a week of uptime costs.
        "rss_slope_mib_per_hour": round(slope_per_hour([x for x in rss if x[0] >= warmup]), 3),
        "rss_samples": len(rss),
        "check_runs_per_minute": round(runs / (wall / 60), 1) if runs else None,
        "launch_requests": launches,
        "load_average_1m_at_end": round(psutil.getloadavg()[0], 2),
        "threads": threads,
    }


def trend_fill_seconds(interval: float) -> float:
    """How long the trend checks take to fill their series book (`keep` points per GPU and
    counter, one point per run): its memory grows until then, by design, and stays."""
    return TREND_KEEP * interval


def _tasks(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread's (ns on a CPU, voluntary context switches) now."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            on_cpu = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:  # it ended meanwhile
            continue
        switches = re.search(r"^voluntary_ctxt_switches:\s*(\d+)", status, re.M)
        found[int(tid)] = (on_cpu, int(switches.group(1)) if switches else 0)
    return found


def _thread_names(pid: int) -> dict[int, str]:
    """Thread id -> its Python name, from `py-spy dump` ({} without py-spy)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {}
    try:
        out = proc.run([spy, "dump", "--pid", str(pid)], timeout=30).stdout
    except OSError:
        return {}
    return {int(m[1]): m[2] for m in re.finditer(r'Thread (\d+) \(\w+\): "([^"]*)"', out)}


def _per_thread(
    pid: int,
    before: dict[int, tuple[int, int]],
    after: dict[int, tuple[int, int]],
    wall: float,
    cpu_seconds: float,
) -> dict[str, dict[str, float]]:
    """% of a core and voluntary switches a second per thread kind, busiest first; what
    threads that ended during the run spent is "(ended)": the process's CPU less the rest."""
    names = _thread_names(pid)
    cpu: dict[str, float] = {}
    switches: dict[str, float] = {}
    for tid, (ns, sw) in after.items():
        name = names.get(tid, f"tid {tid}")
        name = re.sub(r"^(check|nvml)(-.*)?$", r"\1 workers", name)
        ns0, sw0 = before.get(tid, (0, 0))
        cpu[name] = cpu.get(name, 0.0) + (ns - ns0)
        switches[name] = switches.get(name, 0.0) + (sw - sw0)
    ended = cpu_seconds * 1e9 - sum(cpu.values())
    if ended > 0:
        cpu["(ended)"] = ended
    return {
        name: {
            "percent_of_one_core": round(100 * ns / 1e9 / wall, 3),
            "voluntary_switches_per_s": round(switches.get(name, 0.0) / wall, 2),
        }
        for name, ns in sorted(cpu.items(), key=lambda kv: -kv[1])
    }


def _check_runs(lab: Lab, node: str) -> int:
    """Check runs the daemon counted (medic_check_runs_total, over its socket)."""
    text = ask(lab.node(node).socket, {"op": "metrics"}, timeout=5)["text"]
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("medic_check_runs_total{")
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--interval", type=float, default=10)
    parser.add_argument("--sample-every", type=float, default=5)
    parser.add_argument(
        "--launches-per-second",
        type=float,
        default=0.0,
        help="the prolog's real request (as medic-hook sends it) at this rate, e.g. 1",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        help="seconds left out of the slope (default: until the trend book is full, + 60 s)",
    )
    parser.add_argument("--store-url", help="the daemon's store (default: the lab's SQLite)")
    parser.add_argument(
        "--max-slope",
        type=float,
        default=0.1,
        help="MiB per hour of RSS after the warm-up above which the bench fails (exit 1)",
    )
    args = parser.parse_args()
    figures = footprint(
        args.seconds,
        args.interval,
        args.sample_every,
        args.launches_per_second,
        args.warmup,
        args.store_url,
    )
    print(json.dumps(figures))
    slope = figures["rss_slope_mib_per_hour"]
    if isinstance(slope, float) and slope > args.max_slope:
        print(
            f"healthd_footprint: RSS grows {slope} MiB/hour after the warm-up"
            f" (over --max-slope {args.max_slope})",
            file=sys.stderr,
        )
        raise SystemExit(1)


if __name__ == "__main__":
    main()

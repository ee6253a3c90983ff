"""Launch-verdict latency over the daemon's Unix socket, with the hooks' real requests: connect,
send one line, read the reply. Three request forms, interleaved call by call so that each
meets the same machine:

* hook: `{"op": "launch", "fresh_only": true, "job_id": N}`, what medic-hook (the compiled
  Prolog front) sends at every job start;
* prolog: `{"op": "launch", "budget": B, "job_id": N}`, what the Python prolog sends when
  the front hands over (stale results);
* bare: `{"op": "launch"}`, a verdict without a job (an operator's question; the form the
  earlier version of this bench timed).

The order of the forms is drawn anew every round, and of medic-hook and /bin/true every pair.
Each job id is new, so each hook and prolog call is a gate decision the daemon records.
Reported per form: p50, p90 and (with >= 1,000 calls) p99 with 95 % bootstrap intervals, the
reply's size, and the daemon's CPU per call (its own accounting, over the whole interleaved
run divided by the calls: all forms together), also less what the idle daemon spends in the
same time (its background checks; measured over 20 s just before). Also the machine's load
average, and whether every gate decision reached the store. Then `medic-hook` (the compiled
Prolog front, as slurmd starts it) is timed as a whole process in turn with `/bin/true`
(--hook-runs): what it adds, pair by pair. --pace spaces the calls (a node starts jobs one
after another, and the daemon writes each gate decision after its reply: back to back, that
write competes with the next call). The stale case (`launch_max_age = 0`: every request runs
the whole launch tier) is timed with the prolog's form.

Prints one JSON object. Run: .venv/bin/python -m bench.launch_latency --calls 3000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.stats import interval, pair_order, quantile
from cli.lab.cluster import Lab
from cli.lab.slurm_conf import LabSpec
from medic_core import proc
from medic_core.api import ask
from medic_core.store import open_store

FORMS = ("hook", "prolog", "bare")


def summary(times: list[float], sizes: list[int], rng: random.Random) -> dict[str, Any]:
    ordered = sorted(times)
    out: dict[str, Any] = {"calls": len(times)}
    quantiles = [("p50", 0.5), ("p90", 0.9)] + ([("p99", 0.99)] if len(times) >= 1000 else [])
    for label, q in quantiles:
        out[f"{label}_ms"] = round(quantile(ordered, q), 3)
        out[f"{label}_ci_ms"] = interval(times, q, rng)
    out["max_ms"] = round(ordered[-1], 3)
    out["reply_bytes"] = max(sizes)
    return out


def request(form: str, job_id: int) -> dict[str, Any]:
    if form == "hook":
        return {"op": "launch", "fresh_only": True, "job_id": str(job_id)}
    if form == "prolog":
        return {"op": "launch", "budget": 9.0, "job_id": str(job_id)}
    return {"op": "launch"}


def measure(
    lab: Lab, pid: int, calls: int, forms: tuple[str, ...], seed: int, pace: float = 0.0
) -> dict[str, Any]:
    sock = lab.node("n1").socket
    ask(sock, {"op": "launch"}, timeout=30)  # the first run fills the cache
    daemon = psutil.Process(pid)
    times: dict[str, list[float]] = {f: [] for f in forms}
    sizes: dict[str, list[int]] = {f: [] for f in forms}
    job_id = 10**6
    order_rng = random.Random(seed)
    idle_cpu_per_s = idle_cpu_rate(daemon)
    cpu_before = daemon.cpu_times()
    load_before = os.getloadavg()
    began = time.monotonic()
    for _ in range(calls):
        for form in pair_order(forms, order_rng):  # a new order each round
            job_id += 1
            line = json.dumps(request(form, job_id))
            started = time.perf_counter()
            reply = ask(sock, request(form, job_id), timeout=30)
            times[form].append((time.perf_counter() - started) * 1000)
            sizes[form].append(len(json.dumps(reply)) + 1)
            assert reply.get("allow", True) is True, (line, reply)
            assert "stale" not in reply, reply
            if pace:  # job starts one after another, not back to back
                time.sleep(pace)
    cpu_after = daemon.cpu_times()
    wall = time.monotonic() - began
    cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    rng = random.Random(seed)
    out: dict[str, Any] = {f: summary(times[f], sizes[f], rng) for f in forms}
    out["daemon_cpu_ms_per_call"] = round(cpu * 1000 / (calls * len(forms)), 3)
    # What the calls cost beyond what the daemon spends anyway (its background checks):
    # its idle CPU rate, measured just before, times the run's wall time, taken off.
    beyond_idle = max(cpu - idle_cpu_per_s * wall, 0.0)
    out["daemon_cpu_ms_per_call_beyond_idle"] = round(beyond_idle * 1000 / (calls * len(forms)), 3)
    out["daemon_idle_cpu_percent"] = round(100 * idle_cpu_per_s, 3)
    out["pace_s"] = pace
    out["load_avg_1m"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    recording = [f for f in forms if f != "bare"]
    out["gate_decisions_sent"] = calls * len(recording)
    return out


def idle_cpu_rate(daemon: psutil.Process, seconds: float = 20.0) -> float:
    """The daemon's CPU seconds per second while nobody asks it anything."""
    before = daemon.cpu_times()
    time.sleep(seconds)  # the measurement window itself, not a wait for something
    after = daemon.cpu_times()
    return ((after.user + after.system) - (before.user + before.system)) / seconds


def hook_process(lab: Lab, runs: int, seed: int) -> dict[str, Any]:
    """`medic-hook` (the compiled Prolog front) as slurmd runs it, a whole process asking
    the daemon, against `/bin/true` started the same way, in turn: the wall time of each,
    and what the hook adds (per pair) with a 95 % bootstrap interval of its median."""
    hook = lab.layout.lib_dir / "medic-hook"
    env = {
        "PATH": "/usr/bin:/bin",
        **lab.env("n1"),
        "MEDIC_SOCKET": str(lab.node("n1").socket),
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
    }
    walls: dict[str, list[float]] = {"hook": [], "true": []}
    argvs = {"hook": [str(hook)], "true": ["/bin/true"]}
    order_rng = random.Random(seed + 1)
    for n in range(runs + 3):  # the first three warm the page cache
        for name in pair_order(list(argvs), order_rng):  # who goes first: drawn per pair
            argv = argvs[name]
            env["SLURM_JOB_ID"] = str(2 * 10**6 + n)
            started = time.perf_counter()
            done = proc.run(argv, timeout=30, env=env)
            wall = (time.perf_counter() - started) * 1000
            assert done.returncode == 0, (argv, done.stderr)
            if n >= 3:
                walls[name].append(wall)
    added = [h - t for h, t in zip(walls["hook"], walls["true"], strict=True)]
    rng = random.Random(seed)
    return {
        "runs": runs,
        "hook_p50_ms": round(statistics.median(walls["hook"]), 3),
        "true_p50_ms": round(statistics.median(walls["true"]), 3),
        "added_p50_ms": round(statistics.median(added), 3),
        "added_p50_ci_ms": interval_median(added, rng),
        "added_p90_ms": round(quantile(sorted(added), 0.9), 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def interval_median(values: list[float], rng: random.Random) -> list[float]:
    estimates = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(1000))
    return [round(quantile(estimates, 0.025), 3), round(quantile(estimates, 0.975), 3)]


def gate_events(lab: Lab, expected: int, timeout: float = 30.0) -> int:
    """Gate events of the bench's jobs in the store, once all arrived (or at the deadline)."""
    deadline = time.monotonic() + timeout
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        while True:
            found = sum(
                1
                for e in store.events("n1", kind="gate", limit=expected + 100)
                if e.target.startswith("job:1")
            )
            if found >= expected or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def latency(
    calls: int,
    stale_calls: int,
    seed: int,
    venv_bin: Path | None = None,
    pace: float = 0.0,
    hook_runs: int = 200,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp), venv_bin=venv_bin)
        lab.up(LabSpec(nodes=1, gpus_per_node=8))
        try:
            pid = lab.start_healthd("n1")
            cached = measure(lab, pid, calls, FORMS, seed, pace)
            cached["gate_events_stored"] = gate_events(lab, cached["gate_decisions_sent"])
            process = hook_process(lab, hook_runs, seed) if hook_runs else None
            config = Path(tmp) / "stale.toml"
            text = lab.layout.medic_conf.read_text()
            config.write_text(text.replace("[healthd]\n", "[healthd]\nlaunch_max_age = 0\n", 1))
            pid = lab.start_healthd("n1", config=config)
            stale = measure(lab, pid, stale_calls, ("prolog",), seed)
        finally:
            lab.down()
    out = {"benchmark": "launch_latency", "gpus": 8, "cached": cached, "stale": stale}
    if process is not None:
        out["hook_process"] = process
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000, help="per request form")
    parser.add_argument("--stale-calls", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--venv-bin",
        type=Path,
        help="where the medic-healthd to time is (default: this venv's): an older checkout's",
    )
    parser.add_argument(
        "--pace", type=float, default=0.0, help="seconds between calls (default: back to back)"
    )
    parser.add_argument(
        "--hook-runs", type=int, default=200, help="medic-hook as a process (0: skip)"
    )
    args = parser.parse_args()
    hook_runs = args.hook_runs
    out = latency(args.calls, args.stale_calls, args.seed, args.venv_bin, args.pace, hook_runs)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

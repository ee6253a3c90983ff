"""Hangs (issue 14, part 1): what the progress heartbeat costs a job, what a look costs the
daemon, and, with --lab-runs, how long a hung resilient job takes to run again on the lab.

* heartbeat: nanoseconds per `Progress.step(n)`, per `Progress.step(n, busy)` (called
  through a lambda: one more Python call) and per `progress(n)` (the module-level call a
  training loop makes), the median of --batches batches of --calls calls each, next to an
  empty Python function call on the same machine;
* read: microseconds per `healthd.progress.read_beat` (the root daemon's safe read of one
  job's file) and per `healthd.hang.evaluate`;
* lab (--lab-runs N > 0): a 5-node lab, every node's medic-healthd with hang_floor 2 s,
  hang_factor 3, hang_poll 0.2 s; each run submits a --resilient job (a step every 0.1 s,
  a checkpoint every 10, blocked in a read after step 25) and times, from its last step:
  the hang declared (the job_action event's time) and the job running again from its
  checkpoint (the restarted run's resume mark, slurm_hooks.checkpoint).

* straggler (--straggler-runs N > 0): a 2-node lab, a lockstep job whose rank on n2 works
  0.3 s a step against 0.1 s on n1, daemons with straggler_every 1 s, ratio 1.5, 2 repeats:
  seconds (and steps) from the job's first step to n2's straggler event.

Prints one JSON object. Run: .venv/bin/python -m bench.hang [--lab-runs 5] [--straggler-runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from healthd.hang import HangSettings, Progress, evaluate, observe
from healthd.progress import prepare_dir, read_beat
from medic_core import heartbeat
from slurm_hooks import checkpoint
from slurm_hooks.checkpoint import Progress as Writer
from slurm_hooks.checkpoint import progress_heartbeat


def _per_call_ns(fn: Any, calls: int, batches: int) -> float:
    times = []
    for _ in range(batches):
        start = time.perf_counter_ns()
        for i in range(calls):
            fn(i)
        times.append((time.perf_counter_ns() - start) / calls)
    return round(statistics.median(times), 1)


def micro(calls: int, batches: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="medic-hb-") as tmp:
        directory = Path(tmp) / "progress"
        prepare_dir(directory)
        env = {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1", heartbeat.DIR_ENV: str(directory)}
        writer = Writer(env=env)
        progress_heartbeat._progress = Writer(env=env)  # what progress() opens on its first call

        def empty(i: int) -> None:
            return None

        figures: dict[str, Any] = {
            "step_ns": _per_call_ns(writer.step, calls, batches),
            "step_busy_ns": _per_call_ns(lambda i: writer.step(i, 0.05), calls, batches),
            "progress_ns": _per_call_ns(checkpoint.progress, calls, batches),
            "empty_call_ns": _per_call_ns(empty, calls, batches),
        }
        looks = max(1000, calls // 100)
        start = time.perf_counter_ns()
        for _ in range(looks):
            read_beat(directory, "1", "n1")
        figures["read_beat_us"] = round((time.perf_counter_ns() - start) / looks / 1000, 2)
        settings = HangSettings()
        progress = Progress("1")
        for i in range(30):
            progress = observe(progress, heartbeat.Beat(2, i, (i + 1) * 10**9, 1), i, settings)
        start = time.perf_counter_ns()
        for _ in range(looks):
            evaluate(progress, 100.0, settings)
        figures["evaluate_us"] = round((time.perf_counter_ns() - start) / looks / 1000, 2)
        writer.close()
    return figures


def lab_runs(runs: int) -> dict[str, Any]:
    from cli.lab.cluster import Lab, wait_for
    from cli.lab.slurm_conf import LabSpec
    from medic_core import proc
    from medic_core.store import open_store
    from tests.test_hang_lab import FLOOR, JOB

    detected, running = [], []
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp) / "lab")
        lab.up(LabSpec(nodes=5))
        try:
            conf = lab.layout.medic_conf
            extra = f"hang_floor = {FLOOR}\nhang_factor = 3.0\nhang_poll = 0.2\n"
            conf.write_text(conf.read_text().replace("[healthd]\n", f"[healthd]\n{extra}", 1))
            for name in lab.node_names():
                lab.start_healthd(name)
            script = Path(tmp) / "train.py"
            script.write_text(JOB)
            for run in range(runs):
                work = Path(tmp) / f"run{run}"
                work.mkdir()
                hung = work / "hung"
                env = lab.process_env()
                env["MEDIC_CHECKPOINT_DIR"] = str(work / "ckpt")
                env["PYTHONPATH"] = str(Path(__file__).parents[1])
                out = proc.run(
                    ["sbatch", "--parsable", "--resilient=2", f"--output={work / 'out'}",
                     "--open-mode=append", "--wrap", f"{sys.executable} {script} {hung}"],
                    timeout=15, env=env, check=True,
                )  # fmt: skip
                job_id = out.stdout.strip().split(";")[0]
                wait_for("the job to hang", hung.exists, 60, 0.02)
                stopped = json.loads(hung.read_text())["time"]
                ckpts = checkpoint.CheckpointDir(work / "ckpt")
                wait_for("the job to run again", lambda c=ckpts: bool(c.resumes()), 60, 0.02)
                resumed = ckpts.resumes()[0].time
                with open_store(f"sqlite:///{lab.layout.store_db}") as store:
                    hangs = [
                        e.at.timestamp()
                        for name in lab.node_names()
                        for e in store.events(name, kind="job_action")
                        if e.target == f"job:{job_id}" and e.evidence.get("action") == "hang"
                    ]
                detected.append(min(hangs) - stopped)
                running.append(resumed - stopped)
                print(
                    f"run {run}: hang declared {detected[-1]:.2f} s, running again "
                    f"{running[-1]:.2f} s after the last step",
                    file=sys.stderr,
                )
                lab.slurm(["scancel", job_id])
        finally:
            lab.down()

    def stats(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {
            "p50_s": round(statistics.median(values), 2),
            "max_s": round(ordered[-1], 2),
        }

    return {
        "runs": runs,
        "threshold_s": FLOOR,
        "budget_s": 2 * FLOOR + 5,
        "last_step_to_hang_declared": stats(detected),
        "last_step_to_running_again": stats(running),
    }


def straggler_runs(runs: int) -> dict[str, Any]:
    """A 2-node lockstep job (tests/test_hang_lab.py's JOB_SLOW: 0.3 s of work a step on n2,
    0.1 s on n1), daemons with straggler_every 1 s, ratio 1.5, 2 repeats: seconds and steps
    from the job's first step to n2's straggler event."""
    from cli.lab.cluster import Lab, wait_for
    from cli.lab.slurm_conf import LabSpec
    from medic_core import proc
    from medic_core.store import open_store
    from tests.test_hang_lab import JOB_SLOW

    seconds, steps = [], []
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp) / "lab")
        lab.up(LabSpec(nodes=2))
        try:
            conf = lab.layout.medic_conf
            extra = "hang_poll = 0.2\nstraggler_every = 1.0\nstraggler_ratio = 1.5\n"
            extra += "straggler_repeats = 2\n"
            conf.write_text(conf.read_text().replace("[healthd]\n", f"[healthd]\n{extra}", 1))
            for name in lab.node_names():
                lab.start_healthd(name)
            script = Path(tmp) / "slow.py"
            # The job notes when its first step was reported.
            script.write_text(
                JOB_SLOW.replace(
                    "    progress(step, busy)\n",
                    "    progress(step, busy)\n"
                    "    if step == 0 and rank == 0:\n"
                    "        (sync / 'first').write_text(repr(time.time()))\n",
                )
            )
            for run in range(runs):
                sync = Path(tmp) / f"sync{run}"
                sync.mkdir()
                env = lab.process_env()
                env["PYTHONPATH"] = str(Path(__file__).parents[1])
                line = f"srun --ntasks-per-node=1 {sys.executable} {script} n2 {sync}"
                out = proc.run(
                    ["sbatch", "--parsable", "-N2", f"--output={sync / 'out'}", "--wrap", line],
                    timeout=15, env=env, check=True,
                )  # fmt: skip
                target = f"job:{out.stdout.strip().split(';')[0]}"
                with open_store(f"sqlite:///{lab.layout.store_db}") as store:

                    def flagged(store: Any = store, target: str = target) -> list[Any]:
                        found = store.events("n2", kind="straggler")
                        return [e for e in found if e.target == target]

                    wait_for("n2 flagged", lambda: bool(flagged()), 60, 0.05)
                    at = flagged()[0].at.timestamp()
                    assert not [e for e in store.events("n1", kind="straggler")
                                if e.target == target]  # fmt: skip
                first = float((sync / "first").read_text())
                seconds.append(at - first)
                steps.append(int((at - first) / 0.3) + 1)
                print(f"straggler run {run}: flagged {seconds[-1]:.2f} s, ~{steps[-1]} steps "
                      "after the first", file=sys.stderr)  # fmt: skip
                lab.slurm(["scancel", target.removeprefix("job:")])
        finally:
            lab.down()
    return {
        "runs": runs,
        "first_step_to_flagged_s": {"p50": round(statistics.median(seconds), 2),
                                    "max": round(max(seconds), 2)},
        "steps_p50": statistics.median(steps),
        "settings": {"straggler_every": 1.0, "straggler_ratio": 1.5, "straggler_repeats": 2,
                     "hang_min_steps": 3, "step_s": 0.3},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--lab-runs", type=int, default=0)
    parser.add_argument("--straggler-runs", type=int, default=0)
    args = parser.parse_args()
    figures: dict[str, Any] = {"benchmark": "hang", "cpus": os.cpu_count()}
    figures["heartbeat"] = micro(args.calls, args.batches)
    if args.lab_runs:
        figures["lab"] = lab_runs(args.lab_runs)
    if args.straggler_runs:
        figures["straggler"] = straggler_runs(args.straggler_runs)
    figures["loadavg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()

"""What Medic's Prolog and Epilog add to a job's start: `srun -N1 true` timed end to end,
--calls times with Medic's hooks (medic-healthd answering the prolog from fresh results)
and --calls times with the Prolog and Epilog lines removed from slurm.conf (`scontrol
reconfigure` between the two), on the same one-node lab.

Prints one JSON object. Run: .venv/bin/python -m bench.prolog_overhead --calls 200
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from cli.lab.cluster import Lab
from cli.lab.slurm_conf import LabSpec


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_srun(lab: Lab, calls: int) -> list[float]:
    lab.slurm(["srun", "-N1", "true"], timeout=60)  # warm-up
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        lab.slurm(["srun", "-N1", "true"], timeout=60)
        times.append((time.perf_counter() - started) * 1000)
    return times


def summary(times: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p90_ms": round(percentile(times, 0.9), 1),
        "p99_ms": round(percentile(times, 0.99), 1),
    }


def overhead(calls: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(LabSpec(nodes=1))
        try:
            lab.start_healthd("n1")
            with_medic = time_srun(lab, calls)
            conf = lab.layout.slurm_conf
            lines = conf.read_text().splitlines()
            bare = [ln for ln in lines if not ln.startswith(("Prolog=", "Epilog="))]
            conf.write_text("\n".join(bare) + "\n")
            lab.slurm(["scontrol", "reconfigure"])
            without = time_srun(lab, calls)
        finally:
            lab.down()
    medic, bare_ = summary(with_medic), summary(without)
    return {
        "benchmark": "prolog_overhead",
        "calls": calls,
        "with_medic": medic,
        "without_prolog": bare_,
        "added_p50_ms": round(medic["p50_ms"] - bare_["p50_ms"], 1),
        "added_p99_ms": round(medic["p99_ms"] - bare_["p99_ms"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(overhead(args.calls)))


if __name__ == "__main__":
    main()

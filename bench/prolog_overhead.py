"""What Medic's Prolog and Epilog add to a job: `srun -N1 true` timed end to end, --calls
times each with Prolog and Epilog, with the Prolog only, and with neither (slurm.conf
rewritten and `scontrol reconfigure` between them), on the same one-node lab with
medic-healthd answering the prolog from fresh results.

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


def reconfigure(lab: Lab, keep: tuple[str, ...]) -> None:
    """slurm.conf with only the hook lines in `keep` (of Prolog=, Epilog=)."""
    conf = lab.layout.slurm_conf
    lines = conf.read_text().splitlines()
    hooks = ("Prolog=", "Epilog=")
    kept = [ln for ln in lines if not ln.startswith(hooks) or ln.startswith(keep)]
    conf.write_text("\n".join(kept) + "\n")
    lab.slurm(["scontrol", "reconfigure"])


def overhead(calls: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(LabSpec(nodes=1))
        try:
            lab.start_healthd("n1")
            original = lab.layout.slurm_conf.read_text()
            both = time_srun(lab, calls)
            reconfigure(lab, ("Prolog=",))
            prolog_only = time_srun(lab, calls)
            reconfigure(lab, ())
            without = time_srun(lab, calls)
            lab.layout.slurm_conf.write_text(original)
        finally:
            lab.down()
    with_both, with_prolog, bare = summary(both), summary(prolog_only), summary(without)
    return {
        "benchmark": "prolog_overhead",
        "calls": calls,
        "prolog_and_epilog": with_both,
        "prolog_only": with_prolog,
        "no_hooks": bare,
        "prolog_added_p50_ms": round(with_prolog["p50_ms"] - bare["p50_ms"], 1),
        "prolog_added_p99_ms": round(with_prolog["p99_ms"] - bare["p99_ms"], 1),
        "both_added_p50_ms": round(with_both["p50_ms"] - bare["p50_ms"], 1),
        "both_added_p99_ms": round(with_both["p99_ms"] - bare["p99_ms"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(overhead(args.calls)))


if __name__ == "__main__":
    main()

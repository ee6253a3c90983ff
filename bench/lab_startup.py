"""How fast `medic lab up` brings a cluster to all-IDLE, and `down` back to nothing.

Prints one JSON object: median/min/max seconds for up (to every node IDLE, library build
and host trees included) and down, over --runs cycles, plus processes left behind.
Run: .venv/bin/python -m bench.lab_startup --runs 5
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


def measure(runs: int, nodes: int) -> dict[str, object]:
    ups: list[float] = []
    downs: list[float] = []
    leftovers = 0
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
            lab = Lab(Path(tmp))
            started = time.monotonic()
            lab.up(LabSpec(nodes=nodes))
            ups.append(time.monotonic() - started)
            started = time.monotonic()
            lab.down()
            downs.append(time.monotonic() - started)
            leftovers += len(lab.tagged_pids())
    return {
        "benchmark": "lab_startup",
        "nodes": nodes,
        "runs": runs,
        "up_seconds_median": round(statistics.median(ups), 3),
        "up_seconds_min": round(min(ups), 3),
        "up_seconds_max": round(max(ups), 3),
        "down_seconds_median": round(statistics.median(downs), 3),
        "processes_left_behind": leftovers,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(measure(args.runs, args.nodes)))


if __name__ == "__main__":
    main()

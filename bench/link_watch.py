"""What the daemon's link watch (healthd/link_watch.py) costs per look: one read of every
InfiniBand port's state and phys_state under a host tree, as the daemon does each second.

Prints one JSON object: the fixture tree's port count, the CPU time (thread_time) and wall
time per look (p50/p90 with 95 % intervals, max) over --looks looks, and the share of a core
that one look a second costs at the median.
Run: .venv/bin/python -m bench.link_watch --looks 5000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import tempfile
import time
from pathlib import Path

from bench.stats import described
from healthd.fixtures import write_host_tree
from healthd.link_watch import LINK_TICK, LinkWatch, port_states
from medic_core import proc


def measure(looks: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        root = Path(tmp)
        write_host_tree(root)
        watch = LinkWatch(root, lambda names: None)
        watch.look()  # warm: the first read only learns the ports
        cpu: list[float] = []
        wall: list[float] = []
        for _ in range(looks):
            c0, w0 = time.thread_time(), time.perf_counter()
            watch.look()
            cpu.append((time.thread_time() - c0) * 1e6)
            wall.append((time.perf_counter() - w0) * 1e6)
        ports = len(port_states(root))
    rng = random.Random(0)
    cpu_us = described(cpu, rng, unit="us")
    commit = proc.run(["git", "rev-parse", "--short", "HEAD"], timeout=30).stdout.strip()
    return {
        "bench": "link_watch",
        "date": dt.date.today().isoformat(),
        "commit": commit,
        "ports": ports,
        "looks": looks,
        "cpu": cpu_us,
        "wall": described(wall, rng, unit="us"),
        "core_share_pct_at_p50": round(float(str(cpu_us["p50_us"])) / 1e6 / LINK_TICK * 100, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--looks", type=int, default=5000)
    args = parser.parse_args()
    print(json.dumps(measure(args.looks)))


if __name__ == "__main__":
    main()

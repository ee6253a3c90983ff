"""Launch-verdict latency over the daemon's Unix socket, as the prolog sees it: connect, send
`{"op": "launch"}`, read the verdict. Two cases:

* cached: launch-tier results are fresh (the daemon's periodic runs keep them so), the
  usual case for a prolog;
* stale: `launch_max_age = 0`, so every request runs the whole launch tier (8 GPUs through
  NVML, IB, filesystems, memory, CPUs, services) before answering: the worst case.

Prints one JSON object. Run: .venv/bin/python -m bench.launch_latency --calls 2000
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
from healthd.api import ask


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(lab: Lab, calls: int) -> dict[str, float]:
    sock = lab.node("n1").socket
    ask(sock, {"op": "launch"}, timeout=30)  # the first run fills the cache
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        verdict = ask(sock, {"op": "launch"}, timeout=30)
        times.append((time.perf_counter() - started) * 1000)
        assert verdict["status"] in ("OK", "WARN", "NOT_APPLICABLE"), verdict["status"]
    return {
        "calls": calls,
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(percentile(times, 0.99), 3),
        "max_ms": round(max(times), 3),
    }


def latency(calls: int, stale_calls: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(LabSpec(nodes=1, gpus_per_node=8))
        try:
            lab.start_healthd("n1")
            cached = measure(lab, calls)
            config = Path(tmp) / "stale.toml"
            text = lab.layout.medic_conf.read_text()
            config.write_text(text.replace("[healthd]\n", "[healthd]\nlaunch_max_age = 0\n", 1))
            lab.start_healthd("n1", config=config)
            stale = measure(lab, stale_calls)
        finally:
            lab.down()
    return {"benchmark": "launch_latency", "gpus": 8, "cached": cached, "stale": stale}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--stale-calls", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(latency(args.calls, args.stale_calls)))


if __name__ == "__main__":
    main()

"""Early warning (issue 14, part 2): how long before a failure the trends check drains a node,
on the lab.

A 2-node lab; n1's medic-healthd runs the gpu_trends check every second over a 30 s window
(min_span 3 s, min_points 4; the default limit, 100 correctable errors an hour). Each run
raises correctable ECC on GPU 3 of n1 step by step, one step a second, doubling (5, 10, 20,
...), and at step --fail-step injects the failure the ramp announces: an uncorrectable
error (the gpu_ecc check's CRITICAL: an unplanned interruption, a requeue of any job).
Measured per run, from the ramp's first step:

* warned_s: n1's gpu_trends condition first seen WARN in the store (polled every 50 ms);
* drained_s: Slurm shows n1 drained by Medic (reason medic: gpu.trend...);
* failed_s: the uncorrectable error injected;
* lead_s = failed_s - drained_s: how long before the failure the node was out of the
  scheduler's hands, its running job left to finish.

With the defaults (a sample a minute, min_span 600 s) the same ramp is seen after 10
minutes at the earliest: the lab's figures measure the mechanism, not a real GPU's pace.

Prints one JSON object. Run: .venv/bin/python -m bench.trend_lead_time [--runs 3]
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

TRENDS = "interval = 1\nwindow = 30\nmin_span = 3\nmin_points = 4"
GPU = 3


def one_run(lab: Any, conf: Path, fail_step: int) -> dict[str, float]:
    from medic_core.store import open_store
    from tests.lab_views import drained_by_medic

    lab.reset()
    lab.start_healthd("n1", config=conf)
    store = open_store(f"sqlite:///{lab.layout.store_db}")
    start = time.time()
    step, warned, drained, failed = 0, 0.0, 0.0, 0.0
    deadline = time.monotonic() + fail_step + 30
    while time.monotonic() < deadline and not (drained and failed):
        if not warned and any(
            str(c.status) == "WARN" for c in store.conditions("n1", type="gpu_trends")
        ):
            warned = time.time() - start
        due = start + step
        if step < fail_step and time.time() >= due:
            lab.inject("n1", GPU, [f"ecc.sbe={5 * 2**step}"])
            step += 1
        elif step == fail_step and not failed and time.time() >= due:
            lab.inject("n1", GPU, ["ecc.dbe=1"])
            failed = time.time() - start
        if not drained and drained_by_medic(lab, "n1"):
            drained = time.time() - start
        time.sleep(0.05)  # pacing the scripted ramp, not waiting for a result
    store.close()
    if not drained:
        raise RuntimeError("n1 was never drained on the trend")
    print(
        f"warned {warned:.2f} s, drained {drained:.2f} s, failure at {failed:.2f} s:"
        f" lead {failed - drained:.2f} s",
        file=sys.stderr,
    )
    return {
        "warned_s": warned,
        "drained_s": drained,
        "failed_s": failed,
        "lead_s": failed - drained,
    }


def evaluate_cost(looks: int = 200) -> float:
    """Milliseconds per pure evaluation of a full node: 8 GPUs x 8 counters x 60 points, each
    series a `Series` as the check's gather hands it over (stats from its running sums)."""
    from healthd.checks.gpu_common import GpuSample, GpuSamples
    from healthd.checks.gpu_trends import GpuSeries, TrendsCheck, TrendsConfig, TrendsObservation
    from healthd.nvml_client import Reading
    from healthd.trends import COUNTERS, Series

    now = 1_800_000_000.0
    points = [(now - 60 * (59 - i), float(i * i)) for i in range(60)]
    series = {c: Series.of(points) for c in COUNTERS}
    samples = tuple(GpuSample(g, None, Reading(GpuSeries(series))) for g in range(8))
    obs = TrendsObservation(GpuSamples(Reading(8), samples), now)
    cfg = TrendsConfig()
    start = time.perf_counter()
    for _ in range(looks):
        TrendsCheck.evaluate(obs, cfg)
    return round((time.perf_counter() - start) / looks * 1000, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fail-step", type=int, default=10, help="step of the DBE (seconds)")
    args = parser.parse_args(argv)

    from cli.lab.cluster import Lab
    from cli.lab.slurm_conf import LabSpec, with_check_options

    runs = []
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp) / "lab")
        lab.up(LabSpec(nodes=2))
        try:
            conf = Path(tmp) / "medic.toml"
            text = with_check_options(lab.layout.medic_conf.read_text(), {"gpu_trends": TRENDS})
            conf.write_text(text)
            runs = [one_run(lab, conf, args.fail_step) for _ in range(args.runs)]
        finally:
            lab.down()

    def summary(key: str) -> dict[str, float]:
        values = [r[key] for r in runs]
        return {"p50_s": round(statistics.median(values), 2), "min_s": round(min(values), 2),
                "max_s": round(max(values), 2)}  # fmt: skip

    print(
        json.dumps(
            {
                "benchmark": "trend_lead_time",
                "cpus": os.cpu_count(),
                "loadavg_1m": round(os.getloadavg()[0], 2),
                "evaluate_8_gpus_ms": evaluate_cost(),
                "runs": len(runs),
                "settings": {
                    "interval_s": 1,
                    "window_s": 30,
                    "min_span_s": 3,
                    "min_points": 4,
                    "ecc_corrected_limit_per_hour": 100,
                },
                "ramp": "ecc.sbe doubling each second from 5 on one GPU",
                "fail_step_s": args.fail_step,
                "ramp_start_to_warn": summary("warned_s"),
                "ramp_start_to_drain": summary("drained_s"),
                "lead_time_before_failure": summary("lead_s"),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

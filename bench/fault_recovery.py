"""From a GPU fault to a drained node, and to the resilient job running again elsewhere.

Each run: a resilient one-node job runs on some node; XID 79 is injected on that node at
t0; "drained" is when sinfo first shows the node DRAIN with Medic's reason; "running
again" is when the job is RUNNING again with one more restart. Between runs the node is
rebooted (the lab's simulated reboot clears the XID), its daemon restarted and the node
resumed. The lab runs with cred_expire=10: a requeued job is not eligible for cred_expire+1
seconds, which dominates "running again" (Slurm's default is 120).

Prints one JSON object. Run: .venv/bin/python -m bench.fault_recovery --runs 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cli.lab.cluster import Lab, wait_for
from cli.lab.slurm_conf import LabSpec


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def squeue_job(lab: Lab, job_id: str) -> dict[str, Any]:
    jobs = json.loads(lab.slurm(["squeue", "--json", "--jobs", job_id]).stdout)["jobs"]
    found: dict[str, Any] = next(j for j in jobs if str(j["job_id"]) == job_id)
    return found


def node(lab: Lab, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(n for n in lab.sinfo_nodes() if n["name"] == name)
    return found


def one_run(lab: Lab) -> tuple[float, float]:
    out = lab.slurm(["sbatch", "--parsable", "--resilient=5", "-N1", "--wrap", "sleep 600"])
    job_id = out.stdout.strip().split(";")[0]
    wait_for("job running", lambda: squeue_job(lab, job_id)["job_state"] == "RUNNING", 30, 0.02)
    victim = squeue_job(lab, job_id)["nodes"]
    restarts = squeue_job(lab, job_id)["restart_cnt"]
    t0 = time.monotonic()
    lab.inject(victim, 0, ["xid=79"])

    def drained() -> bool:
        n = node(lab, victim)
        return "DRAIN" in n["state_flags"] and n["reason"].startswith("medic:")

    wait_for("drained", drained, 30, 0.02)
    t_drained = time.monotonic() - t0

    def running_again() -> bool:
        j = squeue_job(lab, job_id)
        return bool(j["job_state"] == "RUNNING" and j["restart_cnt"] > restarts)

    wait_for("running again", running_again, 120, 0.05)
    t_running = time.monotonic() - t0
    lab.slurm(["scancel", job_id])
    lab.stop_healthd(victim)
    lab.reboot_node(victim)
    lab.start_healthd(victim)
    lab.slurm(["scontrol", "update", f"nodename={victim}", "state=resume"], check=False)
    wait_for("victim idle", lambda: "DRAIN" not in node(lab, victim)["state_flags"], 30, 0.05)
    return t_drained, t_running


def measure(runs: int) -> dict[str, object]:
    drained: list[float] = []
    running: list[float] = []
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(LabSpec(nodes=5))
        try:
            for name in lab.node_names():
                lab.start_healthd(name)
            for _ in range(runs):
                d, r = one_run(lab)
                drained.append(d)
                running.append(r)
        finally:
            lab.down()
    return {
        "benchmark": "fault_recovery",
        "runs": runs,
        "cred_expire_seconds": 10,
        "drained_p50_s": round(statistics.median(drained), 3),
        "drained_p90_s": round(percentile(drained, 0.9), 3),
        "running_again_p50_s": round(statistics.median(running), 2),
        "running_again_p90_s": round(percentile(running, 0.9), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(measure(args.runs)))


if __name__ == "__main__":
    main()

"""From a GPU fault to a drained node, to the resilient job running again elsewhere, and to
the node repaired by the ladder and back in service.

Each run: a resilient one-node job runs on some node; an XID is injected on that node at
t0; "drained" is when sinfo first shows the node DRAIN with Medic's reason; "running
again" is when the job is RUNNING again with one more restart; "back in service" is when
the ladder has repaired, re-qualified and resumed the node. XID 79 (NVIDIA: RESTART_BM)
takes the reboot path (the lab's simulated reboot: slurmd restarted with -b); XID 95
(RESET_GPU) the GPU-reset path. The lab runs with cred_expire=10: a requeued job that lands
on a node of its old allocation waits cred_expire+1 seconds (Slurm's default is 120).

Each figure is bench.stats.described: p50 with its 95 % bootstrap interval, p90 only from 20
runs or more (else the max, named so), and the two groups apart when the runs fall in two
(back in service does: the ladder's re-qualification lands on one tick or the next).

Prints one JSON object. Run: .venv/bin/python -m bench.fault_recovery --runs 20
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import described
from cli.lab.cluster import Lab, LabError, wait_for
from cli.lab.slurm_conf import LabSpec


def squeue_job(lab: Lab, job_id: str) -> dict[str, Any]:
    jobs = json.loads(lab.slurm(["squeue", "--json", "--jobs", job_id]).stdout)["jobs"]
    found: dict[str, Any] = next(j for j in jobs if str(j["job_id"]) == job_id)
    return found


def node(lab: Lab, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(n for n in lab.sinfo_nodes() if n["name"] == name)
    return found


def back_in_service(lab: Lab, name: str) -> bool:
    n = node(lab, name)
    state = str(n["state"]).upper()
    return "DRAIN" not in n["state_flags"] and state in ("IDLE", "MIXED", "ALLOCATED")


def one_run(lab: Lab, xid: int) -> tuple[float, float, float]:
    started = lab.root / f"bench-{time.monotonic_ns()}.started"
    script = f"touch {started}; sleep 600"
    out = lab.slurm(["sbatch", "--parsable", "--resilient=5", "-N1", "--wrap", script])
    job_id = out.stdout.strip().split(";")[0]
    # squeue says RUNNING while the prolog still runs: the script's own mark says it started.
    wait_for("job running", started.exists, 30, 0.02)
    victim = squeue_job(lab, job_id)["nodes"]
    restarts = squeue_job(lab, job_id)["restart_cnt"]
    t0 = time.monotonic()
    lab.inject(victim, 0, [f"xid={xid}"])

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
    # The ladder repairs the node and resumes it by itself: reset or reboot, re-qualify.
    wait_for("node back in service", lambda: back_in_service(lab, victim), 180, 0.1)
    t_back = time.monotonic() - t0
    lab.slurm(["scancel", job_id])
    try:
        wait_for("job gone", lambda: squeue_job_gone(lab, job_id), 60, 0.05)
    except LabError as exc:
        left = json.loads(lab.slurm(["squeue", "--json", "--jobs", job_id]).stdout)["jobs"]
        states = [(j["job_state"], j.get("nodes"), j.get("state_reason")) for j in left]
        raise LabError(f"{exc}: job {job_id} is {states}") from exc
    print(
        f"xid {xid} on {victim}: drained {t_drained:.2f} s, running again {t_running:.2f} s,"
        f" back in service {t_back:.2f} s",
        file=sys.stderr,
    )
    return t_drained, t_running, t_back


def squeue_job_gone(lab: Lab, job_id: str) -> bool:
    jobs = json.loads(lab.slurm(["squeue", "--json", "--jobs", job_id]).stdout)["jobs"]
    return all(j["job_state"] not in ("RUNNING", "PENDING", "COMPLETING") for j in jobs)


def measure(runs: int, seed: int = 1) -> dict[str, object]:
    rng = random.Random(seed)
    paths = {"reboot_path_xid79": 79, "reset_path_xid95": 95}
    figures: dict[str, object] = {"benchmark": "fault_recovery", "runs": runs}
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(LabSpec(nodes=5))
        try:
            # The same fault on node after node, run after run, is exactly what the lemon
            # and fleet-wide rails stop; this measures the repair path, so they step aside.
            conf = lab.layout.medic_conf
            rails = "[remediation]\nlemon_episodes = 1000\nfleet_signature_nodes = 1000\n"
            conf.write_text(conf.read_text().replace("[remediation]\n", rails, 1))
            for name in lab.node_names():
                lab.start_healthd(name)
            for label, xid in paths.items():
                drained, running, back = [], [], []
                for _ in range(runs):
                    d, r, b = one_run(lab, xid)
                    drained.append(d)
                    running.append(r)
                    back.append(b)
                figures[label] = {
                    "fault_to_drained": described(drained, rng, unit="s"),
                    "fault_to_job_running_again": described(running, rng, unit="s"),
                    "fault_to_node_back_in_service": described(back, rng, unit="s"),
                }
        finally:
            lab.down()
    figures["cred_expire_seconds"] = 10
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20, help="per path (p90 needs 20)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(measure(args.runs, args.seed)))


if __name__ == "__main__":
    main()

"""From a GPU fault to a drained node, to the resilient job running again elsewhere, and to
the node repaired by the ladder and back in service.

Each run: a resilient one-node job runs on some node; an XID is injected on that node at
t0; "drained" is when Slurm first shows the node DRAIN with Medic's reason; "requeued" when
the job shows one more restart; "eligible" when it no longer waits on the BeginTime Slurm
gives a requeued job (Medic's releaser clears it once slurmctld's clock has left the
requeue's second); "running again" when squeue says RUNNING; "script started" when the
job's own script has started again; "back in service" when the ladder has repaired,
re-qualified and resumed the node. XID 79 (NVIDIA: RESTART_BM) takes the reboot path (the
lab's simulated reboot: slurmd restarted with -b); XID 95 (RESET_GPU) the GPU-reset path.

`--slurm 24.11|26.05` runs the lab on that release (cli/lab/debian_root.py); `--scheduler=`
runs it with Slurm's default SchedulerParameters (batch_sched_delay=3) instead of the lab's
`batch_sched_delay=0,sched_min_interval=0`, to show what that setting is worth.

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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.stats import described
from cli.lab.cluster import Lab, LabError, wait_for
from cli.lab.slurm_conf import LabSpec
from medic_core.slurm import JobInfo, parse_jobs


def squeue_jobs(lab: Lab, job_id: str) -> list[JobInfo]:
    """The job's records in every release's layout (24.11 prints `job_state` as a list)."""
    return parse_jobs(lab.slurm(["squeue", "--json", "--jobs", job_id]).stdout)


def squeue_job(lab: Lab, job_id: str) -> JobInfo:
    return next(j for j in squeue_jobs(lab, job_id) if j.job_id == job_id)


def node(lab: Lab, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(n for n in lab.sinfo_nodes() if n["name"] == name)
    return found


def back_in_service(lab: Lab, name: str) -> bool:
    n = node(lab, name)
    state = str(n["state"]).upper()
    return "DRAIN" not in n["state_flags"] and state in ("IDLE", "MIXED", "ALLOCATED")


@dataclass
class RunTimes:
    """Seconds from the fault (t0) to each stage of one run."""

    drained: float
    requeued: float  # Slurm shows the job PENDING with one more restart
    eligible: float  # no longer waiting on its BeginTime (Medic's releaser cleared it)
    running_again: float  # squeue says RUNNING (the prolog may still run)
    script_started: float  # the job's own script wrote its mark on the new node
    back_in_service: float


def one_run(lab: Lab, xid: int) -> RunTimes:
    started = lab.root / f"bench-{time.monotonic_ns()}.started"
    script = f"touch {started}; sleep 600"
    out = lab.slurm(["sbatch", "--parsable", "--resilient=5", "-N1", "--wrap", script])
    job_id = out.stdout.strip().split(";")[0]
    # squeue says RUNNING while the prolog still runs: the script's own mark says it started.
    wait_for("job running", started.exists, 30, 0.02)
    started.unlink()
    victim = squeue_job(lab, job_id).nodes
    restarts = squeue_job(lab, job_id).restart_count
    t0 = time.monotonic()
    lab.inject(victim, 0, [f"xid={xid}"])

    def drained() -> bool:
        n = node(lab, victim)
        return "DRAIN" in n["state_flags"] and n["reason"].startswith("medic:")

    wait_for("drained", drained, 30, 0.02)
    t_drained = time.monotonic() - t0
    # One poll of squeue a loop (~10-20 ms each) marks each stage the first time it is seen.
    seen: dict[str, float] = {}

    def running_again() -> bool:
        j = squeue_job(lab, job_id)
        now = time.monotonic() - t0
        again = j.restart_count > restarts
        waiting = j.state == "PENDING" and j.reason == "BeginTime"
        if again:  # COMPLETING while its old steps end, then PENDING on its BeginTime
            seen.setdefault("requeued", now)
        if waiting:
            seen.setdefault("waiting", now)
        elif "waiting" in seen:
            seen.setdefault("eligible", now)
        return again and j.state == "RUNNING"

    wait_for("running again", running_again, 120, 0.02)
    t_running = time.monotonic() - t0
    wait_for("script started again", started.exists, 60, 0.02)
    t_script = time.monotonic() - t0
    # The ladder repairs the node and resumes it by itself: reset or reboot, re-qualify.
    wait_for("node back in service", lambda: back_in_service(lab, victim), 180, 0.1)
    t_back = time.monotonic() - t0
    lab.slurm(["scancel", job_id])
    try:
        wait_for("job gone", lambda: squeue_job_gone(lab, job_id), 60, 0.05)
    except LabError as exc:
        states = [(j.state, j.nodes, j.reason) for j in squeue_jobs(lab, job_id)]
        raise LabError(f"{exc}: job {job_id} is {states}") from exc
    times = RunTimes(
        drained=t_drained,
        requeued=seen.get("requeued", t_running),
        eligible=seen.get("eligible", t_running),
        running_again=t_running,
        script_started=t_script,
        back_in_service=t_back,
    )
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in asdict(times).items())
    print(f"xid {xid} on {victim}: {stages}", file=sys.stderr)
    return times


def squeue_job_gone(lab: Lab, job_id: str) -> bool:
    return all(
        j.state not in ("RUNNING", "PENDING", "COMPLETING") for j in squeue_jobs(lab, job_id)
    )


def measure(
    runs: int, seed: int = 1, release: str = "22.05", scheduler: str | None = None
) -> dict[str, object]:
    rng = random.Random(seed)
    paths = {"reboot_path_xid79": 79, "reset_path_xid95": 95}
    spec = LabSpec(nodes=5, slurm=release)
    if scheduler is not None:
        spec = replace(spec, scheduler_parameters=scheduler)
    figures: dict[str, object] = {
        "benchmark": "fault_recovery",
        "runs": runs,
        "slurm": release,
        "scheduler_parameters": spec.scheduler_parameters or "(Slurm's defaults)",
    }
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(spec)
        try:
            # The same fault on node after node, run after run, is exactly what the lemon
            # and fleet-wide rails stop; this measures the repair path, so they step aside.
            conf = lab.layout.medic_conf
            rails = "[remediation]\nlemon_episodes = 1000\nfleet_signature_nodes = 1000\n"
            conf.write_text(conf.read_text().replace("[remediation]\n", rails, 1))
            for name in lab.node_names():
                lab.start_healthd(name)
            for label, xid in paths.items():
                runs_seen = [one_run(lab, xid) for _ in range(runs)]
                figures[label] = {
                    f"fault_to_{stage}": described(
                        [getattr(r, stage) for r in runs_seen], rng, unit="s"
                    )
                    for stage in asdict(runs_seen[0])
                }
        finally:
            lab.down()
    figures["cred_expire_seconds"] = 10
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20, help="per path (p90 needs 20)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slurm", default="22.05", help="the lab's release (22.05, 24.11, 26.05)")
    parser.add_argument(
        "--scheduler",
        help="slurm.conf SchedulerParameters ('' for Slurm's defaults; default: the lab's)",
    )
    args = parser.parse_args()
    print(json.dumps(measure(args.runs, args.seed, args.slurm, args.scheduler)))


if __name__ == "__main__":
    main()

"""Single-GPU isolation on the lab's Slurm 22.05: how long taking GPU 5 out of n1's GRES and
putting it back take, from the isolator's call to Slurm showing n1 registered with the new
count and in service (the lab's apply command: per-node slurm.conf and gres.conf, n1's slurmd
stopped, slurmctld restarted, slurmd started), and how long a job on another node waits
meanwhile (none is killed: slurmctld's restart keeps every job).

Each run: isolate (gpu:8 -> gpu:7), restore (gpu:7 -> gpu:8), n1 idle both times; a job
runs on n2 throughout and must still be RUNNING at the end.

Prints one JSON object. Run: .venv/bin/python -m bench.isolation --runs 5
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.stats import described
from cli.lab.cluster import Lab, wait_for
from cli.lab.slurm_conf import LabSpec
from medic_core.drain_reason import format_reason
from medic_core.settings import IsolationSettings
from medic_core.slurm import CliSlurm
from medic_core.store import open_store
from remediation import episodes as ep
from remediation.isolation import RESTORED, recorded
from remediation.isolator import Isolator


def measure(runs: int) -> dict[str, object]:
    isolate_s: list[float] = []
    restore_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        lab = Lab(Path(tmp))
        lab.up(LabSpec(nodes=2))
        try:
            slurm = CliSlurm(env=lab.env(), timeout=15)
            settings = IsolationSettings(
                enabled=True,
                apply=(sys.executable, "-m", "cli.lab.isolate", "--lab-root", str(lab.root),
                       "--node", "{node}", "--keep", "{keep}"),
                settle_timeout=30.0,
            )  # fmt: skip
            other = lab.slurm(
                ["sbatch", "--parsable", "-w", "n2", "--gres=gpu:8", "--wrap", "sleep 3600"]
            ).stdout.strip()

            def other_state() -> str:
                fields = lab.slurm(["scontrol", "-o", "show", "job", other]).stdout
                return next(w for w in fields.split() if w.startswith("JobState="))[9:]

            wait_for("the job on n2 to run", lambda: other_state() == "RUNNING", 30)
            with open_store(f"sqlite:///{lab.layout.store_db}") as store:
                episodes = ep.EpisodeStore(store)
                isolator = Isolator("n1", episodes, slurm, settings)
                for run in range(runs):
                    slurm.drain("n1", format_reason("gpu.xid.94", "gpu5"))
                    episode = episodes.open_episode(
                        "n1", state=ep.WAITING_IDLE, fault_class="gpu.xid.94", target="5",
                        check="gpu_xid", recommendation="gpu_reset", rung=1,
                        message=f"bench run {run}", evidence={},
                    )  # fmt: skip
                    started = time.monotonic()
                    isolated = isolator.isolate(episode, gpus_total=8)
                    isolate_s.append(time.monotonic() - started)
                    assert isolated is not None
                    started = time.monotonic()
                    restored = isolator.restore(isolated, jobs_running=False)
                    restore_s.append(time.monotonic() - started)
                    record = recorded(restored.evidence)
                    assert record is not None and record.state == RESTORED
                    episodes.update(episode.id, state=ep.RESOLVED)
                    print(
                        f"run {run}: {isolate_s[-1]:.2f} s, {restore_s[-1]:.2f} s", file=sys.stderr
                    )
            other_after = other_state()
        finally:
            lab.down()
    rng = random.Random(1)
    return {
        "benchmark": "isolation",
        "runs": runs,
        "slurm": "22.05 (Debian 12), lab on loopback, 2 nodes",
        "isolate_gpu8_to_gpu7": described(isolate_s, rng, unit="s"),
        "restore_gpu7_to_gpu8": described(restore_s, rng, unit="s"),
        "job_on_other_node_after_all_runs": other_after,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(measure(args.runs)))


if __name__ == "__main__":
    main()

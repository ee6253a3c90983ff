"""The README demo: each step prints the command it runs and what it printed.

Brings up a lab, runs a 3-node GPU job, shows sinfo and the simulated GPUs as pynvml sees
them on a node, injects an XID 79 and a DBE, drains and resumes a node, reboots one through
Slurm's RebootProgram, and tears everything down.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

from cli.lab.cluster import Lab
from medic_core import proc


def show(lab: Lab, argv: list[str], title: str = "") -> str:
    if title:
        print(f"\n# {title}")
    print(f"$ {shlex.join(argv)}")
    result = proc.run(argv, timeout=60, env=lab.process_env())
    text = (result.stdout + result.stderr).rstrip()
    if text:
        print(text)
    if not result.ok:
        raise SystemExit(f"demo: {argv[0]} failed: {result.describe_failure()}")
    return result.stdout


def wait_job(lab: Lab, job_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = lab.slurm(["scontrol", "show", "job", "-o", job_id]).stdout
        if "JobState=COMPLETED" in out:
            return
        time.sleep(0.1)
    raise SystemExit(f"demo: job {job_id} did not complete in {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="medic-demo")
    parser.add_argument("--dir", type=Path, help="lab directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="leave the lab running")
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="medic-demo-"))
    medic = str(Path(sys.executable).parent / "medic")
    lab = Lab(root)
    try:
        show(
            lab,
            [medic, "lab", "up", "--dir", str(root)],
            "a real slurmctld and 5 slurmd, 8 simulated GPUs each",
        )
        show(lab, ["sinfo"])
        job = show(
            lab,
            [
                "sbatch",
                "--parsable",
                "-N3",
                "--gpus-per-node=8",
                f"--output={root}/job-%j.out",
                "--wrap",
                "srun bash -c 'echo $SLURMD_NODENAME got GPUs $CUDA_VISIBLE_DEVICES'",
            ],
            "a 3-node job asking for 8 GPUs per node",
        ).strip()
        wait_job(lab, job)
        print((root / f"job-{job}.out").read_text().rstrip())
        show(
            lab,
            ["srun", "-w", "n3", "-N1", sys.executable, "-m", "cli.lab.gpu_table"],
            "the unmodified pynvml on n3 reads the simulated GPUs",
        )
        show(
            lab,
            [medic, "lab", "inject", "--dir", str(root), "n3", "--gpu", "2", "xid=79", "ecc.dbe=1"],
            "inject a fault: GPU 2 of n3 falls off the bus (XID 79) with a double-bit ECC error",
        )
        show(lab, ["srun", "-w", "n3", "-N1", sys.executable, "-m", "cli.lab.gpu_table"])
        show(
            lab,
            ["scontrol", "update", "nodename=n3", "state=drain", "reason=medic: gpu.xid.79 gpu2"],
            "drain it (from the next issue on, Medic does this by itself)",
        )
        show(lab, ["sinfo", "-R"])
        show(
            lab,
            ["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=medic: reboot", "n3"],
            "reboot it through Slurm: the lab's RebootProgram restarts its slurmd with -b",
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            n.name == "n3" and n.is_idle for n in lab.nodes()
        ):
            time.sleep(0.1)
        show(lab, [medic, "lab", "status", "--dir", str(root)])
        show(
            lab,
            ["srun", "-w", "n3", "-N1", sys.executable, "-m", "cli.lab.gpu_table"],
            "after the reboot the volatile counters are clear",
        )
    finally:
        if not args.keep:
            show(
                lab,
                [medic, "lab", "down", "--dir", str(root)],
                "tear down: every daemon stopped by PID",
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The README demo: each step prints the command it runs and what it printed.

Brings up a lab with medic-healthd on every node, runs a resilient 2-node training job that
checkpoints, injects XID 79 on one of its nodes mid-run, and shows Medic drain the node and
requeue the job, the job resume from its last checkpoint on healthy nodes and finish with
the same result as an uninterrupted run, the ladder repairing the node by itself, and the
lab torn down.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cli.lab.cluster import Lab, slack, wait_for
from cli.lab.debian_root import HOST_RELEASE, SUITES
from cli.lab.train import uninterrupted
from medic_core import proc


def show(lab: Lab, argv: list[str], title: str = "", node: str | None = None) -> str:
    """Run and print `argv` (`node`: as run on that node, which matters for its own store)."""
    if title:
        print(f"\n# {title}")
    print(f"$ {shlex.join(argv)}")
    result = proc.run(argv, timeout=60, env=lab.process_env(node))
    text = (result.stdout + result.stderr).rstrip()
    if text:
        print(text)
    if not result.ok:
        raise SystemExit(f"demo: {argv[0]} failed: {result.describe_failure()}")
    return result.stdout


def wait_job(lab: Lab, job_id: str, timeout: float = 30) -> None:
    timeout *= slack()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = lab.slurm(["scontrol", "show", "job", "-o", job_id]).stdout
        if "JobState=COMPLETED" in out:
            return
        time.sleep(0.1)
    raise SystemExit(f"demo: job {job_id} did not complete in {timeout:.0f}s")


def wait_for_text(path: Path, predicate: Callable[[str], bool], timeout: float) -> str:
    timeout *= slack()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if predicate(text):
            return text
        time.sleep(0.1)
    raise SystemExit(f"demo: {path} did not show what was expected in {timeout:.0f}s")


def job_field(lab: Lab, job_id: str, field: str) -> str:
    out = lab.slurm(["scontrol", "show", "job", "-o", job_id]).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith(f"{field}=")), "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="medic-demo")
    parser.add_argument("--dir", type=Path, help="lab directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="leave the lab running")
    parser.add_argument(
        "--production",
        action="store_true",
        help="the lab's production mode: the wheel, the unit's sandbox, a store per node",
    )
    parser.add_argument(
        "--venv", type=Path, help="with --production: a venv holding the wheel already"
    )
    parser.add_argument(
        "--slurm", default=HOST_RELEASE, choices=[HOST_RELEASE, *SUITES], help="Slurm release"
    )
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="medic-demo-"))
    medic = str(Path(sys.executable).parent / "medic")
    lab = Lab(root)
    steps, pace = 40, 0.25
    try:
        up = [medic, "lab", "up", "--dir", str(root)]
        if args.slurm != HOST_RELEASE:
            up += ["--slurm", args.slurm]
        show(
            lab,
            [*up, "--production", *(["--venv", str(args.venv)] if args.venv else [])]
            if args.production
            else up,
            "a real slurmctld, 5 slurmd with 8 simulated GPUs each, medic-healthd on every node"
            + (" (the built wheel, each daemon in the unit's sandbox)" if args.production else ""),
        )
        if args.production:  # from here on, Medic's own commands are the wheel's
            medic = str(lab.state().venv_bin) + "/medic"
        # The jobs' Python: a newer release's jobs run in its Debian root, on that root's.
        python = sys.executable
        if args.slurm != HOST_RELEASE:
            python = str(lab.state().venv_bin) + "/python"
        show(lab, ["sinfo"])
        show(
            lab,
            ["srun", "-w", "n2", "-N1", python, "-m", "cli.lab.gpu_table"],
            "the unmodified pynvml on n2 reads the simulated GPUs",
        )
        work = root / "train"
        work.mkdir(exist_ok=True)
        script = work / "train.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"exec {python} -m cli.lab.train {work / 'ckpt'} {work / 'result'}"
            f" {steps} {pace}\n"
        )
        job = (
            show(
                lab,
                [
                    "sbatch",
                    "--parsable",
                    "--resilient=2",
                    "-N2",
                    "--gpus-per-node=8",
                    f"--output={work}/job-%j.out",
                    str(script),
                ],
                f"a resilient 2-node training job: {steps} steps, a checkpoint after each",
            )
            .strip()
            .split(";")[0]
        )
        log = work / "train.log"
        # Generous deadlines: a loaded machine (a CI box running tests beside the demo) can
        # take tens of seconds to start the job's Python on both nodes.
        wait_for_text(log, lambda t: "start" in t, 90)
        fifth = work / "ckpt" / "step-000000005" / "state"
        wait_for("the fifth checkpoint", fifth.exists, 60, 0.1)
        nodes = lab.slurm(["scontrol", "show", "hostnames", job_field(lab, job, "NodeList")])
        victim = nodes.stdout.split()[1]
        show(lab, ["squeue"], "it runs; checkpoints are coming in")
        show(
            lab,
            [medic, "lab", "inject", "--dir", str(root), victim, "--gpu", "2", "xid=79"],
            f"GPU 2 of {victim} falls off the bus (XID 79) in the middle of the run",
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "medic:" not in lab.slurm(["sinfo", "-R"]).stdout:
            time.sleep(0.05)
        show(lab, ["sinfo", "-R"], "medic-healthd drained the node at once, with its reason")
        show(
            lab,
            ["squeue", "-o", "%.6i %.10T %.8r %.10R %.4z %k"],
            "and requeued the job (restarts within its --resilient budget)",
        )
        wait_for_text(log, lambda t: t.count("start") >= 2, 90)
        # The old allocation's epilog may still show as COMPLETING for a moment.
        running = lambda: job_field(lab, job, "JobState") == "RUNNING"  # noqa: E731
        wait_for("the job running again", running, 30, 0.05)
        show(lab, ["squeue"], "a few seconds later the job is back, on healthy nodes")
        wait_job(lab, job, timeout=120)
        print(f"\n# the job's own log: it resumed from its last checkpoint\n{log.read_text()}")
        result = (work / "result").read_text()
        same = result == uninterrupted(steps)
        print(f"final state {result[:16]}... equals an uninterrupted run's: {same}")
        deadline = time.monotonic() + 60 * slack()
        while time.monotonic() < deadline and not any(
            n.name == victim and n.is_idle for n in lab.nodes()
        ):
            time.sleep(0.1)
        # The ladder records "repaired and re-qualified" once Slurm's resume returned: the
        # node can show idle a moment before the node's store has it (a loaded CI run).
        node_show = [medic, "node", "show", victim]
        while time.monotonic() < deadline:
            shown = proc.run(node_show, timeout=60, env=lab.process_env(victim))
            if "re-qualified" in shown.stdout:
                break
            time.sleep(0.2)
        show(
            lab,
            node_show,
            f"meanwhile the ladder repaired {victim} by itself (XID 79: NVIDIA says reboot):"
            " a reboot through Slurm, re-qualified, resumed",
            node=victim,  # on the node: with a store per node, the one that knows
        )
        show(lab, [medic, "lab", "status", "--dir", str(root)])
        if not same:
            raise SystemExit("demo: the resumed run's result differs from an uninterrupted run")
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

"""Medic's job-start cost beside LBNL NHC's, for anyone who has NHC installed.

NHC (https://github.com/mej/nhc) is not in Debian 12 and Medic does not ship it: this takes
the `nhc` on PATH, or --nhc PATH (and --nhc-confdir for an install whose scripts are not in
/etc/nhc/scripts). Without one it prints {"nhc": "absent", ...} and how to get it.

On a one-node lab with medic-healthd running, it starts, in turn, `medic-hook` as slurmd
starts the Prolog (it asks the daemon, which answers from its fresh launch-tier results) and
`nhc` with a configuration of nine host checks of the same kinds as Medic's launch tier
(file systems mounted read-write, free space and inodes, CPUs, memory and free memory, load,
a file), each as a whole process, in an order drawn anew for each pair: the wall time of
each, and NHC's time over Medic's pair by pair, with 95 % bootstrap intervals.

Prints one JSON object. Run: .venv/bin/python -m bench.nhc_compare --runs 400
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.stats import described, interval, pair_order
from cli.lab.cluster import Lab
from cli.lab.slurm_conf import LabSpec
from medic_core import proc
from medic_core.api import ask

# Nine host checks, one per line (NHC's own check names); MARK_OFFLINE=0: never touch Slurm.
NHC_CHECKS = (
    "check_fs_mount_rw -f /",
    "check_fs_mount_rw -f /proc -t proc",
    "check_fs_free / 1%",
    "check_fs_ifree / 1%",
    "check_hw_cpuinfo",
    "check_hw_physmem 1MB 100TB",
    "check_hw_physmem_free 1MB",
    "check_ps_loadavg 1000",
    "check_file_test -r /etc/hostname",
)
HOW_TO_GET_NHC = (
    "NHC is not in Debian 12: install a release of https://github.com/mej/nhc (its RPM, or"
    " the tarball's ./configure --prefix=/usr --sysconfdir=/etc && make install), then run"
    " this again, or give --nhc PATH [--nhc-confdir DIR]"
)


def nhc_conf() -> str:
    return "\n".join(["* || export MARK_OFFLINE=0", *(f"* || {c}" for c in NHC_CHECKS)]) + "\n"


def nhc_argv(nhc: Path, conf: Path, confdir: Path | None, result: Path) -> list[str]:
    argv = [str(nhc)]
    if confdir is not None:
        argv += ["-D", str(confdir)]
    return [*argv, "-c", str(conf), "-l", "-", "-t", "30", f"RESULTFILE={result}"]


def fresh(lab: Lab, timeout: float = 60.0) -> None:
    """Until the daemon answers the front's question from fresh results."""
    socket = lab.node("n1").socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        request = {"op": "launch", "fresh_only": True, "job_id": "1"}
        if ask(socket, request, timeout=5).get("allow"):
            return
        ask(socket, {"op": "launch", "job_id": "1", "budget": 10}, timeout=15)
    raise RuntimeError("medic-healthd never answered from fresh results")


def compare(nhc: Path, confdir: Path | None, runs: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    walls: dict[str, list[float]] = {"medic": [], "nhc": []}
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        conf, result = Path(tmp) / "nhc.conf", Path(tmp) / "nhc.status"
        conf.write_text(nhc_conf())
        lab = Lab(Path(tmp) / "lab")
        lab.up(LabSpec(nodes=1, gpus_per_node=8))
        try:
            lab.start_healthd("n1")
            fresh(lab)
            env = {
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                **lab.env("n1"),
                "MEDIC_SOCKET": str(lab.node("n1").socket),
                "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
            }
            commands = {
                "medic": [str(lab.layout.lib_dir / "medic-hook")],
                "nhc": nhc_argv(nhc, conf, confdir, result),
            }
            for n in range(runs + 3):  # the first three warm the page cache
                for name in pair_order(list(commands), rng):  # who goes first: drawn per pair
                    argv = commands[name]
                    env["SLURM_JOB_ID"] = str(3 * 10**6 + n)
                    started = time.perf_counter()
                    done = proc.run(argv, timeout=60, env=env, cwd=Path(tmp))
                    wall = (time.perf_counter() - started) * 1000
                    if done.returncode != 0:
                        raise RuntimeError(f"{name} failed: {(done.stdout + done.stderr)[-500:]}")
                    if n >= 3:
                        walls[name].append(wall)
        finally:
            lab.down()
    ratios = [b / a for a, b in zip(walls["medic"], walls["nhc"], strict=True)]
    return {
        "benchmark": "nhc_compare",
        "nhc": str(nhc),
        "nhc_checks": len(NHC_CHECKS),
        "runs": runs,
        "medic_hook": described(walls["medic"], rng),
        "nhc_run": described(walls["nhc"], rng),
        "ratio_nhc_over_medic_p50": round(statistics.median(ratios), 1),
        "ratio_p50_ci": [round(x, 1) for x in interval(ratios, 0.5, rng)],
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nhc", type=Path, help="the nhc to run (default: nhc on PATH)")
    parser.add_argument("--nhc-confdir", type=Path, help="NHC's -D: where its scripts/ are")
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    found = args.nhc or (Path(p) if (p := shutil.which("nhc")) else None)
    if found is None or not os.access(found, os.X_OK):
        print(json.dumps({"benchmark": "nhc_compare", "nhc": "absent", "how": HOW_TO_GET_NHC}))
        return
    print(json.dumps(compare(found, args.nhc_confdir, args.runs, args.seed)))


if __name__ == "__main__":
    main()

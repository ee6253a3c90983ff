"""The lab's `[remediation.isolation] apply` command: what a site's configuration management
does on Slurm 22.05 to take GPUs out of one node's GRES (or put them back).

    python -m cli.lab.isolate --lab-root R --node n1 --keep 0-4,6-7
    python -m cli.lab.isolate --lab-root R --node n1 --keep all

It writes the node's own NodeName line (Gres=gpu:<count>) into slurm.conf and its File= list
into gres.conf, then stops the node's slurmd, restarts slurmctld and starts the slurmd again
(22.05 takes a lower count of GPUs with device files from neither `scontrol update` nor
`scontrol reconfigure`); with MEDIC_GRES_CHANGE=reconfigure (Medic's isolator sets it on
24.11 and later) `scontrol reconfigure` in place of the restart. It sets a state, so running
it twice changes nothing more. The overrides are kept in etc/gres-keep.json; `medic lab up`
starts without any.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cli.lab.cluster import Lab, LabError, pid_alive
from cli.lab.processes import read_pid, terminate
from cli.lab.slurm_conf import render_gres_conf, render_slurm_conf
from medic_core.slurm_release import GRES_CHANGE_ENV, RECONFIGURE, RESTART


def parse_keep(text: str, gpus: int) -> list[int] | None:
    """ "0-4,6-7" -> [0, 1, 2, 3, 4, 6, 7]; "all" -> None (every GPU)."""
    if text == "all":
        return None
    keep: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"--keep {text!r}: give GPU indexes such as 0-4,6-7, or all")
        keep.update(range(int(low), int(high or low) + 1))
    if not keep or max(keep) >= gpus:
        raise ValueError(f"--keep {text!r}: the node has GPUs 0-{gpus - 1}")
    return sorted(keep)


def apply(
    lab: Lab, node: str, keep: list[int] | None, timeout: float = 30.0, change: str = RESTART
) -> None:
    state = lab.state()
    layout = lab.layout
    lab.node(node)  # refuses a node the lab does not have
    overrides_file = layout.etc / "gres-keep.json"
    try:
        overrides: dict[str, list[int]] = json.loads(overrides_file.read_text())
    except FileNotFoundError:
        overrides = {}
    if keep is None or len(keep) == state.spec.gpus_per_node:
        overrides.pop(node, None)
    else:
        overrides[node] = keep
    layout.slurm_conf.write_text(
        render_slurm_conf(state.spec, layout, state.ports, state.host, overrides)
    )
    (layout.etc / "gres.conf").write_text(render_gres_conf(state.spec, layout, overrides))
    overrides_file.write_text(json.dumps(overrides))
    # slurmd down first: a slurmd that still reports the old GPUs to the new controller
    # (fewer than it is told) would have the node set INVAL and drained.
    pid = read_pid(layout.node(node).slurmd_pid)
    if pid and pid_alive(pid):
        terminate([pid], timeout / 2)
    if change == RECONFIGURE:  # 24.11+: slurmctld re-executes itself and takes the count
        lab.slurm(["scontrol", "reconfigure"], timeout=timeout / 2)
    else:
        lab.stop_slurmctld(timeout / 2)
        lab.start_slurmctld()
    lab.start_slurmd(node)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.lab.isolate")
    parser.add_argument("--lab-root", required=True, type=Path)
    parser.add_argument("--node", required=True)
    parser.add_argument("--keep", required=True, help='GPU indexes to keep, e.g. 0-4,6-7, or "all"')
    args = parser.parse_args(argv)
    lab = Lab(args.lab_root)
    try:
        keep = parse_keep(args.keep, lab.state().spec.gpus_per_node)
        # Medic's isolator says how this release takes the change (medic_core.slurm_release).
        change = os.environ.get(GRES_CHANGE_ENV, RESTART)
        apply(lab, args.node, keep, change=change)
    except (ValueError, LabError) as exc:
        print(f"cli.lab.isolate: {exc}", file=sys.stderr)
        return 2
    shown = "every GPU" if keep is None else f"GPUs {args.keep}"
    done = "slurmctld reconfigured" if change == RECONFIGURE else "slurmctld restarted"
    print(f"{args.node}: GRES lists {shown}; {done}, slurmd restarted")
    return 0


if __name__ == "__main__":
    sys.exit(main())

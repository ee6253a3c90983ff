"""The lab's stand-ins for `nvidia-smi --gpu-reset` and an NVIDIA driver reload: real
commands (the remediation ladder runs them as argv with a timeout, as it would the real
ones) that apply what the repair would do to a node's simulated GPUs (cli.lab.scenario).

    python -m cli.lab.repair --lab-root R gpu-reset --node n3 --gpu 2
    python -m cli.lab.repair --lab-root R driver-reload --node n3

Like nvidia-smi, a reset refuses a GPU that processes still use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli.lab import scenario as scenario_mod


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.lab.repair")
    parser.add_argument("--lab-root", required=True, type=Path)
    sub = parser.add_subparsers(dest="action", required=True)
    reset = sub.add_parser("gpu-reset")
    reset.add_argument("--node", required=True)
    reset.add_argument("--gpu", required=True, type=int)
    reload_ = sub.add_parser("driver-reload")
    reload_.add_argument("--node", required=True)
    args = parser.parse_args(argv)

    from cli.lab.layout import LabLayout

    node = LabLayout(args.lab_root.resolve()).node(args.node)
    path, kmsg = node.scenario, node.host_root / "dev/kmsg"
    try:
        current = scenario_mod.read_scenario(path)
    except FileNotFoundError:
        print(f"no scenario for node {args.node} at {path}", file=sys.stderr)
        return 2
    if args.action == "gpu-reset":
        if not 0 <= args.gpu < len(current.gpus):
            print(f"GPU {args.gpu} not found on {args.node}", file=sys.stderr)
            return 2
        gpu = current.gpus[args.gpu]
        if gpu.processes:
            pids = ", ".join(str(p.pid) for p in gpu.processes)
            print(
                f"GPU {gpu.pci_bus_id}: unable to reset: in use by processes {pids}",
                file=sys.stderr,
            )
            return 255
        scenario_mod.publish(path, kmsg, current, scenario_mod.gpu_reset(current, args.gpu))
        print(f"GPU {gpu.pci_bus_id} was successfully reset.")
        return 0
    scenario_mod.publish(path, kmsg, current, scenario_mod.driver_reload(current))
    print(f"{args.node}: NVIDIA driver unloaded and loaded again")
    return 0


if __name__ == "__main__":
    sys.exit(main())

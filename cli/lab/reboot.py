"""The lab's RebootProgram. slurmd runs it with no arguments and no SLURMD_NODENAME, and
several slurmd share this host, so the node is found from the process tree: the nearest
ancestor that is a slurmd started with `-N <node>`. The reboot itself (stop slurmd, clear
what a reboot clears, start slurmd -b) runs detached, because it kills our own parent.

Kept free of click and the store so that it starts fast under slurmd.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _ppid_and_cmdline(pid: int, proc_root: Path) -> tuple[int, list[str]]:
    stat = (proc_root / str(pid) / "stat").read_text()
    ppid = int(stat.rsplit(")", 1)[1].split()[1])
    cmdline = (proc_root / str(pid) / "cmdline").read_bytes().split(b"\0")
    return ppid, [part.decode() for part in cmdline if part]


def find_slurmd_ancestor(pid: int, proc_root: Path = Path("/proc")) -> tuple[int, str] | None:
    """(slurmd pid, node name) of the nearest slurmd ancestor of `pid`, if any."""
    while pid > 1:
        try:
            ppid, argv = _ppid_and_cmdline(pid, proc_root)
        except (OSError, ValueError, IndexError):
            return None
        if argv and Path(argv[0]).name == "slurmd" and "-N" in argv:
            index = argv.index("-N")
            if index + 1 < len(argv):
                return pid, argv[index + 1]
        pid = ppid
    return None


def main(argv: list[str] | None = None) -> int:
    import os

    parser = argparse.ArgumentParser(prog="medic-lab-reboot")
    parser.add_argument("--lab-root", required=True, type=Path)
    parser.add_argument("--node", help="node to reboot (found from the process tree if absent)")
    parser.add_argument("--slurmd-pid", type=int)
    args = parser.parse_args(argv)

    from cli.lab.cluster import Lab
    from medic_core import proc

    lab = Lab(args.lab_root)
    if args.node is None:
        found = find_slurmd_ancestor(os.getppid())
        if found is None:
            print("medic-lab-reboot: not started by a lab slurmd; pass --node", file=sys.stderr)
            return 2
        slurmd_pid, node = found
        # Detach: the reboot stops the slurmd that is waiting for us.
        proc.spawn(
            [
                sys.executable,
                "-m",
                "cli.lab.reboot",
                "--lab-root",
                str(lab.root),
                "--node",
                node,
                "--slurmd-pid",
                str(slurmd_pid),
            ],
            log_path=lab.layout.node(node).dir / "reboot.log",
            env=lab.process_env(node),
        )
        return 0
    lab.reboot_node(args.node, slurmd_pid=args.slurmd_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())

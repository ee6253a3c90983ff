"""What the lab needs of its host: Debian's Slurm and munge packages, a block of free
loopback ports, and /dev/nvidiaN device files."""

from __future__ import annotations

import os
import random
import shutil
import socket
import stat
from pathlib import Path

from cli.lab.processes import LabError
from medic_core import proc

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NVIDIA_MAJOR = 195
# libslurm-dev and gcc build the --resilient SPANK plugin (and gcc the NVML library).
DEBIAN_PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client", "libslurm-dev", "gcc")
DAEMONS = {
    "munged": "/usr/sbin/munged",
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
}

# Below Linux's default ephemeral range (32768-60999): a slurmd restarted by a simulated
# reboot must find its port free, not taken by some process's outgoing connection.
LAB_PORTS = range(20000, 32000)


def free_port_block(count: int) -> int:
    """First port of `count` consecutive free loopback ports."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(LAB_PORTS.start, LAB_PORTS.stop - count)
        if all(port_free(first + i) for i in range(count)):
            return first
    raise LabError("no block of free loopback ports found")


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def make_gpu_devices(dev: Path, count: int) -> None:
    """/dev/nvidiaN as character devices with the NVIDIA driver's major number (195), as on
    a real host; without root they fall back to plain files, which slurmd accepts noisily."""
    dev.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = dev / f"nvidia{index}"
        if path.exists():
            continue
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, index))
        except PermissionError:
            path.touch()


def ensure_packages() -> None:
    """Install Debian's Slurm and munge packages when a daemon is missing (root only)."""
    missing = [name for name, path in DAEMONS.items() if not Path(path).exists()]
    if not missing and shutil.which("sinfo"):
        return
    if os.geteuid() != 0:
        raise LabError(
            f"{', '.join(missing) or 'sinfo'} not installed; as root run: "
            f"apt-get install {' '.join(DEBIAN_PACKAGES)}"
        )
    env = {"PATH": SYSTEM_PATH, "DEBIAN_FRONTEND": "noninteractive"}
    proc.run(["apt-get", "update", "-qq"], timeout=300, env=env, check=True)
    proc.run(
        ["apt-get", "install", "-y", "-qq", *DEBIAN_PACKAGES], timeout=600, env=env, check=True
    )

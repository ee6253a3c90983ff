"""A realistic host tree (/sys, /proc, /dev and mount points) below a root directory, for
the lab cluster and the tests. Faults are injected by editing the files afterwards, e.g.
writing "1: DOWN" to sys/class/infiniband/mlx5_0/ports/1/state.

Only the files healthd reads are laid out, in the formats the kernel writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

PROFILES: dict[str, Callable[[Path], None]] = {}

IB_COUNTERS = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
)

# Roughly an 8x H100 SXM node with 2 TiB of DDR5: MemTotal is below the installed size
# because firmware and the kernel keep some.
H100_MEMINFO_KB = {
    "MemTotal": 2113561600,
    "MemFree": 2046871552,
    "MemAvailable": 2071126016,
    "Buffers": 11264,
    "Cached": 25108480,
    "SwapCached": 0,
    "Active": 9023488,
    "Inactive": 18340864,
    "Active(anon)": 2449408,
    "Inactive(anon)": 0,
    "Active(file)": 6574080,
    "Inactive(file)": 18340864,
    "Unevictable": 30720,
    "Mlocked": 27648,
    "SwapTotal": 0,
    "SwapFree": 0,
    "Dirty": 128,
    "Writeback": 0,
    "AnonPages": 2302976,
    "Mapped": 1029120,
    "Shmem": 165888,
    "KReclaimable": 1698816,
    "Slab": 5238784,
    "SReclaimable": 1698816,
    "SUnreclaim": 3539968,
    "KernelStack": 61440,
    "PageTables": 40960,
    "NFS_Unstable": 0,
    "Bounce": 0,
    "WritebackTmp": 0,
    "CommitLimit": 1056780800,
    "Committed_AS": 9830400,
    "VmallocTotal": 34359738367,
    "VmallocUsed": 1126400,
    "VmallocChunk": 0,
    "Percpu": 229376,
    "HardwareCorrupted": 0,
    "AnonHugePages": 1249280,
    "ShmemHugePages": 0,
    "ShmemPmdMapped": 0,
    "FileHugePages": 0,
    "FilePmdMapped": 0,
    "Hugepagesize": 2048,
    "Hugetlb": 0,
    "DirectMap4k": 1529636,
    "DirectMap2M": 73592832,
    "DirectMap1G": 2076180480,
}
_MEMINFO_COUNTS = {"HugePages_Total": 0, "HugePages_Free": 0, "HugePages_Rsvd": 0}

# (device, mount point, type, options); every mount point is created below the root.
H100_MOUNTS = (
    ("sysfs", "/sys", "sysfs", "rw,nosuid,nodev,noexec,relatime"),
    ("proc", "/proc", "proc", "rw,nosuid,nodev,noexec,relatime"),
    ("devtmpfs", "/dev", "devtmpfs", "rw,nosuid,size=1056780800k,nr_inodes=264195200,mode=755"),
    ("/dev/nvme0n1p2", "/", "ext4", "rw,relatime,errors=remount-ro"),
    ("tmpfs", "/run", "tmpfs", "rw,nosuid,nodev,noexec,relatime,size=211356160k,mode=755"),
    (
        "nfs01:/export/home",
        "/home",
        "nfs4",
        "rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,"
        "timeo=600,retrans=2,sec=sys,clientaddr=10.1.4.17,local_lock=none,addr=10.1.0.5",
    ),
    ("10.10.0.1@o2ib:10.10.0.2@o2ib:/lustre", "/lustre", "lustre", "rw,flock,lazystatfs,encrypt"),
    ("/dev/md0", "/scratch", "ext4", "rw,noatime,stripe=256"),
)

# (pid, comm, state); comm is cut to 15 characters as the kernel does.
H100_PROCESSES = (
    (1, "systemd", "S"),
    (1001, "munged", "S"),
    (1002, "nvidia-persistenced", "S"),
    (1003, "slurmd", "S"),
)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_ib_port(
    root: Path,
    hca: str,
    port: int = 1,
    *,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    rate: str = "400 Gb/sec (4X NDR)",
    link_layer: str = "InfiniBand",
) -> Path:
    """One HCA port with zeroed counters; returns the port directory."""
    port_dir = root / "sys/class/infiniband" / hca / "ports" / str(port)
    for name, value in (
        ("state", state),
        ("phys_state", phys_state),
        ("rate", rate),
        ("link_layer", link_layer),
        ("lid", "0x0"),
        ("sm_lid", "0x1"),
        ("cap_mask", "0xa751e848"),
    ):
        _write(port_dir / name, value + "\n")
    for counter in IB_COUNTERS:
        _write(port_dir / "counters" / counter, "0\n")
    hca_dir = port_dir.parent.parent
    _write(hca_dir / "fw_ver", "28.39.1002\n")
    _write(hca_dir / "hca_type", "MT4129\n")
    _write(hca_dir / "board_id", "MT_0000000838\n")
    return port_dir


def write_process(root: Path, pid: int, comm: str, state: str = "S") -> None:
    pid_dir = root / "proc" / str(pid)
    _write(pid_dir / "comm", comm[:15] + "\n")
    _write(pid_dir / "cmdline", f"/usr/sbin/{comm}\0")
    _write(pid_dir / "stat", f"{pid} ({comm[:15]}) {state} 1 {pid} {pid} 0 -1 4194560\n")


def write_mounts(root: Path, mounts: tuple[tuple[str, str, str, str], ...]) -> None:
    lines = [f"{dev} {point} {fstype} {opts} 0 0" for dev, point, fstype, opts in mounts]
    _write(root / "proc/mounts", "\n".join(lines) + "\n")
    for _, point, _, _ in mounts:
        (root / point.lstrip("/")).mkdir(parents=True, exist_ok=True)


def meminfo_text(memtotal_kb: int = H100_MEMINFO_KB["MemTotal"]) -> str:
    values = dict(H100_MEMINFO_KB, MemTotal=memtotal_kb)
    lines = []
    for key, value in values.items():
        if key == "Hugepagesize":  # the kernel prints the page counts just before it
            lines += [f"{f'{k}:':<16}{v:>8}" for k, v in _MEMINFO_COUNTS.items()]
        lines.append(f"{f'{key}:':<16}{value:>8} kB")
    return "\n".join(lines) + "\n"


def _h100_8gpu(root: Path) -> None:
    for i in range(8):
        write_ib_port(root, f"mlx5_{i}")
    # The front-end NIC: a ConnectX in Ethernet mode, listed by the RDMA core all the same.
    write_ib_port(root, "mlx5_8", rate="100 Gb/sec (2X HDR)", link_layer="Ethernet")
    _write(root / "proc/meminfo", meminfo_text())
    write_mounts(root, H100_MOUNTS)
    for mc in range(4):
        mc_dir = root / "sys/devices/system/edac/mc" / f"mc{mc}"
        _write(mc_dir / "ce_count", "0\n")
        _write(mc_dir / "ue_count", "0\n")
        _write(mc_dir / "mc_name", "I10 memory controller\n")
        _write(mc_dir / "size_mb", "524288\n")
    cpu = root / "sys/devices/system/cpu"
    for name in ("online", "possible", "present"):
        _write(cpu / name, "0-111\n")
    _write(cpu / "offline", "\n")
    _write(root / "dev/kmsg", "")
    # Changes at every boot; the remediation ladder tells a completed reboot by it.
    _write(root / "proc/sys/kernel/random/boot_id", "6f1c2b7e-58a4-4a5e-9c1e-3f0d2a7b9e11\n")
    for pid, comm, state in H100_PROCESSES:
        write_process(root, pid, comm, state)


PROFILES["h100-8gpu"] = _h100_8gpu


def write_host_tree(root: Path, profile: str = "h100-8gpu") -> None:
    """Lay out a host tree for `profile` below `root` (existing files are overwritten)."""
    try:
        build = PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}") from None
    root.mkdir(parents=True, exist_ok=True)
    build(root)

"""The simulated GPUs of one lab node: the immutable `NodeScenario` (its GPUs, XID events,
failing and hanging NVML calls), the fault vocabulary injections use, and the default
healthy HGX H100 node.

GPU numbers here are slots (positions in the scenario). NVML indexes count present GPUs
only, so while a GPU is `missing` the later GPUs' NVML indexes shift down, as on real nodes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1
DEFAULT_DRIVER = "550.127.05"
DEFAULT_CUDA = 12040  # CUDA 12.4, as nvmlSystemGetCudaDriverVersion encodes it
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_PCI_DEVICE_ID = 0x233010DE
H100_PCI_SUBSYSTEM_ID = 0x16C110DE
H100_MEMORY_MIB = 81559
H100_NVLINKS = 18
H100_VBIOS = "96.00.99.00.01"  # nvmlDeviceGetVbiosVersion
H100_INFOROM_IMAGE = "G520.0200.00.05"  # nvmlDeviceGetInforomImageVersion
# NVML's buffers (nvml.h): a version must fit with its NUL.
VBIOS_MAX_LEN = 31
INFOROM_IMAGE_MAX_LEN = 15
# PCI buses of the eight GPUs of an HGX H100 board, in NVML (bus id) order.
H100_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
IDLE_TEMPERATURE_C = 33
IDLE_POWER_MW = 71_000

# CUDA version each driver branch reports, for `driver=` injections.
CUDA_BY_DRIVER_BRANCH = {
    470: 11040,
    525: 12000,
    535: 12020,
    545: 12030,
    550: 12040,
    555: 12050,
    560: 12060,
    565: 12070,
    570: 12080,
    575: 12090,
    580: 13000,
}

NVML_ERRORS = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18,
    "IN_USE": 19,
    "MEMORY": 20,
    "NO_DATA": 21,
    "NOT_READY": 27,
    "GPU_NOT_FOUND": 28,
    "INVALID_STATE": 29,
    "UNKNOWN": 999,
}

# nvmlClocksEventReason* bits, by the names `throttle=` accepts.
THROTTLE_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}

RECOVERABLE_BY = ("reload", "reboot", "never")
DCGM_VERDICTS = ("pass", "warn", "fail")


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int


@dataclass(frozen=True)
class GpuState:
    name: str
    uuid: str
    serial: str
    pci_bus_id: str
    minor: int
    pci_device_id: int = H100_PCI_DEVICE_ID
    vbios: str = H100_VBIOS
    inforom_image: str = H100_INFOROM_IMAGE
    pci_subsystem_id: int = H100_PCI_SUBSYSTEM_ID
    memory_total_mib: int = H100_MEMORY_MIB
    memory_reserved_mib: int = 0
    temperature: int = IDLE_TEMPERATURE_C
    power_mw: int = IDLE_POWER_MW
    util_gpu: int = 0
    util_mem: int = 0
    throttle: int = 0  # clock event reasons bitmask
    ecc_mode: bool = True
    ecc_volatile_sbe: int = 0
    ecc_volatile_dbe: int = 0
    ecc_aggregate_sbe: int = 0
    ecc_aggregate_dbe: int = 0
    retired_sbe: int = 0  # pages retired for multiple single-bit errors
    retired_dbe: int = 0  # pages retired for double-bit errors
    retired_pending: bool = False
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    nvlinks: int = H100_NVLINKS
    nvlinks_down: frozenset[int] = frozenset()
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    persistence: bool = True
    lost: bool = False
    missing: bool = False
    recoverable_by: str = "reboot"  # what brings a missing GPU back: reload|reboot|never
    hardware_fault: bool = False  # no repair changes this GPU; its last XID recurs
    # What the lab's dcgmi (cli/lab/dcgmi.py) reports for this GPU: pass, warn or fail. A
    # latent defect only a diagnostic finds: NVML shows nothing and no repair clears it.
    dcgm_diag: str = "pass"
    processes: tuple[GpuProcess, ...] = ()
    # Counters that rise before a failure (Medic's trends check); cleared by a GPU reset.
    pcie_replay: int = 0
    nvlink_replay: int = 0
    nvlink_recovery: int = 0
    nvlink_crc_flit: int = 0
    nvlink_crc_data: int = 0
    violation_power_ns: int = 0
    violation_thermal_ns: int = 0


@dataclass(frozen=True)
class XidEvent:
    seq: int  # node-wide, increasing: the library delivers only seqs above registration
    gpu: int
    xid: int


@dataclass(frozen=True)
class Failure:
    function: str
    code: int
    gpu: int | None = None  # None: every GPU and the node-wide calls


@dataclass(frozen=True)
class Hang:
    function: str
    seconds: float  # negative: until the rule is removed
    gpu: int | None = None


@dataclass(frozen=True)
class NodeScenario:
    node: str
    driver_version: str = DEFAULT_DRIVER
    cuda_version: int = DEFAULT_CUDA
    gpus: tuple[GpuState, ...] = ()
    events: tuple[XidEvent, ...] = ()
    failures: tuple[Failure, ...] = ()
    hangs: tuple[Hang, ...] = ()
    event_seq: int = 0  # highest seq ever assigned, kept when events are cleared

    @property
    def nvml_version(self) -> str:
        return f"{self.cuda_version // 1000}.{self.driver_version}"

    def present_gpus(self) -> tuple[GpuState, ...]:
        return tuple(g for g in self.gpus if not g.missing)


def _digest(node: str, index: int) -> str:
    return hashlib.sha256(f"{node}/gpu{index}".encode()).hexdigest()


def _pci_bus_id(index: int) -> str:
    domain, slot = divmod(index, len(H100_PCI_BUSES))
    return f"{domain:08X}:{H100_PCI_BUSES[slot]:02X}:00.0"


def default_gpu(node: str, index: int) -> GpuState:
    h = _digest(node, index)
    return GpuState(
        name=H100_NAME,
        uuid=f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}",
        serial=f"1654{int(h[32:48], 16) % 10**9:09d}",
        pci_bus_id=_pci_bus_id(index),
        minor=index,
    )


def default_scenario(node: str, gpus: int = 8) -> NodeScenario:
    """A healthy HGX H100 80GB SXM node; identities are deterministic per node and GPU."""
    return NodeScenario(node=node, gpus=tuple(default_gpu(node, i) for i in range(gpus)))


def scenario_path(template: str, node: str) -> Path:
    """The file a process on `node` reads, from an NVML_INJECT_SCENARIO value."""
    return Path(template.replace("{node}", node))

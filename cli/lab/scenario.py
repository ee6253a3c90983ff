"""The simulated GPUs of one lab node, and the scenario file the NVML injection library reads.

A `NodeScenario` is immutable: `inject` and the repair transforms (`gpu_reset`,
`driver_reload`, `reboot`) return a new one; `write_scenario` publishes it atomically, and
every process using the injection library sees it on its next NVML call.
GPU numbers here are slots (positions in the scenario). NVML indexes count present GPUs
only, so while a GPU is `missing` the later GPUs' NVML indexes shift down, as on real nodes.
The file format and the table of what each repair clears are in docs/nvml-injection.md.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cli.lab.nvml.build import EXPORTED_FUNCTIONS

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


# ---- the default node ---------------------------------------------------------------------


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


# ---- the file format ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Codec:
    dump: Callable[[Any], str]
    load: Callable[[str], Any]


def _dump_links(links: frozenset[int]) -> str:
    return ",".join(str(n) for n in sorted(links))


def _load_links(text: str) -> frozenset[int]:
    return frozenset(int(n) for n in text.split(",") if n)


def _dump_processes(procs: tuple[GpuProcess, ...]) -> str:
    return ",".join(f"{p.pid}:{p.used_mib}" for p in procs)


def _load_processes(text: str) -> tuple[GpuProcess, ...]:
    pairs = (item.split(":") for item in text.split(",") if item)
    return tuple(GpuProcess(int(pid), int(mib)) for pid, mib in pairs)


_STR = _Codec(str, str)
_INT = _Codec(str, int)
_HEX = _Codec(lambda v: f"0x{v:X}", lambda s: int(s, 0))
_BOOL = _Codec(lambda v: "1" if v else "0", lambda s: s == "1")
_LINKS = _Codec(_dump_links, _load_links)
_PROCS = _Codec(_dump_processes, _load_processes)

# file key -> (GpuState attribute, codec); the C parser knows the same keys.
_GPU_KEYS: dict[str, tuple[str, _Codec]] = {
    "name": ("name", _STR),
    "uuid": ("uuid", _STR),
    "serial": ("serial", _STR),
    "pci": ("pci_bus_id", _STR),
    "vbios": ("vbios", _STR),
    "inforom_image": ("inforom_image", _STR),
    "pci_device_id": ("pci_device_id", _HEX),
    "pci_subsystem_id": ("pci_subsystem_id", _HEX),
    "minor": ("minor", _INT),
    "memory_total_mib": ("memory_total_mib", _INT),
    "memory_reserved_mib": ("memory_reserved_mib", _INT),
    "temperature": ("temperature", _INT),
    "power_mw": ("power_mw", _INT),
    "util_gpu": ("util_gpu", _INT),
    "util_mem": ("util_mem", _INT),
    "throttle": ("throttle", _HEX),
    "ecc_mode": ("ecc_mode", _BOOL),
    "ecc.volatile.sbe": ("ecc_volatile_sbe", _INT),
    "ecc.volatile.dbe": ("ecc_volatile_dbe", _INT),
    "ecc.aggregate.sbe": ("ecc_aggregate_sbe", _INT),
    "ecc.aggregate.dbe": ("ecc_aggregate_dbe", _INT),
    "retired.sbe": ("retired_sbe", _INT),
    "retired.dbe": ("retired_dbe", _INT),
    "retired.pending": ("retired_pending", _BOOL),
    "remap.correctable": ("remap_correctable", _INT),
    "remap.uncorrectable": ("remap_uncorrectable", _INT),
    "remap.pending": ("remap_pending", _BOOL),
    "remap.failure": ("remap_failure", _BOOL),
    "nvlinks": ("nvlinks", _INT),
    "nvlink_down": ("nvlinks_down", _LINKS),
    "pcie.gen": ("pcie_gen", _INT),
    "pcie.width": ("pcie_width", _INT),
    "pcie.max_gen": ("pcie_max_gen", _INT),
    "pcie.max_width": ("pcie_max_width", _INT),
    "persistence": ("persistence", _BOOL),
    "lost": ("lost", _BOOL),
    "missing": ("missing", _BOOL),
    "recoverable_by": ("recoverable_by", _STR),
    "hardware_fault": ("hardware_fault", _BOOL),
    "dcgm_diag": ("dcgm_diag", _STR),
    "processes": ("processes", _PROCS),
    "pcie.replay": ("pcie_replay", _INT),
    "nvlink.replay": ("nvlink_replay", _INT),
    "nvlink.recovery": ("nvlink_recovery", _INT),
    "nvlink.crc_flit": ("nvlink_crc_flit", _INT),
    "nvlink.crc_data": ("nvlink_crc_data", _INT),
    "violation.power_ns": ("violation_power_ns", _INT),
    "violation.thermal_ns": ("violation_thermal_ns", _INT),
}


def _format_seconds(seconds: float) -> str:
    return repr(float(seconds))


def render_scenario(scenario: NodeScenario) -> str:
    lines = [
        f"# NVML injection scenario for {scenario.node} (written by cli/lab/scenario.py)",
        f"version={FORMAT_VERSION}",
        f"node={scenario.node}",
        f"driver={scenario.driver_version}",
        f"nvml={scenario.nvml_version}",
        f"cuda={scenario.cuda_version}",
        f"event_seq={scenario.event_seq}",
        f"gpus={len(scenario.gpus)}",  # the C parser needs this before any gpu.N line
    ]
    lines += [f"fail.{f.function}={f.code}" for f in scenario.failures if f.gpu is None]
    lines += [
        f"hang.{h.function}={_format_seconds(h.seconds)}" for h in scenario.hangs if h.gpu is None
    ]
    for i, gpu in enumerate(scenario.gpus):
        for key, (attr, codec) in _GPU_KEYS.items():
            lines.append(f"gpu.{i}.{key}={codec.dump(getattr(gpu, attr))}")
        lines += [f"gpu.{i}.xid.{e.seq}={e.xid}" for e in scenario.events if e.gpu == i]
        lines += [f"gpu.{i}.fail.{f.function}={f.code}" for f in scenario.failures if f.gpu == i]
        lines += [
            f"gpu.{i}.hang.{h.function}={_format_seconds(h.seconds)}"
            for h in scenario.hangs
            if h.gpu == i
        ]
    return "\n".join(lines) + "\n"


def write_scenario(path: Path, scenario: NodeScenario) -> None:
    """Replace `path` atomically (temp file, fsync, rename): readers see old or new, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(render_scenario(scenario))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def read_scenario(path: Path) -> NodeScenario:
    return parse_scenario(path.read_text(encoding="utf-8"), str(path))


def parse_scenario(text: str, source: str = "<scenario>") -> NodeScenario:
    top: dict[str, str] = {}
    gpu_fields: dict[int, dict[str, Any]] = {}
    events: list[XidEvent] = []
    failures: list[Failure] = []
    hangs: list[Hang] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep:
            raise ValueError(f"{source}:{lineno}: expected key=value")
        try:
            _parse_entry(key, value, top, gpu_fields, events, failures, hangs)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{source}:{lineno}: bad entry {line!r} ({exc})") from None
    gpus = tuple(GpuState(**gpu_fields.get(i, {})) for i in range(int(top.get("gpus", "0"))))
    return NodeScenario(
        node=top["node"],
        driver_version=top["driver"],
        cuda_version=int(top["cuda"]),
        gpus=gpus,
        events=tuple(sorted(events, key=lambda e: e.seq)),
        failures=tuple(failures),
        hangs=tuple(hangs),
        event_seq=int(top.get("event_seq", "0")),
    )


def _parse_entry(
    key: str,
    value: str,
    top: dict[str, str],
    gpu_fields: dict[int, dict[str, Any]],
    events: list[XidEvent],
    failures: list[Failure],
    hangs: list[Hang],
) -> None:
    prefix, _, rest = key.partition(".")
    if prefix == "fail":
        failures.append(Failure(rest, int(value)))
    elif prefix == "hang":
        hangs.append(Hang(rest, float(value)))
    elif prefix == "gpu":
        index_text, _, field_key = rest.partition(".")
        index = int(index_text)
        kind, _, name = field_key.partition(".")
        if kind == "xid":
            events.append(XidEvent(int(name), index, int(value)))
        elif kind == "fail":
            failures.append(Failure(name, int(value), index))
        elif kind == "hang":
            hangs.append(Hang(name, float(value), index))
        else:
            attr, codec = _GPU_KEYS[field_key]
            gpu_fields.setdefault(index, {})[attr] = codec.load(value)
    elif key in ("version", "node", "driver", "nvml", "cuda", "event_seq", "gpus"):
        if key == "version" and value != str(FORMAT_VERSION):
            raise ValueError(f"unsupported version {value}")
        top[key] = value
    else:
        raise KeyError(key)


# ---- injection ----------------------------------------------------------------------------

VALID_KEYS = (
    "xid",
    "ecc.sbe",
    "ecc.dbe",
    "retired.sbe",
    "retired.dbe",
    "retired.pending",
    "remap.correctable",
    "remap.uncorrectable",
    "remap.pending",
    "remap.failure",
    "nvlink.<n>",
    "pcie.gen",
    "pcie.width",
    "temperature",
    "power",
    "throttle",
    "lost",
    "missing",
    "persistence",
    "hardware_fault",
    "dcgm_diag",
    "process",
    "pcie.replay",
    "nvlink.replay",
    "nvlink.recovery",
    "nvlink.crc_flit",
    "nvlink.crc_data",
    "violation.power",
    "violation.thermal",
    "fail.<nvmlFunction>",
    "hang.<nvmlFunction>",
    "driver",
    "vbios",
    "inforom",
)


def _count(value: str) -> int:
    n = int(value)
    if n < 0:
        raise ValueError(f"{value} is negative")
    return n


def _flag(value: str) -> bool:
    if value not in ("0", "1"):
        raise ValueError(f"expected 0 or 1, got {value!r}")
    return value == "1"


def _throttle(value: str) -> int:
    mask = 0
    for name in re.split(r"[|,+]", value):
        name = name.strip().lower()
        if name in ("none", "0", ""):
            continue
        if name not in THROTTLE_REASONS:
            raise ValueError(f"unknown reason {name!r}; known: {', '.join(THROTTLE_REASONS)}")
        mask |= THROTTLE_REASONS[name]
    return mask


def _missing(g: GpuState, value: str) -> GpuState:
    if value == "0":
        return replace(g, missing=False)
    how = "reboot" if value == "1" else value
    if how not in RECOVERABLE_BY:
        raise ValueError(f"expected 0, 1 or one of {', '.join(RECOVERABLE_BY)}")
    return replace(g, missing=True, recoverable_by=how)


def _process(g: GpuState, value: str) -> GpuState:
    if value == "none":
        return replace(g, processes=())
    pid_text, sep, mib_text = value.partition(":")
    if not sep:
        raise ValueError("expected <pid>:<usedMiB> or none")
    proc = GpuProcess(int(pid_text), _count(mib_text))
    others = tuple(p for p in g.processes if p.pid != proc.pid)
    return replace(g, processes=(*others, proc))


def _in_range(value: str, limit: int) -> int:
    n = int(value)
    if not 1 <= n <= limit:
        raise ValueError(f"expected 1..{limit}")
    return n


# Per-GPU specs: each turns the GPU's state and the spec's value into the new state.
_GPU_SPECS: dict[str, Callable[[GpuState, str], GpuState]] = {
    "ecc.sbe": lambda g, v: replace(
        g,
        ecc_volatile_sbe=g.ecc_volatile_sbe + _count(v),
        ecc_aggregate_sbe=g.ecc_aggregate_sbe + _count(v),
    ),
    "ecc.dbe": lambda g, v: replace(
        g,
        ecc_volatile_dbe=g.ecc_volatile_dbe + _count(v),
        ecc_aggregate_dbe=g.ecc_aggregate_dbe + _count(v),
    ),
    "retired.sbe": lambda g, v: replace(g, retired_sbe=g.retired_sbe + _count(v)),
    "retired.dbe": lambda g, v: replace(g, retired_dbe=g.retired_dbe + _count(v)),
    "retired.pending": lambda g, v: replace(g, retired_pending=_flag(v)),
    "remap.correctable": lambda g, v: replace(g, remap_correctable=g.remap_correctable + _count(v)),
    "remap.uncorrectable": lambda g, v: replace(
        g, remap_uncorrectable=g.remap_uncorrectable + _count(v)
    ),
    "remap.pending": lambda g, v: replace(g, remap_pending=_flag(v)),
    "remap.failure": lambda g, v: replace(g, remap_failure=_flag(v)),
    "pcie.gen": lambda g, v: replace(g, pcie_gen=_in_range(v, g.pcie_max_gen)),
    "pcie.width": lambda g, v: replace(g, pcie_width=_in_range(v, g.pcie_max_width)),
    "temperature": lambda g, v: replace(g, temperature=_count(v)),
    "power": lambda g, v: replace(g, power_mw=_count(v) * 1000),
    "throttle": lambda g, v: replace(g, throttle=_throttle(v)),
    "lost": lambda g, v: replace(g, lost=_flag(v)),
    "missing": _missing,
    "persistence": lambda g, v: replace(g, persistence=_flag(v)),
    "hardware_fault": lambda g, v: replace(g, hardware_fault=_flag(v)),
    "dcgm_diag": lambda g, v: replace(g, dcgm_diag=_diag_verdict(v)),
    # firmware versions (what `medic fleet drift` compares); no repair changes them
    "vbios": lambda g, v: replace(g, vbios=_version(v, VBIOS_MAX_LEN)),
    "inforom": lambda g, v: replace(g, inforom_image=_version(v, INFOROM_IMAGE_MAX_LEN)),
    "process": _process,
    "pcie.replay": lambda g, v: replace(g, pcie_replay=g.pcie_replay + _count(v)),
    "nvlink.replay": lambda g, v: replace(g, nvlink_replay=g.nvlink_replay + _count(v)),
    "nvlink.recovery": lambda g, v: replace(g, nvlink_recovery=g.nvlink_recovery + _count(v)),
    "nvlink.crc_flit": lambda g, v: replace(g, nvlink_crc_flit=g.nvlink_crc_flit + _count(v)),
    "nvlink.crc_data": lambda g, v: replace(g, nvlink_crc_data=g.nvlink_crc_data + _count(v)),
    # milliseconds the clocks were held down, added to NVML's nanosecond counters
    "violation.power": lambda g, v: replace(
        g, violation_power_ns=g.violation_power_ns + _count(v) * 1_000_000
    ),
    "violation.thermal": lambda g, v: replace(
        g, violation_thermal_ns=g.violation_thermal_ns + _count(v) * 1_000_000
    ),
}


def _version(value: str, limit: int) -> str:
    """A firmware version as NVML reports it: printable, no spaces, within NVML's buffer."""
    if not re.fullmatch(r"[0-9A-Za-z._-]+", value) or len(value) > limit:
        raise ValueError(f"expected a version such as 96.00.99.00.01, at most {limit} characters")
    return value


def _diag_verdict(value: str) -> str:
    if value not in DCGM_VERDICTS:
        raise ValueError(f"expected one of {', '.join(DCGM_VERDICTS)}")
    return value


def _function_known(name: str) -> bool:
    """Mirrors rule_matches() in inject.c: exact, or an unversioned base name."""
    if name == "nvmlInit":
        return True
    return any(
        f == name or re.fullmatch(re.escape(name) + r"(V|_v\d+)", f) for f in EXPORTED_FUNCTIONS
    )


def _error_code(value: str) -> int:
    name = value.upper().removeprefix("NVML_ERROR_")
    if name in NVML_ERRORS:
        return NVML_ERRORS[name]
    code = int(value)
    if code < 0:
        raise ValueError("an nvmlReturn_t code is not negative")
    return code


def _hang_seconds(value: str) -> float:
    return -1.0 if value in ("forever", "inf") else float(value)


def _with_rule(
    scenario: NodeScenario, gpu: int | None, kind: str, function: str, value: str
) -> NodeScenario:
    if not _function_known(function):
        raise ValueError(f"{function} is not an NVML function the library exports")
    if kind == "fail":
        code = _error_code(value)
        failures = tuple(f for f in scenario.failures if (f.function, f.gpu) != (function, gpu))
        kept = (*failures, Failure(function, code, gpu)) if code else failures
        return replace(scenario, failures=kept)
    seconds = _hang_seconds(value)
    hangs = tuple(h for h in scenario.hangs if (h.function, h.gpu) != (function, gpu))
    return replace(scenario, hangs=(*hangs, Hang(function, seconds, gpu)) if seconds else hangs)


def _with_driver(scenario: NodeScenario, value: str) -> NodeScenario:
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", value):
        raise ValueError("expected a driver version such as 535.104.05")
    branch = int(value.split(".")[0])
    cuda = CUDA_BY_DRIVER_BRANCH.get(branch, scenario.cuda_version)
    return replace(scenario, driver_version=value, cuda_version=cuda)


def add_xid(scenario: NodeScenario, gpu: int, xid: int) -> NodeScenario:
    seq = scenario.event_seq + 1
    return replace(scenario, events=(*scenario.events, XidEvent(seq, gpu, xid)), event_seq=seq)


def _replace_gpu(scenario: NodeScenario, gpu: int, state: GpuState) -> NodeScenario:
    gpus = list(scenario.gpus)
    gpus[gpu] = state
    return replace(scenario, gpus=tuple(gpus))


def inject(scenario: NodeScenario, gpu: int | None, spec: str) -> NodeScenario:
    """Apply one `key=value` fault spec (see VALID_KEYS) to GPU slot `gpu`, or node-wide
    for fail./hang./driver when `gpu` is None. Raises ValueError with a one-line message."""
    key, sep, value = (part.strip() for part in spec.partition("="))
    try:
        if not sep or not key or not value:
            raise ValueError("expected key=value")
        if gpu is not None and not 0 <= gpu < len(scenario.gpus):
            raise ValueError(
                f"gpu {gpu} out of range: {scenario.node} has {len(scenario.gpus)} GPUs"
            )
        return _apply(scenario, gpu, key, value)
    except _UnknownSpec:
        raise ValueError(
            f"unknown injection spec {spec!r}; valid keys: {', '.join(VALID_KEYS)}"
        ) from None
    except ValueError as exc:
        raise ValueError(f"bad injection spec {spec!r}: {exc}") from None


class _UnknownSpec(Exception):
    pass


def _apply(scenario: NodeScenario, gpu: int | None, key: str, value: str) -> NodeScenario:
    kind, _, rest = key.partition(".")
    if kind in ("fail", "hang") and rest:
        return _with_rule(scenario, gpu, kind, rest, value)
    if key == "driver":
        if gpu is not None:
            raise ValueError("driver is node-wide: give no gpu")
        return _with_driver(scenario, value)
    if key not in _GPU_SPECS and key != "xid" and not re.fullmatch(r"nvlink\.\d+", key):
        raise _UnknownSpec
    if gpu is None:
        raise ValueError(f"{key} applies to one GPU: give a gpu")
    state = scenario.gpus[gpu]
    if key == "xid":
        return add_xid(scenario, gpu, _count(value))
    if kind == "nvlink" and key not in _GPU_SPECS:
        return _replace_gpu(scenario, gpu, _nvlink(state, int(rest), value))
    return _replace_gpu(scenario, gpu, _GPU_SPECS[key](state, value))


def _nvlink(g: GpuState, link: int, value: str) -> GpuState:
    if not 0 <= link < g.nvlinks:
        raise ValueError(f"link {link} out of range: the GPU has {g.nvlinks} NVLinks")
    if value not in ("up", "down"):
        raise ValueError("expected up or down")
    down = g.nvlinks_down | {link} if value == "down" else g.nvlinks_down - {link}
    return replace(g, nvlinks_down=frozenset(down))


# ---- what repairs clear (the table in docs/nvml-injection.md) ---------------------------------


def _recur(scenario: NodeScenario, gpu: int) -> NodeScenario:
    """A hardware fault survives repair: the GPU's last XID happens again, as a new event."""
    last = [e for e in scenario.events if e.gpu == gpu]
    return add_xid(scenario, gpu, last[-1].xid) if last else scenario


def _reset_state(g: GpuState) -> GpuState:
    return replace(
        g,
        ecc_volatile_sbe=0,
        ecc_volatile_dbe=0,
        throttle=0,
        lost=False,
        retired_pending=False,  # the pending pages are retired now (already counted)
        remap_pending=g.remap_pending and g.remap_failure,
        nvlinks_down=frozenset(),
        pcie_gen=g.pcie_max_gen,
        pcie_width=g.pcie_max_width,
        processes=(),
        util_gpu=0,
        util_mem=0,
        pcie_replay=0,
        nvlink_replay=0,
        nvlink_recovery=0,
        nvlink_crc_flit=0,
        nvlink_crc_data=0,
        violation_power_ns=0,
        violation_thermal_ns=0,
    )


def _drop_gpu_rules(scenario: NodeScenario, gpus: Iterable[int]) -> NodeScenario:
    cleared = set(gpus)
    return replace(
        scenario,
        events=tuple(e for e in scenario.events if e.gpu not in cleared),
        failures=tuple(f for f in scenario.failures if f.gpu not in cleared),
        hangs=tuple(h for h in scenario.hangs if h.gpu not in cleared),
    )


def gpu_reset(scenario: NodeScenario, gpu: int) -> NodeScenario:
    """`nvidia-smi -r` on one GPU: clears its volatile state; lifetime counters, retired pages,
    a row-remap failure and a missing GPU stay; a hardware_fault GPU is unchanged."""
    state = scenario.gpus[gpu]
    if state.hardware_fault:
        return _recur(scenario, gpu)
    if state.missing:
        return scenario
    return _drop_gpu_rules(_replace_gpu(scenario, gpu, _reset_state(state)), [gpu])


def _restore_missing(scenario: NodeScenario, recovered: tuple[str, ...]) -> NodeScenario:
    gpus = tuple(
        replace(g, missing=False)
        if g.missing and g.recoverable_by in recovered and not g.hardware_fault
        else g
        for g in scenario.gpus
    )
    return replace(scenario, gpus=gpus)


def _recover_node(scenario: NodeScenario, recovered: tuple[str, ...]) -> NodeScenario:
    current = _restore_missing(scenario, recovered)
    for i in range(len(current.gpus)):
        current = gpu_reset(current, i)
    gpus = tuple(g if g.hardware_fault else replace(g, persistence=True) for g in current.gpus)
    return replace(
        current,
        gpus=gpus,
        failures=tuple(f for f in current.failures if f.gpu is not None),
        hangs=tuple(h for h in current.hangs if h.gpu is not None),
    )


def driver_reload(scenario: NodeScenario) -> NodeScenario:
    """Unload and reload the NVIDIA driver: a reset of every GPU, node-wide fail/hang rules
    cleared, persistence back on, and GPUs missing with recoverable_by=reload back."""
    return _recover_node(scenario, ("reload",))


def reboot(scenario: NodeScenario) -> NodeScenario:
    """A reboot: everything driver_reload does, and GPUs missing with recoverable_by=reboot
    come back too. Only hardware_fault GPUs and recoverable_by=never GPUs keep their fault."""
    return _recover_node(scenario, ("reload", "reboot"))


# ---- publishing: the scenario file and what the driver would log -----------------------------

_KMSG_SEQ_BASE = 500_000  # above the fixture tree's own records


def nvrm_xid_line(scenario: NodeScenario, event: XidEvent, timestamp_us: int) -> str:
    """The kernel log record the NVIDIA driver prints for an XID (format as in
    tests/fixtures/kmsg/nvrm_xid.txt)."""
    from healthd.kmsg import format_record

    bus = scenario.gpus[event.gpu].pci_bus_id.lower()  # 00000000:2a:00.0
    pci = "0000:" + bus.split(":", 1)[1].rsplit(".", 1)[0]
    return format_record(
        _KMSG_SEQ_BASE + event.seq,
        f"NVRM: Xid (PCI:{pci}): {event.xid}, pid=0, name=lab, simulated by medic lab",
        level=4,
        timestamp_us=timestamp_us,
    )


def publish(path: Path, kmsg: Path | None, before: NodeScenario, after: NodeScenario) -> None:
    """Write the node's scenario, and append an NVRM Xid line to its kernel log for every
    XID that is new in `after`: the driver logs every XID, so a daemon that starts after
    the event (after a reboot, say) still finds it there. The line is written first, as
    the driver prints it before NVML delivers the event: a daemon woken by the event finds
    the line that dates it (written after, a loaded machine let the event win)."""
    import time

    seen = max((e.seq for e in before.events), default=0)
    new = [e for e in after.events if e.seq > seen]
    if kmsg is not None and new and kmsg.parent.is_dir():
        now_us = int(time.monotonic() * 1e6)
        with kmsg.open("a") as log:
            for event in new:
                log.write(nvrm_xid_line(after, event, now_us))
    write_scenario(path, after)

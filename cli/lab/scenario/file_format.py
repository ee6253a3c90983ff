"""The scenario file the NVML injection library reads: rendering a `NodeScenario` to its
key=value lines, parsing them back, and writing it atomically (the format is in
docs/nvml-injection.md; the C parser, cli/lab/nvml/inject.c, knows the same keys)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.lab.scenario.model import (
    FORMAT_VERSION,
    Failure,
    GpuProcess,
    GpuState,
    Hang,
    NodeScenario,
    XidEvent,
)


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
        f"# NVML injection scenario for {scenario.node} (written by cli/lab/scenario/)",
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

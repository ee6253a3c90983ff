"""Injection: `inject(scenario, gpu, "key=value")` returns the scenario with one fault (an
XID, ECC errors, a lost or missing GPU, a failing or hanging NVML call, a driver version,
...) applied; VALID_KEYS lists what can be injected."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from cli.lab.nvml.build import EXPORTED_FUNCTIONS
from cli.lab.scenario.model import (
    CUDA_BY_DRIVER_BRANCH,
    DCGM_VERDICTS,
    INFOROM_IMAGE_MAX_LEN,
    NVML_ERRORS,
    RECOVERABLE_BY,
    THROTTLE_REASONS,
    VBIOS_MAX_LEN,
    Failure,
    GpuProcess,
    GpuState,
    Hang,
    NodeScenario,
    XidEvent,
)

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


def replace_gpu(scenario: NodeScenario, gpu: int, state: GpuState) -> NodeScenario:
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
        return replace_gpu(scenario, gpu, _nvlink(state, int(rest), value))
    return replace_gpu(scenario, gpu, _GPU_SPECS[key](state, value))


def _nvlink(g: GpuState, link: int, value: str) -> GpuState:
    if not 0 <= link < g.nvlinks:
        raise ValueError(f"link {link} out of range: the GPU has {g.nvlinks} NVLinks")
    if value not in ("up", "down"):
        raise ValueError("expected up or down")
    down = g.nvlinks_down | {link} if value == "down" else g.nvlinks_down - {link}
    return replace(g, nvlinks_down=frozenset(down))

"""NVML's vocabulary, apart from any client: the typed readings, errors and NVML constants,
the `NvmlClient` and `NvmlEvents` protocols the checks and the XID listener are written
against, `Reading`/`measure`/`Sweep` for checks' observations, and PCI bus ids. The pynvml
implementation is healthd.nvml_client (its engine healthd.nvml_calls); fakes implement the
protocols. Importing this module imports no bindings."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_CALL_TIMEOUT = 3.0  # seconds; healthy NVML calls take well under 0.1 s
DEFAULT_INIT_TIMEOUT = 30.0  # nvmlInit without persistence mode can take seconds per GPU
MIB = 1 << 20

# nvmlReturn_t codes the client distinguishes (nvml.h)
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

UNAVAILABLE_CODES = frozenset(
    {
        NVML_ERROR_UNINITIALIZED,
        NVML_ERROR_DRIVER_NOT_LOADED,
        NVML_ERROR_LIBRARY_NOT_FOUND,
        NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)

# nvmlClocksEventReason* bits (nvml.h), named as the lab's `throttle=` spec names them.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock",
}

# nvmlEventType* bits used by the listener (nvml.h)
EVENT_SBE = 0x1
EVENT_DBE = 0x2
EVENT_XID = 0x8


# --- errors ---------------------------------------------------------------------------------


class NvmlError(RuntimeError):
    """An NVML call failed; `function` is the NVML function, `gpu` the index (None: node)."""

    def __init__(
        self, function: str, gpu: int | None, detail: str, *, code: int | None = None
    ) -> None:
        where = f"GPU {gpu}" if gpu is not None else "node"
        super().__init__(f"{function} ({where}): {detail}")
        self.function, self.gpu, self.detail, self.code = function, gpu, detail, code


class NvmlTimeout(NvmlError):
    def __init__(
        self, function: str, gpu: int | None, seconds: float, *, still_hung: bool = False
    ) -> None:
        detail = (
            f"an earlier call is still hung (> {seconds:g}s)"
            if still_hung
            else f"no answer within {seconds:g}s"
        )
        super().__init__(function, gpu, detail, code=NVML_ERROR_TIMEOUT)
        self.seconds, self.still_hung = seconds, still_hung


class NvmlGpuLost(NvmlError):
    """NVML_ERROR_GPU_IS_LOST: the GPU stopped answering (often it fell off the bus)."""


class NvmlNotSupported(NvmlError):
    """The GPU or driver does not support this query: NOT_APPLICABLE, never a fault."""


class NvmlUnavailable(NvmlError):
    """No usable NVML at all: library missing, driver not loaded, not initialised."""


# --- typed readings -------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML index: counts present GPUs only
    uuid: str
    serial: str
    name: str
    pci_bus_id: str  # normalised "0000:18:00.0"

    def evidence(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "serial": self.serial,
            "name": self.name,
            "pci_bus_id": self.pci_bus_id,
        }


@dataclass(frozen=True)
class EccCounts:
    volatile_sbe: int  # since the last driver load / GPU reset
    volatile_dbe: int
    aggregate_sbe: int  # lifetime (InfoROM)
    aggregate_dbe: int


@dataclass(frozen=True)
class RetiredPages:
    sbe: int  # pages retired for multiple single-bit errors
    dbe: int  # pages retired for double-bit errors
    pending: bool  # retirement waits for the next driver load / GPU reset

    @property
    def total(self) -> int:
        return self.sbe + self.dbe


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool  # a remap waits for the next GPU reset
    failure: bool  # a row could not be remapped: the bank ran out of spare rows


@dataclass(frozen=True)
class NvLinkStates:
    links: tuple[bool, ...]  # index = link number, True = active

    @property
    def down(self) -> tuple[int, ...]:
        return tuple(i for i, up in enumerate(self.links) if not up)


@dataclass(frozen=True)
class PcieLink:
    cur_gen: int
    cur_width: int
    max_gen: int
    max_width: int


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return tuple(names)


@dataclass(frozen=True)
class Thermal:
    temperature_c: int
    clock_event_reasons: int  # nvmlClocksEventReason* bitmask

    @property
    def reasons(self) -> tuple[str, ...]:
        return decode_clock_event_reasons(self.clock_event_reasons)


@dataclass(frozen=True)
class TrendCounters:
    """The counters that rise before a failure, read together for the trends check. None:
    not supported on this GPU (no NVLink on a PCIe card, say). Counts since the driver
    loaded (they restart at 0 after a GPU reset or a reload), except the lifetime ones."""

    ecc_corrected: int | None  # volatile corrected (single-bit) ECC errors
    remapped_rows: int | None  # lifetime: correctable + uncorrectable remapped rows
    retired_pages: int | None  # lifetime: pages retired (multiple SBE + DBE)
    pcie_replay: int | None  # PCIe replay counter
    nvlink_crc: int | None  # NVLink CRC flit + data errors, every link
    nvlink_replay: int | None  # NVLink replay + recovery errors, every link
    throttle_ms: int | None  # power + thermal violation time, milliseconds

    def values(self) -> dict[str, int | None]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int | None  # None when NVML cannot tell (NVML_VALUE_NOT_AVAILABLE)


@dataclass(frozen=True)
class Utilization:
    """nvmlDeviceGetUtilizationRates: percent of the last sample period the GPU ran a
    kernel, and its memory was read or written."""

    gpu_pct: int
    memory_pct: int


@dataclass(frozen=True)
class MemoryUsage:
    total_mib: int
    used_mib: int  # excludes the driver's reservation where NVML reports it (v2)


@dataclass(frozen=True)
class CallHealth:
    """How a GPU has answered NVML lately (consecutive counts reset by any success)."""

    consecutive_timeouts: int = 0
    consecutive_lost: int = 0
    last_problem: str = ""  # "timeout" | "gpu_lost" | ""
    last_function: str = ""
    since: float | None = None  # monotonic time of the first failure in the current streak


@dataclass(frozen=True)
class RawEvent:
    """One nvmlEventSetWait answer."""

    gpu: int | None  # NVML index, None when the device handle was not one we registered
    event_type: int  # nvmlEventType* bit
    data: int  # the XID for nvmlEventTypeXidCriticalError


# --- the protocol ---------------------------------------------------------------------------


class NvmlClient(Protocol):
    """What the GPU checks need from NVML. Every method may raise an `NvmlError` subclass."""

    def driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def gpu_info(self, index: int, *, refresh: bool = False) -> GpuInfo: ...

    def cached_gpu_info(self, index: int) -> GpuInfo | None: ...

    def ecc_counts(self, index: int) -> EccCounts: ...

    def retired_pages(self, index: int) -> RetiredPages: ...

    def remapped_rows(self, index: int) -> RemappedRows: ...

    def nvlink_states(self, index: int) -> NvLinkStates: ...

    def pcie_link(self, index: int) -> PcieLink: ...

    def thermal(self, index: int) -> Thermal: ...

    def processes(self, index: int) -> tuple[GpuProcess, ...]: ...

    def memory(self, index: int) -> MemoryUsage: ...

    def persistence_mode(self, index: int) -> bool: ...

    def call_health(self) -> dict[int, CallHealth]: ...

    def sweep(self, plan: Sweep[R]) -> R:
        """Run `plan`: each client call it yields is measured and its `Reading` sent back;
        returns what the plan returns. The same calls, answers and streaks as `run_sweep`
        (which a client without worker threads uses), however it is run."""
        ...


class NvmlEvents(Protocol):
    """NVML's event API, for the XID listener. Call it from one dedicated thread: waits are
    bounded by their own timeout and do not go through the per-call worker threads."""

    def device_count(self) -> int: ...

    def event_set_create(self) -> Any: ...

    def register_events(self, event_set: Any, index: int, wanted: int) -> int: ...

    def event_wait(self, event_set: Any, timeout_ms: int) -> RawEvent | None: ...

    def event_set_free(self, event_set: Any) -> None: ...


# --- readings: a value or a named problem, for observations ---------------------------------


class Problem(StrEnum):
    NOT_SUPPORTED = "not_supported"
    TIMEOUT = "timeout"
    GPU_LOST = "gpu_lost"
    UNAVAILABLE = "unavailable"
    ERROR = "error"


@dataclass(frozen=True)
class Reading(Generic[T]):
    value: T | None = None
    problem: Problem | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.problem is None


def problem_of(exc: NvmlError) -> Problem:
    if isinstance(exc, NvmlNotSupported):
        return Problem.NOT_SUPPORTED
    if isinstance(exc, NvmlTimeout):
        return Problem.TIMEOUT
    if isinstance(exc, NvmlGpuLost):
        return Problem.GPU_LOST
    if isinstance(exc, NvmlUnavailable):
        return Problem.UNAVAILABLE
    return Problem.ERROR


def measure(call: Callable[[], T]) -> Reading[T]:
    """Run one client call; NVML failures become a Reading with a problem (other
    exceptions propagate: they are bugs, and the runner reports them as check.error)."""
    try:
        return Reading(call())
    except NvmlError as exc:
        return Reading(None, problem_of(exc), str(exc))


# A check's pass over the GPUs: yields client calls (each making one NVML call: a timeout
# ends the call that yielded it, not more), is sent each call's Reading, returns its result.
Sweep = Generator[Callable[[], Any], Reading[Any], R]


def run_sweep(plan: Sweep[R]) -> R:
    """Run a sweep in this thread, one `measure()` after another (the default for clients
    and fakes without worker threads of their own)."""
    try:
        call = next(plan)
        while True:
            call = plan.send(measure(call))
    except StopIteration as stop:
        result: R = stop.value
        return result


# --- PCI bus ids ----------------------------------------------------------------------------


def pci_key(bus_id: str) -> str:
    """`domain:bus:device` in lower case with a 4-digit domain, the function dropped: the
    form in which NVML ("00000000:18:00.0") and the kernel log ("PCI:0000:18:00") agree."""
    text = bus_id.strip().lower().removeprefix("pci:")
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, device = parts
    device = device.split(".")[0]
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


def normalize_pci_bus_id(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as "0000:18:00.0" (lower case; function kept, 0 if absent)."""
    text = bus_id.strip().lower().removeprefix("pci:")
    function = text.rsplit(".", 1)[1] if "." in text.rsplit(":", 1)[-1] else "0"
    return f"{pci_key(text)}.{int(function, 16):x}"


__all__ = [
    "CLOCK_EVENT_REASONS",
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_INIT_TIMEOUT",
    "EVENT_DBE",
    "EVENT_SBE",
    "EVENT_XID",
    "MIB",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_TIMEOUT",
    "NVML_ERROR_UNINITIALIZED",
    "UNAVAILABLE_CODES",
    "CallHealth",
    "EccCounts",
    "GpuInfo",
    "GpuProcess",
    "MemoryUsage",
    "NvLinkStates",
    "NvmlClient",
    "NvmlError",
    "NvmlEvents",
    "NvmlGpuLost",
    "NvmlNotSupported",
    "NvmlTimeout",
    "NvmlUnavailable",
    "PcieLink",
    "Problem",
    "RawEvent",
    "Reading",
    "RemappedRows",
    "RetiredPages",
    "Sweep",
    "Thermal",
    "TrendCounters",
    "Utilization",
    "decode_clock_event_reasons",
    "measure",
    "normalize_pci_bus_id",
    "pci_key",
    "problem_of",
    "run_sweep",
]

"""NVML, as the GPU checks and the XID listener see it: a small typed `NvmlClient` Protocol
and its implementation over the official bindings (`pynvml`, imported lazily).

Every device call runs on a worker thread with a deadline, because NVML does hang (a GPU
that fell off the bus, a wedged driver) and a hung ctypes call cannot be interrupted. A
check's sweep over the GPUs (`sweep()`) makes its calls one after another on ONE worker, each
under its own deadline: the caller waits once for the whole sweep, and only when a call
overruns does it leave that worker to the hung call and go on with the rest on a new one.

* a call that overruns raises `NvmlTimeout`; its thread is remembered, and until it returns
  the same (function, GPU) fails fast with `NvmlTimeout(still_hung=True)` instead of
  stranding one more thread per run;
* NVML_ERROR_GPU_IS_LOST raises `NvmlGpuLost`;
* NVML_ERROR_NOT_SUPPORTED (and FUNCTION_NOT_FOUND, an older driver) raises
  `NvmlNotSupported`: the metric is NOT_APPLICABLE on this GPU, never a fault;
* no library, driver not loaded, not initialised: `NvmlUnavailable`.

The client counts consecutive timeouts and "GPU is lost" answers per GPU (`call_health`),
reset by any successful call on that GPU. It renders no verdict itself: the `gpu_count`
check turns the counts into CRITICAL `gpu.nvml.unresponsive`; one timeout alone is UNKNOWN.

`measure()` turns a call into a `Reading` (a value or a named problem) so that checks put
plain data into their observations and `evaluate()` stays pure. A `Sweep` is a generator that
yields client calls (one NVML call each) and is sent back their readings; `run_sweep()` runs
one in the caller's thread, the way a client without worker threads does.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from types import ModuleType
from typing import Any, Generic, Protocol, TypeVar

from healthd.deadlines import Abandoned, Item, Lane, Timekeeper
from healthd.workers import WorkerPool

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_CALL_TIMEOUT = 3.0  # seconds; healthy NVML calls take well under 0.1 s
DEFAULT_INIT_TIMEOUT = 30.0  # nvmlInit without persistence mode can take seconds per GPU
MIB = 1 << 20

# nvmlReturn_t codes the client distinguishes (nvml.h)
_NOT_SUPPORTED = 3
_NOT_FOUND_INVALID_ARGUMENT = 2
_UNINITIALIZED = 1
_DRIVER_NOT_LOADED = 9
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_LIB_RM_VERSION_MISMATCH = 18

_UNAVAILABLE_CODES = frozenset(
    {_UNINITIALIZED, _DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND, _LIB_RM_VERSION_MISMATCH}
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
        super().__init__(function, gpu, detail, code=_TIMEOUT)
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


# --- the pynvml implementation ---------------------------------------------------------------


@dataclass
class _Slot:
    """What one call returned or raised."""

    value: Any = None
    error: BaseException | None = None


_FIRST: Any = object()  # a sweep's first step: next(plan), nothing to send yet


@dataclass(eq=False)
class _SweepRun:
    """One `sweep()`: the plan, its calls' time kept by `keeper` (each call an item tagged
    with its GPU), and how it ended (set under the keeper's cond by the lane that ends it)."""

    plan: Sweep[Any]
    keeper: Timekeeper[int | None]
    result: Any = None
    error: BaseException | None = None


@dataclass
class _Streak:
    timeouts: int = 0
    lost: int = 0
    last_problem: str = ""
    last_function: str = ""
    since: float | None = None


def _load_pynvml() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


class PynvmlClient:
    """`NvmlClient` and `NvmlEvents` over the official `pynvml` bindings.

    Construct it, then `open()` (or use it as a context manager); a client whose `open()`
    failed retries the initialisation on the next call, so a daemon started before the
    driver finished loading recovers by itself. Thread-safe."""

    def __init__(
        self,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        init_timeout: float = DEFAULT_INIT_TIMEOUT,
        loader: Callable[[], ModuleType] = _load_pynvml,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.call_timeout = call_timeout
        self.init_timeout = init_timeout
        self._loader = loader
        self._clock = clock
        self._nv: ModuleType | None = None
        self._opened = False
        self._lock = threading.Lock()
        self._init_lock = threading.Lock()
        self._hung: dict[tuple[str, int | None], Item[int | None]] = {}  # calls that overran
        self._workers = WorkerPool("nvml-call")
        self._local = threading.local()  # .on: (sweep, lane) on a sweep's worker
        self._streaks: dict[int, _Streak] = {}
        self._info: dict[int, GpuInfo] = {}
        self._handle_index: dict[int, int] = {}  # device handle address -> index (events)
        self._own_calls: dict[int, set[str]] = {}  # GPU -> trend counters without fields
        self._held = ""  # why NVML must stay shut ("": it may open)

    # -- lifecycle

    def open(self) -> PynvmlClient:
        self._ensure_open()
        return self

    def close(self) -> None:
        with self._init_lock:
            if self._opened and self._nv is not None:
                nv = self._nv
                with suppress(NvmlError):
                    self._run("nvmlShutdown", None, nv.nvmlShutdown, self.init_timeout)
            self._opened = False

    def __enter__(self) -> PynvmlClient:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _module(self) -> ModuleType:
        if self._nv is None:
            try:
                self._nv = self._loader()
            except ImportError as exc:
                raise NvmlUnavailable("import pynvml", None, str(exc)) from exc
        return self._nv

    def hold_closed(self, why: str) -> None:
        """While `why` is set, NVML is not initialised again: a call fails as unavailable
        with that reason (a repair needs every handle of ours shut). "" lifts the hold."""
        self._held = why

    def _ensure_open(self) -> ModuleType:
        nv = self._module()
        if self._opened:
            return nv
        with self._init_lock:
            if self._held:  # under the lock: close() for a repair waits for an init under way
                raise NvmlUnavailable("nvmlInit", None, self._held)
            if not self._opened:
                with self._off_sweep(self.init_timeout + self.call_timeout):
                    self._run("nvmlInit", None, nv.nvmlInit, self.init_timeout)
                self._own_calls.clear()  # a new driver may give the fields
                self._opened = True
        return nv

    @contextmanager
    def _off_sweep(self, allow: float) -> Iterator[None]:
        """On a sweep's worker, run the body's calls on a worker of their own with their own
        deadline (the init: a hung one must not keep the init lock on the sweep's worker);
        the sweep's caller gives the body `allow` seconds."""
        on = getattr(self._local, "on", None)
        if on is None:
            yield
            return
        run, lane = on
        self._local.on = None
        try:
            with run.keeper.item(lane, "nvmlInit", None, allow):
                yield
        finally:
            self._local.on = on

    # -- the deadline wrapper

    def _translate(self, function: str, gpu: int | None, exc: BaseException) -> BaseException:
        nv = self._nv
        if nv is None or not isinstance(exc, nv.NVMLError):
            return exc
        code = getattr(exc, "value", None)
        detail = str(exc)
        if code == _GPU_IS_LOST:
            return NvmlGpuLost(function, gpu, detail, code=code)
        if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
            return NvmlNotSupported(function, gpu, detail, code=code)
        if code == _TIMEOUT:
            return NvmlTimeout(function, gpu, 0.0)
        if code in _UNAVAILABLE_CODES:
            if code == _UNINITIALIZED:
                self._opened = False
            return NvmlUnavailable(function, gpu, detail, code=code)
        return NvmlError(function, gpu, detail, code=code)

    def _record(self, gpu: int | None, function: str, problem: str) -> None:
        if gpu is None:
            return
        with self._lock:
            streak = self._streaks.setdefault(gpu, _Streak())
            if not problem:
                self._streaks[gpu] = _Streak()
                return
            if streak.since is None:
                streak.since = self._clock()
            streak.last_problem, streak.last_function = problem, function
            if problem == "timeout":
                streak.timeouts += 1
            elif problem == "gpu_lost":
                streak.lost += 1

    def _run(self, function: str, gpu: int | None, call: Callable[[], T], timeout: float) -> T:
        key = (function, gpu)
        with self._lock:
            hung = self._hung.get(key)
            if hung is not None and hung.returned():
                del self._hung[key]
                hung = None
        if hung is not None:
            self._record(gpu, function, "timeout")
            raise NvmlTimeout(function, gpu, timeout, still_hung=True)
        slot = _Slot()

        def make_call() -> None:
            try:
                slot.value = call()
            except BaseException as exc:
                slot.error = exc

        on = getattr(self._local, "on", None)
        if on is not None:  # a sweep's worker: call directly, the sweep's caller keeps time
            run, lane = on
            with run.keeper.item(lane, function, gpu, timeout):
                make_call()
        else:
            keeper: Timekeeper[int | None] = Timekeeper(self._workers)

            def one_call(lane: Lane[int | None]) -> None:
                with keeper.item(lane, function, gpu, timeout):
                    make_call()

            keeper.start(one_call, f"nvml-{function}")
            overran = [item for _, item in keeper.overran()]
            if overran:
                with self._lock:
                    self._hung[key] = overran[0]
                self._record(gpu, function, "timeout")
                raise NvmlTimeout(function, gpu, timeout)
        if slot.error is not None:
            error = self._translate(function, gpu, slot.error)
            if isinstance(error, NvmlGpuLost):
                self._record(gpu, function, "gpu_lost")
            elif isinstance(error, NvmlTimeout):
                self._record(gpu, function, "timeout")
            elif isinstance(error, NvmlNotSupported):
                self._record(gpu, function, "")  # the GPU answered
            raise error
        self._record(gpu, function, "")
        return slot.value  # type: ignore[no-any-return]

    # -- sweeps: one worker for a check's pass over the GPUs

    def sweep(self, plan: Sweep[R]) -> R:
        """Run `plan` on one worker: its calls run there one after another, each under its
        deadline (healthd.deadlines); this thread waits for the end of the sweep, waking
        only when the call in progress reaches its deadline. A call that overran is handled
        as `_run` handles it (NvmlTimeout reading, remembered as hung, streak counted) and
        the rest of the plan goes on on a new worker. A sweep inside a sweep runs in place."""
        if getattr(self._local, "on", None) is not None:
            return run_sweep(plan)
        run = _SweepRun(plan, Timekeeper(self._workers))
        with run.keeper.cond:
            run.keeper.start(partial(self._drive, run, _FIRST), "nvml-sweep")
            for _, overran in run.keeper.overran():
                timed_out = self._timed_out(overran)
                run.keeper.start(partial(self._drive, run, timed_out), "nvml-sweep")
        if run.error is not None:
            raise run.error
        return run.result  # type: ignore[no-any-return]

    def _timed_out(self, overran: Item[int | None]) -> Reading[Any]:
        """A sweep's call that overran, left to its worker: remembered as hung, counted."""
        function, gpu = overran.name, overran.tag
        with self._lock:
            self._hung[(function, gpu)] = overran
        self._record(gpu, function, "timeout")
        error = NvmlTimeout(function, gpu, overran.timeout)
        return Reading(None, problem_of(error), str(error))

    def _drive(self, run: _SweepRun, send: Any, lane: Lane[int | None]) -> None:
        """A sweep's lane: advance the plan (sending `send`, the reading of the call the
        previous lane was abandoned in) until it ends or this lane is abandoned."""
        self._local.on = (run, lane)
        result: Any = None
        error: BaseException | None = None
        try:
            call = next(run.plan) if send is _FIRST else run.plan.send(send)
            while True:
                call = run.plan.send(measure(call))
        except StopIteration as stop:
            result = stop.value
        except Abandoned:
            raise
        except BaseException as exc:  # a bug in the plan or a call: the caller raises it
            error = exc
        finally:
            self._local.on = None
        with run.keeper.cond:
            if not lane.abandoned:
                run.result, run.error = result, error

    def _device(self, function: str, index: int, call: Callable[[ModuleType, Any], T]) -> T:
        """Look the handle up and make the call in one worker thread, under one deadline."""
        nv = self._ensure_open()

        def both() -> T:
            return call(nv, nv.nvmlDeviceGetHandleByIndex(index))

        return self._run(function, index, both, self.call_timeout)

    def _node(self, function: str, call: Callable[[ModuleType], T]) -> T:
        nv = self._ensure_open()
        return self._run(function, None, lambda: call(nv), self.call_timeout)

    # -- NvmlClient

    def driver_version(self) -> str:
        return _text(
            self._node("nvmlSystemGetDriverVersion", lambda nv: nv.nvmlSystemGetDriverVersion())
        )

    def device_count(self) -> int:
        return int(self._node("nvmlDeviceGetCount", lambda nv: nv.nvmlDeviceGetCount()))

    # -- versions, for the node's inventory (healthd.inventory); not in NvmlClient

    def cuda_driver_version(self) -> int:
        """The CUDA version the driver supports, as NVML encodes it: 12040 is 12.4."""
        return int(
            self._node(
                "nvmlSystemGetCudaDriverVersion", lambda nv: nv.nvmlSystemGetCudaDriverVersion()
            )
        )

    def vbios_version(self, index: int) -> str:
        return self._device(
            "nvmlDeviceGetVbiosVersion", index, lambda nv, h: _text(nv.nvmlDeviceGetVbiosVersion(h))
        )

    def inforom_image_version(self, index: int) -> str:
        return self._device(
            "nvmlDeviceGetInforomImageVersion",
            index,
            lambda nv, h: _text(nv.nvmlDeviceGetInforomImageVersion(h)),
        )

    def gpu_info(self, index: int, *, refresh: bool = False) -> GpuInfo:
        if not refresh:
            with self._lock:
                cached = self._info.get(index)
            if cached is not None:
                return cached

        def read(nv: ModuleType, handle: Any) -> GpuInfo:
            try:
                serial = _text(nv.nvmlDeviceGetSerial(handle))
            except nv.NVMLError_NotSupported:
                serial = ""
            return GpuInfo(
                index=index,
                uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                serial=serial,
                name=_text(nv.nvmlDeviceGetName(handle)),
                pci_bus_id=normalize_pci_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId)),
            )

        info = self._device("nvmlDeviceGetPciInfo", index, read)
        with self._lock:
            self._info[index] = info
        return info

    def cached_gpu_info(self, index: int) -> GpuInfo | None:
        with self._lock:
            return self._info.get(index)

    def ecc_counts(self, index: int) -> EccCounts:
        def read(nv: ModuleType, handle: Any) -> EccCounts:
            def count(error: int, counter: int) -> int:
                return int(nv.nvmlDeviceGetTotalEccErrors(handle, error, counter))

            sbe, dbe = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            vol, agg = nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
            return EccCounts(count(sbe, vol), count(dbe, vol), count(sbe, agg), count(dbe, agg))

        return self._device("nvmlDeviceGetTotalEccErrors", index, read)

    def retired_pages(self, index: int) -> RetiredPages:
        def read(nv: ModuleType, handle: Any) -> RetiredPages:
            sbe = nv.nvmlDeviceGetRetiredPages(
                handle, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            )
            dbe = nv.nvmlDeviceGetRetiredPages(
                handle, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            )
            pending = nv.nvmlDeviceGetRetiredPagesPendingStatus(handle)
            return RetiredPages(len(sbe), len(dbe), bool(pending))

        return self._device("nvmlDeviceGetRetiredPages", index, read)

    def remapped_rows(self, index: int) -> RemappedRows:
        def read(nv: ModuleType, handle: Any) -> RemappedRows:
            corr, unc, pending, failure = nv.nvmlDeviceGetRemappedRows(handle)
            return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))

        return self._device("nvmlDeviceGetRemappedRows", index, read)

    def nvlink_states(self, index: int) -> NvLinkStates:
        def read(nv: ModuleType, handle: Any) -> NvLinkStates:
            links: list[bool] = []
            for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
                try:
                    state = nv.nvmlDeviceGetNvLinkState(handle, link)
                except nv.NVMLError as exc:
                    code = getattr(exc, "value", None)
                    if links and code in (_NOT_SUPPORTED, _NOT_FOUND_INVALID_ARGUMENT):
                        break  # past the device's last link
                    raise
                links.append(state == nv.NVML_FEATURE_ENABLED)
            return NvLinkStates(tuple(links))

        return self._device("nvmlDeviceGetNvLinkState", index, read)

    def pcie_link(self, index: int) -> PcieLink:
        def read(nv: ModuleType, handle: Any) -> PcieLink:
            return PcieLink(
                cur_gen=int(nv.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
                cur_width=int(nv.nvmlDeviceGetCurrPcieLinkWidth(handle)),
                max_gen=int(nv.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
                max_width=int(nv.nvmlDeviceGetMaxPcieLinkWidth(handle)),
            )

        return self._device("nvmlDeviceGetCurrPcieLinkWidth", index, read)

    def thermal(self, index: int) -> Thermal:
        def read(nv: ModuleType, handle: Any) -> Thermal:
            temp = nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)
            reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(handle)
            return Thermal(int(temp), int(reasons))

        return self._device("nvmlDeviceGetTemperature", index, read)

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        def read(nv: ModuleType, handle: Any) -> tuple[GpuProcess, ...]:
            found = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            return tuple(
                GpuProcess(
                    int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory) // MIB
                )
                for p in found
            )

        return self._device("nvmlDeviceGetComputeRunningProcesses", index, read)

    def utilization(self, index: int) -> Utilization:
        def read(nv: ModuleType, handle: Any) -> Utilization:
            rates = nv.nvmlDeviceGetUtilizationRates(handle)
            return Utilization(int(rates.gpu), int(rates.memory))

        return self._device("nvmlDeviceGetUtilizationRates", index, read)

    def memory(self, index: int) -> MemoryUsage:
        def read(nv: ModuleType, handle: Any) -> MemoryUsage:
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
            except (nv.NVMLError_FunctionNotFound, nv.NVMLError_NotSupported):
                mem = nv.nvmlDeviceGetMemoryInfo(handle)
            return MemoryUsage(int(mem.total) // MIB, int(mem.used) // MIB)

        return self._device("nvmlDeviceGetMemoryInfo", index, read)

    def trend_counters(self, index: int) -> TrendCounters:
        """Every counter of `TrendCounters` in one call under one deadline; a counter the
        GPU does not support is None (the others are still read)."""

        def read(nv: ModuleType, handle: Any) -> TrendCounters:
            unsupported = (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound)

            def opt(call: Callable[[], Any]) -> int | None:
                try:
                    return int(call())
                except unsupported:
                    return None

            def retired() -> int:
                causes = (
                    nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                    nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                )
                return sum(len(nv.nvmlDeviceGetRetiredPages(handle, c)) for c in causes)

            def nvlink(*counters: int) -> int:
                total = 0
                for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
                    try:
                        for c in counters:
                            total += int(nv.nvmlDeviceGetNvLinkErrorCounter(handle, link, c))
                    except nv.NVMLError as exc:
                        code = getattr(exc, "value", None)
                        if link and code in (_NOT_SUPPORTED, _NOT_FOUND_INVALID_ARGUMENT):
                            break  # past the device's last link
                        raise
                return total

            def throttle_ms() -> int:
                policies = (nv.NVML_PERF_POLICY_POWER, nv.NVML_PERF_POLICY_THERMAL)
                ns = sum(
                    int(nv.nvmlDeviceGetViolationStatus(handle, p).violationTime) for p in policies
                )
                return ns // 1_000_000

            dl_crc = (nv.NVML_NVLINK_ERROR_DL_CRC_FLIT, nv.NVML_NVLINK_ERROR_DL_CRC_DATA)
            dl_replay = (nv.NVML_NVLINK_ERROR_DL_REPLAY, nv.NVML_NVLINK_ERROR_DL_RECOVERY)
            own: dict[str, Callable[[], Any]] = {  # each by its own calls (no fields)
                "remapped_rows": lambda: sum(nv.nvmlDeviceGetRemappedRows(handle)[:2]),
                "retired_pages": retired,
                "pcie_replay": lambda: nv.nvmlDeviceGetPcieReplayCounter(handle),
                "nvlink_crc": lambda: nvlink(*dl_crc),
                "nvlink_replay": lambda: nvlink(*dl_replay),
            }
            values: dict[str, int | None] = dict(self._trend_fields(nv, handle, index))
            for counter, call in own.items():
                if counter not in values:
                    values[counter] = opt(call)
            corrected, volatile = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC
            return TrendCounters(
                ecc_corrected=opt(
                    lambda: nv.nvmlDeviceGetTotalEccErrors(handle, corrected, volatile)
                ),
                throttle_ms=opt(throttle_ms),
                **values,
            )

        return self._device("nvmlDeviceGetPcieReplayCounter", index, read)

    def _trend_fields(self, nv: ModuleType, handle: Any, index: int) -> dict[str, int]:
        """The trend counters this GPU gives as field values, all in one
        nvmlDeviceGetFieldValues call (each the sum of its fields, `_TREND_FIELDS`). A
        counter whose fields are not supported is left out, and read by its own calls from
        then on (until NVML is initialised again: a GPU never starts supporting a field);
        one whose field failed otherwise is left out for this run only."""
        own = self._own_calls.setdefault(index, set())
        wanted = [counter for counter in _TREND_FIELDS if counter not in own]
        if not wanted:
            return {}
        names = [name for counter in wanted for name in _TREND_FIELDS[counter]]
        try:
            fields = nv.nvmlDeviceGetFieldValues(handle, [int(getattr(nv, n)) for n in names])
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
            own.update(wanted)  # a driver without the function
            return {}
        by_name = dict(zip(names, fields, strict=True))
        found: dict[str, int] = {}
        for counter in wanted:
            got = [by_name[name] for name in _TREND_FIELDS[counter]]
            codes = {int(f.nvmlReturn) for f in got} - {nv.NVML_SUCCESS}
            if not codes:
                found[counter] = sum(_field_int(f) for f in got)
            elif codes == {_NOT_SUPPORTED}:
                own.add(counter)
        return found

    def persistence_mode(self, index: int) -> bool:
        def read(nv: ModuleType, handle: Any) -> bool:
            return bool(nv.nvmlDeviceGetPersistenceMode(handle) == nv.NVML_FEATURE_ENABLED)

        return self._device("nvmlDeviceGetPersistenceMode", index, read)

    def call_health(self) -> dict[int, CallHealth]:
        with self._lock:
            return {
                gpu: CallHealth(s.timeouts, s.lost, s.last_problem, s.last_function, s.since)
                for gpu, s in self._streaks.items()
            }

    # -- NvmlEvents (direct calls: the listener owns its thread)

    @contextmanager
    def _direct(self, function: str, gpu: int | None) -> Iterator[ModuleType]:
        nv = self._ensure_open()
        try:
            yield nv
        except nv.NVMLError as exc:
            raise self._translate(function, gpu, exc) from exc

    def event_set_create(self) -> Any:
        with self._direct("nvmlEventSetCreate", None) as nv:
            return nv.nvmlEventSetCreate()

    def register_events(self, event_set: Any, index: int, wanted: int) -> int:
        """Register the supported subset of `wanted` on GPU `index`; returns that subset."""
        with self._direct("nvmlDeviceRegisterEvents", index) as nv:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            try:
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(handle))
            except nv.NVMLError_NotSupported:
                supported = 0
            mask = wanted & supported
            if mask:
                nv.nvmlDeviceRegisterEvents(handle, mask, event_set)
                address = ctypes.cast(handle, ctypes.c_void_p).value
                if address is not None:
                    with self._lock:
                        self._handle_index[address] = index
            return mask

    def event_wait(self, event_set: Any, timeout_ms: int) -> RawEvent | None:
        with self._direct("nvmlEventSetWait", None) as nv:
            try:
                data = nv.nvmlEventSetWait(event_set, timeout_ms)
            except nv.NVMLError_Timeout:
                return None
            address = ctypes.cast(data.device, ctypes.c_void_p).value
            with self._lock:
                gpu = self._handle_index.get(address) if address is not None else None
            return RawEvent(gpu, int(data.eventType), int(data.eventData))

    def event_set_free(self, event_set: Any) -> None:
        with self._direct("nvmlEventSetFree", None) as nv:
            nv.nvmlEventSetFree(event_set)


# The trend counters nvmlDeviceGetFieldValues gives, each the sum of its fields (NVLink: over
# every link), read in one call. ECC keeps its own call, which answers NOT_SUPPORTED with ECC
# off (the lab library's ECC fields do not follow the ECC mode).
_TREND_FIELDS: dict[str, tuple[str, ...]] = {
    "remapped_rows": ("NVML_FI_DEV_REMAPPED_COR", "NVML_FI_DEV_REMAPPED_UNC"),
    "retired_pages": ("NVML_FI_DEV_RETIRED_SBE", "NVML_FI_DEV_RETIRED_DBE"),
    "pcie_replay": ("NVML_FI_DEV_PCIE_REPLAY_COUNTER",),
    "nvlink_crc": (
        "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    ),
    "nvlink_replay": (
        "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    ),
}
# nvmlValueType_t -> the member of nvmlValue_t that holds the value
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _field_int(field: Any) -> int:
    """A field value's number, from the union member its valueType names."""
    kind = int(field.valueType)
    member = _VALUE_MEMBERS[kind] if 0 <= kind < len(_VALUE_MEMBERS) else "ullVal"
    return int(getattr(field.value, member))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

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
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from healthd.nvml_calls import NvmlCalls, _load_pynvml

# The vocabulary (healthd.nvml_types), re-exported: most importers name this module.
from healthd.nvml_types import (
    CLOCK_EVENT_REASONS,
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_INIT_TIMEOUT,
    EVENT_DBE,
    EVENT_SBE,
    EVENT_XID,
    MIB,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    UNAVAILABLE_CODES,
    CallHealth,
    EccCounts,
    GpuInfo,
    GpuProcess,
    MemoryUsage,
    NvLinkStates,
    NvmlClient,
    NvmlError,
    NvmlEvents,
    NvmlGpuLost,
    NvmlNotSupported,
    NvmlTimeout,
    NvmlUnavailable,
    PcieLink,
    Problem,
    RawEvent,
    Reading,
    RemappedRows,
    RetiredPages,
    Sweep,
    Thermal,
    TrendCounters,
    Utilization,
    decode_clock_event_reasons,
    measure,
    normalize_pci_bus_id,
    pci_key,
    problem_of,
    run_sweep,
)


class PynvmlClient(NvmlCalls):
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
        super().__init__(
            call_timeout=call_timeout, init_timeout=init_timeout, loader=loader, clock=clock
        )
        self._info: dict[int, GpuInfo] = {}
        self._handle_index: dict[int, int] = {}  # device handle address -> index (events)
        self._own_calls: dict[int, set[str]] = {}  # GPU -> trend counters without fields

    def _opened_anew(self) -> None:
        self._own_calls.clear()  # a new driver may give the fields

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
                    if links and code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
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
                        if link and code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
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
            elif codes == {NVML_ERROR_NOT_SUPPORTED}:
                own.add(counter)
        return found

    def persistence_mode(self, index: int) -> bool:
        def read(nv: ModuleType, handle: Any) -> bool:
            return bool(nv.nvmlDeviceGetPersistenceMode(handle) == nv.NVML_FEATURE_ENABLED)

        return self._device("nvmlDeviceGetPersistenceMode", index, read)

    # -- NvmlEvents (direct calls: the listener owns its thread)

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
    "PynvmlClient",
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

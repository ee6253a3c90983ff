"""Runs the real pynvml against whatever libnvidia-ml.so.1 LD_LIBRARY_PATH finds, and prints
one JSON object. Started by tests/test_nvml_inject.py in a subprocess.

    probe.py inventory
    probe.py events --ready FILE --count N --deadline SECONDS
    probe.py watch-temperature --ready FILE --gpu I --target C --deadline SECONDS
    probe.py hang --gpu I [--ready FILE]
    probe.py stress --ready FILE --deadline SECONDS
    probe.py uninit
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as nv


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except nv.NVMLError as exc:
        return {"error": type(exc).__name__, "code": exc.value}


def _gpu(index: int) -> Any:
    return _device(nv.nvmlDeviceGetHandleByIndex(index))


def _device(h: Any) -> dict[str, Any]:
    pci = nv.nvmlDeviceGetPciInfo(h)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    mem2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    util = nv.nvmlDeviceGetUtilizationRates(h)
    ecc = {
        f"{kind}.{counter}": _try(nv.nvmlDeviceGetTotalEccErrors, h, k, c)
        for kind, k in (("sbe", nv.NVML_SINGLE_BIT_ECC), ("dbe", nv.NVML_DOUBLE_BIT_ECC))
        for counter, c in (("volatile", nv.NVML_VOLATILE_ECC), ("aggregate", nv.NVML_AGGREGATE_ECC))
    }
    fields = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 100000])
    return {
        "index": nv.nvmlDeviceGetIndex(h),
        "minor": nv.nvmlDeviceGetMinorNumber(h),
        "name": nv.nvmlDeviceGetName(h),
        "uuid": nv.nvmlDeviceGetUUID(h),
        "serial": _try(lambda: nv.nvmlDeviceGetSerial(h)),
        "pci": {
            "busId": pci.busId,
            "busIdLegacy": pci.busIdLegacy,
            "bus": pci.bus,
            "pciDeviceId": pci.pciDeviceId,
        },
        "by_uuid_same": _try(
            lambda: nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(nv.nvmlDeviceGetUUID(h)))
        ),
        "by_pci_same": _try(
            lambda: nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(pci.busId))
        ),
        "memory": [mem.total, mem.free, mem.used],
        "memory_v2": [mem2.total, mem2.reserved, mem2.free, mem2.used],
        "temperature": _try(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        "temperature_v": _try(lambda: nv.nvmlDeviceGetTemperatureV(h, nv.NVML_TEMPERATURE_GPU)),
        "power_mw": _try(lambda: nv.nvmlDeviceGetPowerUsage(h)),
        "clocks_event_reasons": nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "clocks_throttle_reasons": nv.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "ecc_mode": nv.nvmlDeviceGetEccMode(h),
        "ecc": ecc,
        "dram_dbe_volatile": nv.nvmlDeviceGetMemoryErrorCounter(
            h, nv.NVML_DOUBLE_BIT_ECC, nv.NVML_VOLATILE_ECC, nv.NVML_MEMORY_LOCATION_DEVICE_MEMORY
        ),
        "retired_dbe": nv.nvmlDeviceGetRetiredPages(
            h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        ),
        "retired_dbe_v2": len(
            nv.nvmlDeviceGetRetiredPages_v2(h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        ),
        "retired_pending": nv.nvmlDeviceGetRetiredPagesPendingStatus(h),
        "remapped_rows": list(nv.nvmlDeviceGetRemappedRows(h)),
        "nvlinks": [nv.nvmlDeviceGetNvLinkState(h, link) for link in range(18)],
        "pcie": [
            nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
            nv.nvmlDeviceGetCurrPcieLinkWidth(h),
            nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
            nv.nvmlDeviceGetMaxPcieLinkWidth(h),
        ],
        "persistence": nv.nvmlDeviceGetPersistenceMode(h),
        "compute_processes": [
            [p.pid, p.usedGpuMemory] for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
        ],
        "graphics_processes": len(nv.nvmlDeviceGetGraphicsRunningProcesses(h)),
        "utilization": [util.gpu, util.memory],
        "supported_events": nv.nvmlDeviceGetSupportedEventTypes(h),
        "field_values": [[f.nvmlReturn, f.value.ullVal] for f in fields],
    }


def inventory(_: argparse.Namespace) -> dict[str, Any]:
    nv.nvmlInit()
    count = nv.nvmlDeviceGetCount()
    result = {
        "driver": nv.nvmlSystemGetDriverVersion(),
        "nvml": nv.nvmlSystemGetNVMLVersion(),
        "cuda": nv.nvmlSystemGetCudaDriverVersion(),
        "cuda_v2": nv.nvmlSystemGetCudaDriverVersion_v2(),
        "count": count,
        "gpus": [_try(_gpu, i) for i in range(count)],
    }
    nv.nvmlShutdown()
    return result


def events(args: argparse.Namespace) -> dict[str, Any]:
    nv.nvmlInit()
    event_set = nv.nvmlEventSetCreate()
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        types = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        nv.nvmlDeviceRegisterEvents(h, types, event_set)
    Path(args.ready).touch()
    received: list[dict[str, Any]] = []
    timeouts = 0
    deadline = time.monotonic() + args.deadline
    while len(received) < args.count and time.monotonic() < deadline:
        try:
            data = nv.nvmlEventSetWait(event_set, 100)
        except nv.NVMLError_Timeout:
            timeouts += 1
            continue
        received.append(
            {
                "at": time.time(),
                "index": nv.nvmlDeviceGetIndex(data.device),
                "type": data.eventType,
                "data": data.eventData,
            }
        )
    nv.nvmlEventSetFree(event_set)
    nv.nvmlShutdown()
    return {"events": received, "timeouts": timeouts}


def watch_temperature(args: argparse.Namespace) -> dict[str, Any]:
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(args.gpu)
    first = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
    Path(args.ready).touch()
    deadline = time.monotonic() + args.deadline
    current = first
    while current != args.target and time.monotonic() < deadline:
        time.sleep(0.01)
        current = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
    return {"first": first, "last": current, "at": time.time()}


def hang(args: argparse.Namespace) -> dict[str, Any]:
    """Times a hanging call while another thread keeps counting (ctypes drops the GIL)."""
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(args.gpu)
    ticks = 0
    stop = threading.Event()

    def ticker() -> None:
        nonlocal ticks
        while not stop.wait(0.01):
            ticks += 1

    thread = threading.Thread(target=ticker)
    thread.start()
    if args.ready:
        Path(args.ready).touch()
    start = time.monotonic()
    power = _try(lambda: nv.nvmlDeviceGetPowerUsage(h))
    seconds = time.monotonic() - start
    ticks_during = ticks
    stop.set()
    thread.join()
    start = time.monotonic()
    other = nv.nvmlDeviceGetPowerUsage(nv.nvmlDeviceGetHandleByIndex(args.gpu + 1))
    return {
        "power": power,
        "seconds": seconds,
        "ticks": ticks_during,
        "other_gpu_power": other,
        "other_gpu_seconds": time.monotonic() - start,
    }


def stress(args: argparse.Namespace) -> dict[str, Any]:
    """Eight threads read temperatures while the scenario file is being rewritten."""
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    seen: set[int] = set()
    errors: list[str] = []
    calls = 0
    lock = threading.Lock()
    deadline = time.monotonic() + args.deadline

    def reader() -> None:
        nonlocal calls
        while time.monotonic() < deadline:
            for h in handles:
                try:
                    value = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
                except nv.NVMLError as exc:
                    value, error = -1, str(exc)
                with lock:
                    calls += 1
                    seen.add(value)
                    if value < 0:
                        errors.append(error)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for thread in threads:
        thread.start()
    Path(args.ready).touch()
    for thread in threads:
        thread.join()
    return {"seen": sorted(seen), "errors": errors[:5], "calls": calls}


def uninit(_: argparse.Namespace) -> dict[str, Any]:
    nv._LoadNvmlLibrary()
    before = _try(nv.nvmlDeviceGetCount)
    before_set = _try(nv.nvmlEventSetCreate)
    nv.nvmlInit()
    during = nv.nvmlDeviceGetCount()
    nv.nvmlShutdown()
    return {
        "before": before,
        "before_event_set": before_set,
        "during": during,
        "after": _try(nv.nvmlDeviceGetCount),
        "shutdown_again": _try(nv.nvmlShutdown),
    }


def init_only(_: argparse.Namespace) -> dict[str, Any]:
    return {"init": _try(nv.nvmlInit)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--ready", default="")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=10.0)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--target", type=int, default=0)
    args = parser.parse_args()
    modes = {
        "inventory": inventory,
        "events": events,
        "watch-temperature": watch_temperature,
        "hang": hang,
        "stress": stress,
        "uninit": uninit,
        "init": init_only,
    }
    json.dump(modes[args.mode](args), sys.stdout)


if __name__ == "__main__":
    main()

"""Build the NVML injection library (libnvidia-ml.so.1) against NVIDIA's real nvml.h.

The header comes from the PyPI wheel nvidia-nvml-dev-cu12 (the `lab` extra), so gcc checks
every exported signature and lays out every struct exactly as the driver's NVML does.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from slurm_hooks.spank.build import BuildError, compile_c, up_to_date

SOURCE = Path(__file__).with_name("inject.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
HEADER_HINT = "install the lab extra: pip install 'slurm-medic[lab]'"
GCC_TIMEOUT = 120.0

# Every NVML symbol Medic relies on; tests check the built library exports each one.
EXPORTED_FUNCTIONS: tuple[str, ...] = (
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetInforomImageVersion",
    "nvmlDeviceGetPciInfo_v2",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetMemoryErrorCounter",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceGetFieldValues",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)


def find_header_dir() -> Path:
    """The include directory holding NVIDIA's nvml.h from the nvidia-nvml-dev-cu12 wheel."""
    spec = importlib.util.find_spec("nvidia")
    # `nvidia` is a namespace package shared by many wheels: look in every portion.
    portions = list(spec.submodule_search_locations or []) if spec else []
    for base in portions:
        include = Path(base) / "nvml_dev" / "include"
        if (include / "nvml.h").is_file():
            return include
    raise BuildError(f"nvml.h not found: {HEADER_HINT}")


def build_library(out_dir: Path) -> Path:
    """Compile inject.c into out_dir/libnvidia-ml.so.1 unless it is newer than its inputs.

    The result is written under a temporary name and renamed, so a process that loads the
    library while another rebuilds it never sees a half-written file."""
    include = find_header_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / LIBRARY_NAME
    if up_to_date(output, [SOURCE, include / "nvml.h"]):
        return output
    flags = ["-fPIC", "-shared", f"-I{include}", f"-Wl,-soname,{LIBRARY_NAME}"]
    return compile_c(SOURCE, output, flags, libs=("-lpthread",), timeout=GCC_TIMEOUT)

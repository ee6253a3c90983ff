"""Build the NVML injection library (libnvidia-ml.so.1) against NVIDIA's real nvml.h.

The header comes from the PyPI wheel nvidia-nvml-dev-cu12 (the `lab` extra), so gcc checks
every exported signature and lays out every struct exactly as the driver's NVML does.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from medic_core import proc

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


class BuildError(RuntimeError):
    """The library could not be built; the message is one line saying why."""


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


def _up_to_date(output: Path, inputs: list[Path]) -> bool:
    if not output.exists():
        return False
    built = output.stat().st_mtime_ns
    return all(built > p.stat().st_mtime_ns for p in inputs)


def build_library(out_dir: Path) -> Path:
    """Compile inject.c into out_dir/libnvidia-ml.so.1 unless it is newer than its inputs.

    The result is written under a temporary name and renamed, so a process that loads the
    library while another rebuilds it never sees a half-written file."""
    include = find_header_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / LIBRARY_NAME
    if _up_to_date(output, [SOURCE, include / "nvml.h"]):
        return output
    tmp = out_dir / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
    argv = [
        "gcc",
        "-O2",
        "-Wall",
        "-Werror",
        "-fPIC",
        "-shared",
        f"-I{include}",
        f"-Wl,-soname,{LIBRARY_NAME}",
        "-o",
        str(tmp),
        str(SOURCE),
        "-lpthread",
    ]
    result = proc.run(argv, timeout=GCC_TIMEOUT)
    if not result.ok:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"building {LIBRARY_NAME} failed: {_gcc_message(result)}")
    tmp.replace(output)
    return output


def _gcc_message(result: proc.CommandResult) -> str:
    if result.start_error:
        return f"cannot run gcc ({result.start_error}); install gcc"
    if result.timed_out:
        return f"gcc timed out after {result.seconds:.0f}s"
    errors = [line for line in result.stderr.splitlines() if ": error:" in line]
    return (errors[0] if errors else result.describe_failure()).strip()

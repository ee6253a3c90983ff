"""Print this node's GPUs as NVML reports them (what the demo runs on a lab node)."""

from __future__ import annotations

import os

import pynvml


def main() -> None:
    pynvml.nvmlInit()
    node = os.environ.get("SLURMD_NODENAME", "?")
    print(
        f"{node}: driver {pynvml.nvmlSystemGetDriverVersion()}, {pynvml.nvmlDeviceGetCount()} GPUs"
    )
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        dbe = pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        )
        temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        print(
            f"  gpu{i} {pynvml.nvmlDeviceGetName(h)} {pynvml.nvmlDeviceGetPciInfo(h).busId} "
            f"{temp}C volatile-dbe={dbe}"
        )
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()

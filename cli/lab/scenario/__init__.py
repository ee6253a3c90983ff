"""The simulated GPUs of one lab node, and the scenario file the NVML injection library reads.

A `NodeScenario` is immutable: `inject` and the repair transforms (`gpu_reset`,
`driver_reload`, `reboot`) return a new one; `write_scenario` publishes it atomically, and
every process using the injection library sees it on its next NVML call.
The file format and the table of what each repair clears are in docs/nvml-injection.md.

One concern a module: model (the node, its GPUs and the fault vocabulary), file_format
(render/parse/read/write), injection (`inject`), repairs (what a reset, a driver reload or
a reboot clears) and publishing (the file and the driver's kernel log lines). This package
re-exports their public names, which its many importers use as `scenario.<name>`.
"""

from cli.lab.scenario.file_format import (
    parse_scenario,
    read_scenario,
    render_scenario,
    write_scenario,
)
from cli.lab.scenario.injection import (
    VALID_KEYS,
    add_xid,
    inject,
)
from cli.lab.scenario.model import (
    CUDA_BY_DRIVER_BRANCH,
    DCGM_VERDICTS,
    DEFAULT_CUDA,
    DEFAULT_DRIVER,
    FORMAT_VERSION,
    H100_INFOROM_IMAGE,
    H100_MEMORY_MIB,
    H100_NAME,
    H100_NVLINKS,
    H100_PCI_BUSES,
    H100_PCI_DEVICE_ID,
    H100_PCI_SUBSYSTEM_ID,
    H100_VBIOS,
    IDLE_POWER_MW,
    IDLE_TEMPERATURE_C,
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
    default_gpu,
    default_scenario,
    scenario_path,
)
from cli.lab.scenario.publishing import (
    nvrm_xid_line,
    publish,
)
from cli.lab.scenario.repairs import (
    driver_reload,
    gpu_reset,
    reboot,
)

__all__ = [
    "CUDA_BY_DRIVER_BRANCH",
    "DCGM_VERDICTS",
    "DEFAULT_CUDA",
    "DEFAULT_DRIVER",
    "FORMAT_VERSION",
    "H100_INFOROM_IMAGE",
    "H100_MEMORY_MIB",
    "H100_NAME",
    "H100_NVLINKS",
    "H100_PCI_BUSES",
    "H100_PCI_DEVICE_ID",
    "H100_PCI_SUBSYSTEM_ID",
    "H100_VBIOS",
    "IDLE_POWER_MW",
    "IDLE_TEMPERATURE_C",
    "INFOROM_IMAGE_MAX_LEN",
    "NVML_ERRORS",
    "RECOVERABLE_BY",
    "THROTTLE_REASONS",
    "VALID_KEYS",
    "VBIOS_MAX_LEN",
    "Failure",
    "GpuProcess",
    "GpuState",
    "Hang",
    "NodeScenario",
    "XidEvent",
    "add_xid",
    "default_gpu",
    "default_scenario",
    "driver_reload",
    "gpu_reset",
    "inject",
    "nvrm_xid_line",
    "parse_scenario",
    "publish",
    "read_scenario",
    "reboot",
    "render_scenario",
    "scenario_path",
    "write_scenario",
]

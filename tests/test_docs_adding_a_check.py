"""docs/adding-a-check.md's example is a whole check: run it (issue 25, point 6), so the page
cannot call a client method that does not exist or a helper that changed."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from healthd.checks import base
from healthd.checks.base import Status
from healthd.checks.gpu_common import GpuSample, GpuSamples
from healthd.nvml_client import GpuInfo, MemoryUsage, Problem, Reading
from healthd.results import finding_of
from medic_core.vocabulary import ComponentKind

PAGE = Path(__file__).resolve().parent.parent / "docs" / "adding-a-check.md"
MODULE = "medic_docs_example_check"


@pytest.fixture
def example() -> Iterator[types.ModuleType]:
    [code] = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    module = types.ModuleType(MODULE)
    sys.modules[MODULE] = module
    try:
        exec(compile(code, str(PAGE), "exec"), module.__dict__)
        yield module
    finally:
        sys.modules.pop(MODULE, None)
        base._REGISTRY.pop(module.__dict__.get("NAME", ""), None)


def sample(index: int, used_mib: int | None) -> GpuSample[MemoryUsage]:
    info = GpuInfo(index, f"GPU-{index}", f"16509{index}", "H100", f"0000:1{index}:00.0")
    reading = (
        Reading(MemoryUsage(81559, used_mib))
        if used_mib is not None
        else Reading(problem=Problem.TIMEOUT, detail="hung")
    )
    return GpuSample(index, info, reading)


def test_the_example_registers_and_judges_every_gpu(example: types.ModuleType) -> None:
    spec = base._REGISTRY[example.NAME]
    assert spec.description == "GPU memory in use while no job holds the GPU."
    cfg = example.GpuMemoryLeakConfig()
    samples = GpuSamples(Reading(3), (sample(0, 10), sample(1, 4096), sample(2, None)))
    results = example.GpuMemoryLeakCheck.evaluate(example.GpuMemoryLeakObservation(samples), cfg)
    by_gpu = {r.target: r for r in results}
    assert by_gpu["0"].status is Status.OK
    assert by_gpu["1"].status is Status.WARN and by_gpu["1"].fault_class == "gpu.memory.leaked"
    assert by_gpu["2"].status is Status.UNKNOWN
    declared = set(spec.faults)
    assert {r.fault_class for r in results if r.fault_class and r.status is Status.WARN} <= declared
    # The finding names its component: the decision core attributes it to GPU 1 exactly.
    finding = finding_of(by_gpu["1"])
    assert finding.component.kind is ComponentKind.GPU and finding.component.serial == "165091"

"""docs/adding-a-check.md's example is a whole check, and it is run here (issue 25, point 6):
the fenced block after the page's `<!-- example-check: ... -->` marker is written to a module
in a temporary directory and imported, registering into a copy of the registry (no other
test sees it), then run as the daemon runs it: gather through the real `PynvmlClient` over a
fake pynvml module, evaluate, the runner, its config from a medic.toml. A page that calls a
client method or a helper that no longer exists, or whose check breaks a registry rule,
fails here."""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import threading
import tomllib
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import healthd.checks as checks
from healthd.checks import base
from healthd.checks.base import CheckContext, CheckSpec, Result, Status, remediation_for
from healthd.checks.gpu_common import GpuSample, GpuSamples
from healthd.nvml_client import GpuInfo, MemoryUsage, Problem, PynvmlClient, Reading
from healthd.results import finding_of
from healthd.runner import Runner, RunState
from medic_core.config import ConfigError, parse_config
from medic_core.vocabulary import ComponentKind
from tests.test_checks_registry import emitted_in_source

PAGE = Path(__file__).resolve().parent.parent / "docs" / "adding-a-check.md"
MARKER = "<!-- example-check: tests/test_adding_a_check_doc.py runs this block -->"
MODULE = "medic_docs_example_check"
H100_MIB = 81559  # what NVML reports as an H100 80GB HBM3's total


def example_source(page: str) -> str:
    """The fenced python block right after the marker."""
    at = page.find(MARKER)
    assert at >= 0, f"{PAGE}: the marker {MARKER!r} is gone; put it before the example"
    block = re.compile(r"\s*```python\n(.*?)\n```\n", re.S).match(page, at + len(MARKER))
    assert block, f"{PAGE}: no ```python block right after the example marker"
    return block.group(1) + "\n"


@contextmanager
def loaded_example(directory: Path) -> Iterator[types.ModuleType]:
    """The example imported from a file in `directory`, registered into a copy of the
    registry that is dropped on the way out."""
    # Every check loaded into the real registry first (the site's entry points too, which
    # load once per process): the copy then holds them all, and a name the example reuses
    # clashes as it would in the daemon.
    checks.registry()
    (directory / f"{MODULE}.py").write_text(example_source(PAGE.read_text()))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
        patch.syspath_prepend(str(directory))
        try:
            yield importlib.import_module(MODULE)
        finally:
            sys.modules.pop(MODULE, None)


@pytest.fixture
def example(tmp_path: Path) -> Iterator[types.ModuleType]:
    with loaded_example(tmp_path) as module:
        yield module


def spec_of(module: types.ModuleType) -> CheckSpec:
    spec: CheckSpec = base._REGISTRY[module.NAME]
    return spec


# --- a fake pynvml module, under the real client -----------------------------------------


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_FunctionNotFound(NVMLError):
    pass


@dataclasses.dataclass(frozen=True)
class _Memory:
    total: int
    used: int


@dataclasses.dataclass(frozen=True)
class _Pci:
    busId: bytes


class FakePynvml:
    """pynvml as far as the client's device count, identity and memory reads go. `totals`
    per GPU: MiB, or "lost" (NVML_ERROR_GPU_IS_LOST), "not_supported", "hang" (waits for
    `release`)."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    nvmlMemory_v2 = 0x02000028

    def __init__(self, totals: list[int | str]) -> None:
        self.totals = totals
        self.release = threading.Event()
        self.memory_calls = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.totals)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}"

    def nvmlDeviceGetSerial(self, handle: int) -> str:
        return f"165000{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, handle: int) -> _Pci:
        return _Pci(f"00000000:{0x18 + handle:02X}:00.0".encode())

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int = 0) -> _Memory:
        self.memory_calls += 1
        answer = self.totals[handle]
        if answer == "hang":
            assert self.release.wait(30)
        elif answer == "lost":
            raise NVMLError(15)
        elif answer == "not_supported":
            raise NVMLError_NotSupported(3)
        mib = int(answer) if isinstance(answer, int) else 0
        return _Memory(mib << 20, 1 << 20)


@pytest.fixture
def nvml() -> Iterator[Any]:
    """A client factory; every fake's hung call is released and every client closed after."""
    made: list[tuple[FakePynvml, PynvmlClient]] = []

    def make(totals: list[int | str]) -> tuple[FakePynvml, PynvmlClient]:
        nv = FakePynvml(totals)
        loader: Any = lambda: nv  # noqa: E731 (a module, as far as the client knows)
        client = PynvmlClient(call_timeout=0.2, loader=loader).open()
        made.append((nv, client))
        return nv, client

    yield make
    for nv, client in made:
        nv.release.set()
        client.close()


def by_target(results: list[Result]) -> dict[str | None, Result]:
    return {r.target: r for r in results}


# --- the page ----------------------------------------------------------------------------


def test_the_marked_block_is_the_only_python_on_the_page() -> None:
    page = PAGE.read_text()
    assert page.count("```python") == 1 and page.count(MARKER) == 1
    assert example_source(page).startswith('"""')


def test_a_page_without_the_marker_says_where_to_put_it() -> None:
    with pytest.raises(AssertionError, match="marker"):
        example_source(PAGE.read_text().replace(MARKER, ""))


# --- the example, registered ---------------------------------------------------------------


def test_the_example_registers_as_the_page_says(example: types.ModuleType) -> None:
    spec = spec_of(example)
    assert spec.module == MODULE and spec.check_class is example.GpuMemorySizeCheck
    assert spec.is_gpu_check and spec.description.startswith("GPU memory size: ")
    assert "\n" not in spec.description
    # The registry's rules, as tests/test_checks_registry.py holds every shipped check to:
    # every class the source emits is declared, and the other way round.
    assert emitted_in_source(spec) == set(spec.faults) == {"gpu.memory.short"}
    # One recommendation source: the check's own word, which REMEDIATIONS does not give.
    declared = spec.faults["gpu.memory.short"]
    assert declared.words() == ("drain",) and remediation_for("gpu.memory.short") is None


def test_the_example_leaves_the_global_registry_as_it_was(tmp_path: Path) -> None:
    before = dict(base._REGISTRY)
    with loaded_example(tmp_path) as module:
        assert module.NAME in base._REGISTRY and module.NAME not in before
    assert before == base._REGISTRY and module.NAME not in {s.name for s in checks.registry()}
    assert MODULE not in sys.modules


# --- gather and evaluate, against the real client over a fake pynvml ------------------------


def test_gather_and_evaluate_judge_every_gpu(example: types.ModuleType, nvml: Any) -> None:
    _, client = nvml([H100_MIB, H100_MIB, 40960, "lost", "not_supported", H100_MIB - 256])
    check = spec_of(example).create()
    cfg = example.GpuMemorySizeConfig()
    observation = check.gather(CheckContext.for_root("/", nvml=client), cfg)
    results = by_target(check.evaluate(observation, cfg))

    assert set(results) == {"0", "1", "2", "3", "4", "5"}
    assert results["0"].status is Status.OK and results["0"].message == f"GPU 0: {H100_MIB} MiB"
    short = results["2"]
    assert (short.status, short.fault_class) == (Status.CRITICAL, "gpu.memory.short")
    assert short.message == f"GPU 2: 40960 MiB, {H100_MIB - 40960} MiB short of {H100_MIB} MiB"
    assert short.evidence["recommendation"] == "drain"
    assert short.evidence["uuid"] == "GPU-2" and short.evidence["total_mib"] == 40960
    assert (results["3"].status, results["3"].fault_class) == (
        Status.UNKNOWN,
        "check.nvml.gpu_lost",
    )
    assert results["4"].status is Status.NOT_APPLICABLE
    assert results["5"].status is Status.OK  # exactly at the tolerance
    # The finding names its component: the decision core attributes it to GPU 2 exactly.
    finding = finding_of(short)
    assert finding.component.kind is ComponentKind.GPU and finding.component.serial == "1650002"


def test_a_hung_read_is_unknown_for_that_gpu_only(example: types.ModuleType, nvml: Any) -> None:
    _, client = nvml([H100_MIB, "hang", H100_MIB])
    check = spec_of(example).create()
    cfg = example.GpuMemorySizeConfig()
    results = by_target(
        check.evaluate(check.gather(CheckContext.for_root("/", nvml=client), cfg), cfg)
    )
    assert (results["1"].status, results["1"].fault_class) == (
        Status.UNKNOWN,
        "check.nvml.timeout",
    )
    assert results["0"].status is results["2"].status is Status.OK


def test_the_runner_runs_it_with_its_config_from_medic_toml(
    example: types.ModuleType, nvml: Any
) -> None:
    _, client = nvml([H100_MIB, 95830])  # an H100 NVL's 94 GB beside an 80 GB part
    toml = "[checks.gpu_memory_size]\nexpected_total_mib = 95830\ntolerance_mib = 0\n"
    config = parse_config(tomllib.loads(toml), Path("/etc/medic/medic.toml"), "gpu001")
    configs = checks.load_check_configs(config)
    assert configs[example.NAME] == example.GpuMemorySizeConfig(
        expected_total_mib=95830, tolerance_mib=0
    )
    runner = Runner(CheckContext.for_root("/", nvml=client), configs, [spec_of(example)])
    [outcome] = runner.run().outcomes
    assert outcome.state is RunState.DONE
    results = by_target(list(outcome.results))
    assert results["0"].fault_class == "gpu.memory.short" and results["1"].status is Status.OK


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("tolerance_mib = -1", "checks.gpu_memory_size.tolerance_mib"),
        ('expected_total_mib = "80GB"', "checks.gpu_memory_size.expected_total_mib"),
        ("expected_total_mib = 99999999999", "checks.gpu_memory_size.expected_total_mib"),
        ("tolerance = 5", "checks.gpu_memory_size.tolerance"),
    ],
)
def test_a_bad_key_is_one_line_naming_the_file_and_key(
    example: types.ModuleType, table: str, key: str
) -> None:
    path = Path("/etc/medic/medic.toml")
    config = parse_config(tomllib.loads(f"[checks.gpu_memory_size]\n{table}\n"), path, "gpu001")
    with pytest.raises(ConfigError) as info:
        checks.load_check_configs(config)
    text = str(info.value)
    assert text.startswith(f"{path}: {key}: ") and "\n" not in text


# --- evaluate on any observation -----------------------------------------------------------

readings: st.SearchStrategy[Reading[MemoryUsage]] = st.one_of(
    st.builds(
        lambda total: Reading(MemoryUsage(total, 0)), st.integers(min_value=0, max_value=1 << 20)
    ),
    st.builds(lambda p: Reading(problem=p, detail="x"), st.sampled_from(list(Problem))),
)


def test_evaluate_gives_one_result_per_gpu_on_any_readings(tmp_path: Path) -> None:
    with loaded_example(tmp_path) as example:

        @settings(max_examples=200, deadline=None)
        @given(
            values=st.lists(readings, max_size=9),
            count=st.none() | st.sampled_from(list(Problem)),
            expected=st.integers(min_value=0, max_value=1 << 20),
            tolerance=st.integers(min_value=0, max_value=1 << 20),
        )
        def judged(
            values: list[Reading[MemoryUsage]], count: Problem | None, expected: int, tolerance: int
        ) -> None:
            cfg = example.GpuMemorySizeConfig(expected_total_mib=expected, tolerance_mib=tolerance)
            samples = GpuSamples(
                Reading(len(values)) if count is None else Reading(problem=count, detail="x"),
                tuple(
                    GpuSample(i, GpuInfo(i, f"GPU-{i}", "", "H100", f"0000:{i:02x}:00.0"), v)
                    for i, v in enumerate(values)
                ),
            )
            observation = example.GpuMemorySizeObservation(samples)
            results = example.GpuMemorySizeCheck.evaluate(observation, cfg)
            assert results and all("\n" not in r.message for r in results)
            if count is None and values:
                assert [r.target for r in results] == [str(i) for i in range(len(values))]
            for result in results:
                fault_class = result.fault_class or ""
                assert fault_class in ("", "gpu.memory.short") or fault_class.startswith(
                    "check.nvml."
                )
                assert (result.status is Status.CRITICAL) == (fault_class == "gpu.memory.short")

        judged()

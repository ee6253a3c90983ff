"""`PynvmlClient.trend_counters` reads the counters NVML gives as field values (remapped rows,
retired pages, PCIe replays, and the NVLink error totals, instead of four counters on every
link: 72 calls on an H100) in one nvmlDeviceGetFieldValues call; a counter whose fields the
GPU does not give is read by its own calls, and remembered as such until NVML is initialised
again. A fake pynvml counts the calls; the last tests run the real pynvml against the NVML
injection library."""

from __future__ import annotations

import ctypes
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cli.lab import scenario as sc
from cli.lab.nvml.build import build_library
from healthd.nvml_client import _TREND_FIELDS, PynvmlClient, TrendCounters
from medic_core import proc
from tests.fakes import FakeNvml, NVMLError, NVMLError_FunctionNotFound, NVMLError_NotSupported

LINKS = 18
NOT_SUPPORTED, INVALID_ARGUMENT, UNKNOWN = 3, 2, 999
REMAPPED, RETIRED, PCIE = (2, 1), (1, 2), 5  # (correctable, uncorrectable), (SBE, DBE)


class CounterNvml(FakeNvml):
    """One GPU whose link `l` has counted `per_link[c] * (l + 1)` errors of counter c, with
    REMAPPED rows, RETIRED pages and PCIE replays. The fields answer as `fields` says: ok,
    not_supported (per field), missing (an older driver: no such function), unknown (an
    error on the NVLink replay field); `nvlinks` = 0 is a PCIe card (no NVLink at all)."""

    NVML_NVLINK_MAX_LINKS = LINKS
    NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY = 0, 1
    NVML_NVLINK_ERROR_DL_CRC_FLIT, NVML_NVLINK_ERROR_DL_CRC_DATA = 2, 3
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
    NVML_FI_DEV_RETIRED_SBE, NVML_FI_DEV_RETIRED_DBE = 29, 30
    NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94
    NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_UNC = 142, 143
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC = 0, 0
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL = 0, 1

    def __init__(self, fields: str = "ok", nvlinks: int = LINKS) -> None:
        super().__init__(gpus=1)
        self.fields = fields
        self.nvlinks = nvlinks
        self.per_link = {0: 1, 1: 2, 2: 3, 3: 4}  # replay, recovery, crc flit, crc data
        self.calls = {"fields": 0, "links": 0, "own": 0}

    def total(self, counter: int) -> int:
        return sum(self.per_link[counter] * (link + 1) for link in range(self.nvlinks))

    def expected(self) -> dict[str, int | None]:
        nvlink = self.nvlinks > 0
        return {
            "ecc_corrected": 1,
            "remapped_rows": sum(REMAPPED),
            "retired_pages": sum(RETIRED),
            "pcie_replay": PCIE,
            "nvlink_crc": self.total(2) + self.total(3) if nvlink else None,
            "nvlink_replay": self.total(0) + self.total(1) if nvlink else None,
            "throttle_ms": 0,
        }

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        self.calls["links"] += 1
        if not self.nvlinks:
            raise NVMLError_NotSupported(NOT_SUPPORTED)
        if link >= self.nvlinks:
            raise NVMLError(INVALID_ARGUMENT)
        return self.per_link[counter] * (link + 1)

    def nvmlDeviceGetFieldValues(self, handle: int, ids: list[int]) -> list[SimpleNamespace]:
        self.calls["fields"] += 1
        if self.fields == "missing":
            raise NVMLError_FunctionNotFound(13)
        values = {
            38: self.total(2),
            45: self.total(3),
            52: self.total(0),
            59: self.total(1),
            29: RETIRED[0],
            30: RETIRED[1],
            94: PCIE,
            142: REMAPPED[0],
            143: REMAPPED[1],
        }
        out = []
        for field in ids:
            code = 0
            if self.fields == "not_supported" or (field in (38, 45, 52, 59) and not self.nvlinks):
                code = NOT_SUPPORTED
            elif self.fields == "unknown" and field == 52:
                code = UNKNOWN
            value = SimpleNamespace(ullVal=values[field], uiVal=7)
            out.append(SimpleNamespace(nvmlReturn=code, valueType=3, value=value))
        return out

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        self.calls["own"] += 1
        return *REMAPPED, 0, 0

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int) -> list[int]:
        self.calls["own"] += 1
        return [0x1000 * i for i in range(RETIRED[cause])]

    def nvmlDeviceGetPcieReplayCounter(self, handle: int) -> int:
        self.calls["own"] += 1
        return PCIE

    # read by their own calls always
    def nvmlDeviceGetTotalEccErrors(self, handle: int, error: int, counter: int) -> int:
        return 1

    def nvmlDeviceGetViolationStatus(self, handle: int, policy: int) -> SimpleNamespace:
        return SimpleNamespace(violationTime=0)


OWN_CALLS = 4  # remapped rows 1, retired pages 2, PCIe replays 1


def client_for(nv: CounterNvml) -> PynvmlClient:
    loader: Any = lambda: nv  # noqa: E731 (a module, as far as the client knows)
    return PynvmlClient(call_timeout=5.0, loader=loader).open()


def read(client: PynvmlClient) -> dict[str, int | None]:
    return client.trend_counters(0).values()


def test_the_counters_come_from_one_field_call_and_equal_their_own_calls() -> None:
    nv = CounterNvml("ok")
    with client_for(nv) as client:
        assert read(client) == nv.expected()
        assert read(client) == nv.expected()
    assert nv.calls == {"fields": 2, "links": 0, "own": 0}
    # The own calls (what an older driver gets, link by link for NVLink) agree.
    old = CounterNvml("missing")
    with client_for(old) as client:
        assert read(client) == nv.expected()
    assert old.calls == {"fields": 1, "links": 4 * LINKS, "own": OWN_CALLS}


@pytest.mark.parametrize("fields", ["not_supported", "missing"])
def test_a_gpu_without_the_fields_is_read_by_own_calls_and_not_asked_again(fields: str) -> None:
    nv = CounterNvml(fields)
    client = client_for(nv)
    for _ in range(3):
        assert read(client) == nv.expected()
    assert nv.calls == {"fields": 1, "links": 3 * 4 * LINKS, "own": 3 * OWN_CALLS}
    client.close()  # NVML initialised again (a driver reload): the fields are asked again
    client.open()
    assert read(client) == nv.expected()
    assert nv.calls["fields"] == 2
    client.close()


def test_an_error_on_a_field_reads_its_counter_by_its_calls_this_time_only() -> None:
    nv = CounterNvml("unknown")
    with client_for(nv) as client:
        assert read(client) == nv.expected()
        assert nv.calls == {"fields": 1, "links": 2 * LINKS, "own": 0}  # NVLink replays only
        nv.fields = "ok"
        assert read(client) == nv.expected()
    assert nv.calls == {"fields": 2, "links": 2 * LINKS, "own": 0}


def test_a_pcie_card_has_no_nvlink_counters_and_the_others_still_come_from_the_fields() -> None:
    nv = CounterNvml("ok", nvlinks=0)
    with client_for(nv) as client:
        assert read(client) == nv.expected()
        first = dict(nv.calls)
        assert read(client) == nv.expected()
    assert nv.expected()["nvlink_crc"] is None
    # NVLink: fields not supported, so one own call a counter (NOT_SUPPORTED) each run.
    assert first == {"fields": 1, "links": 2, "own": 0}
    assert nv.calls == {"fields": 2, "links": 4, "own": 0}


# ---- the injection library: the fields carry the scenario's counts -----------------------------

_PROBE = """
import json, pynvml as n
n.nvmlInit()
kinds = ["CRC_FLIT_ERROR", "CRC_DATA_ERROR", "REPLAY_ERROR", "RECOVERY_ERROR"]
ids = [getattr(n, f"NVML_FI_DEV_NVLINK_{k}_COUNT_TOTAL") for k in kinds]
ids.append(n.NVML_FI_DEV_PCIE_REPLAY_COUNTER)
out = []
for i in range(n.nvmlDeviceGetCount()):
    fields = n.nvmlDeviceGetFieldValues(n.nvmlDeviceGetHandleByIndex(i), ids)
    out.append([[f.nvmlReturn, f.valueType, f.value.ullVal] for f in fields])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    library = build_library(tmp_path_factory.mktemp("nvml"))
    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)  # before pynvml's first nvmlInit
    return library.parent


def without_nvlink(s: sc.NodeScenario, gpu: int) -> sc.NodeScenario:
    gpus = list(s.gpus)
    gpus[gpu] = replace(gpus[gpu], nvlinks=0)
    return replace(s, gpus=tuple(gpus))


def test_the_injection_library_gives_the_totals_as_fields(lib_dir: Path, tmp_path: Path) -> None:
    s = sc.default_scenario("n1", 3)
    for spec in ("nvlink.crc_flit=4", "nvlink.crc_data=1", "nvlink.replay=2", "nvlink.recovery=6"):
        s = sc.inject(s, 1, spec)
    s = without_nvlink(sc.inject(s, 1, "pcie.replay=3"), 2)
    path = tmp_path / "n1.scenario"
    sc.write_scenario(path, s)
    env = {"LD_LIBRARY_PATH": str(lib_dir), "NVML_INJECT_SCENARIO": str(path), "PATH": "/usr/bin"}
    result = proc.run([sys.executable, "-c", _PROBE], timeout=30, env=env)
    assert result.ok, result.describe_failure() + "\n" + result.stderr
    g0, g1, g2 = json.loads(result.stdout)
    ull = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert g0 == [[0, ull, 0]] * 5
    assert g1 == [[0, ull, 4], [0, ull, 1], [0, ull, 2], [0, ull, 6], [0, ull, 3]]
    assert [f[0] for f in g2] == [NOT_SUPPORTED] * 4 + [0]  # no NVLink: not supported, per field


@pytest.fixture
def injected(lib_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "n1.scenario"
    monkeypatch.setenv("NVML_INJECT_SCENARIO", str(path))
    yield path


def test_the_sensor_reads_the_same_counts_through_the_fields_as_by_own_calls(
    injected: Path,
) -> None:
    s = sc.default_scenario("n1", 2)
    for spec in ("nvlink.crc_flit=4", "nvlink.crc_data=1", "nvlink.replay=2", "nvlink.recovery=6"):
        s = sc.inject(s, 1, spec)
    for spec in ("pcie.replay=3", "remap.correctable=2", "remap.uncorrectable=1", "retired.sbe=1"):
        s = sc.inject(s, 1, spec)
    sc.write_scenario(injected, s)
    with PynvmlClient(call_timeout=5.0) as client:
        fields = client.trend_counters(1)
        assert client._own_calls == {1: set()}  # every counter from the fields
        client._own_calls[1] = set(_TREND_FIELDS)  # as for a GPU that gives no fields
        own = client.trend_counters(1)
    assert (
        fields
        == own
        == TrendCounters(
            ecc_corrected=0,
            remapped_rows=3,
            retired_pages=1,
            pcie_replay=3,
            nvlink_crc=5,
            nvlink_replay=8,
            throttle_ms=0,
        )
    )

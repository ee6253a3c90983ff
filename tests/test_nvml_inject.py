"""The NVML injection library, exercised through the real, unmodified pynvml.

pynvml runs in subprocesses (tests/nvml_probe/probe.py) that find the library through
LD_LIBRARY_PATH, as Medic's daemon and Slurm hooks do in the lab.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest

from cli.lab import scenario as sc
from cli.lab.cluster import slack
from cli.lab.nvml import build
from medic_core import proc

PROBE = Path(__file__).parent / "nvml_probe" / "probe.py"
XID = pynvml.nvmlEventTypeXidCriticalError
DBE = pynvml.nvmlEventTypeDoubleBitEccError


# ---- fixtures and helpers ------------------------------------------------------------------


@pytest.fixture(scope="session")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nvml-lib")
    build.build_library(out)
    return out


@pytest.fixture
def node_file(tmp_path: Path) -> Path:
    """Where the probe (as node n1) reads its scenario; starts as the default node."""
    path = tmp_path / "nodes" / "n1.scenario"
    sc.write_scenario(path, sc.default_scenario("n1"))
    return path


def probe_env(lib_dir: Path, scenario_dir: Path, **node_vars: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": str(lib_dir),
        "NVML_INJECT_SCENARIO": str(scenario_dir / "{node}.scenario"),
    }
    env.update(node_vars or {"MEDIC_NODE_NAME": "n1"})
    return env


def run_probe(env: dict[str, str], *args: str, timeout: float = 30.0) -> dict[str, Any]:
    result = proc.run([sys.executable, str(PROBE), *args], timeout=timeout, env=env)
    assert result.ok, result.describe_failure() + "\n" + result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    timeout *= slack()
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        threading.Event().wait(0.005)


@pytest.fixture
def background() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield pool


def start_probe(
    pool: ThreadPoolExecutor, env: dict[str, str], *args: str
) -> Future[dict[str, Any]]:
    return pool.submit(run_probe, env, *args)


def update(path: Path, gpu: int | None, *specs: str) -> float:
    """Inject into the scenario file; returns the wall-clock time the new file was in place."""
    current = sc.read_scenario(path)
    for spec in specs:
        current = sc.inject(current, gpu, spec)
    sc.write_scenario(path, current)
    return time.time()


# ---- the build ------------------------------------------------------------------------------


def test_build_is_skipped_when_up_to_date(tmp_path: Path) -> None:
    lib = build.build_library(tmp_path)
    assert lib == tmp_path / "libnvidia-ml.so.1"
    built = lib.stat().st_mtime_ns
    assert build.build_library(tmp_path) == lib
    assert lib.stat().st_mtime_ns == built


def test_every_symbol_medic_needs_is_exported(lib_dir: Path) -> None:
    lib = ctypes.CDLL(str(lib_dir / "libnvidia-ml.so.1"))
    missing = [name for name in build.EXPORTED_FUNCTIONS if not hasattr(lib, name)]
    assert missing == []


def test_build_error_names_gcc_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "inject.c"
    bad.write_text("int broken(void) { return undeclared; }\n")
    monkeypatch.setattr(build, "SOURCE", bad)
    with pytest.raises(build.BuildError) as err:
        build.build_library(tmp_path / "out")
    message = str(err.value)
    assert "\n" not in message and "undeclared" in message


# ---- struct layouts: nvml.h versus pynvml's ctypes ------------------------------------------

# C type in nvml.h -> the pynvml ctypes structure passed for it
STRUCTS = {
    "nvmlPciInfo_t": pynvml.nvmlPciInfo_t,
    "nvmlMemory_t": pynvml.c_nvmlMemory_t,
    "nvmlMemory_v2_t": pynvml.c_nvmlMemory_v2_t,
    "nvmlEventData_t": pynvml.c_nvmlEventData_t,
    "nvmlProcessInfo_t": pynvml.c_nvmlProcessInfo_v3_t,
    "nvmlUtilization_t": pynvml.c_nvmlUtilization_t,
    "nvmlFieldValue_t": pynvml.c_nvmlFieldValue_t,
    "nvmlTemperature_t": pynvml.c_nvmlTemperature_v1_t,
}
VERSIONS = {"nvmlMemory_v2": pynvml.nvmlMemory_v2, "nvmlTemperature_v1": pynvml.nvmlTemperature_v1}


def _layout_probe_source() -> str:
    """A C program printing `name value` lines; generated from pynvml's own field lists."""
    lines = [
        "#define NVML_NO_UNVERSIONED_FUNC_DEFS 1",
        "#include <nvml.h>",
        "#include <stddef.h>",
        "#include <stdio.h>",
        "int main(void) {",
    ]
    for ctype, struct in STRUCTS.items():
        lines.append(f'printf("{ctype} %zu\\n", sizeof({ctype}));')
        for name, *_ in struct._fields_:
            lines.append(f'printf("{ctype}.{name} %zu\\n", offsetof({ctype}, {name}));')
    for const in VERSIONS:
        lines.append(f'printf("{const} %u\\n", (unsigned int){const});')
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


def test_struct_layouts_match_pynvml(tmp_path: Path) -> None:
    source = tmp_path / "layout.c"
    source.write_text(_layout_probe_source())
    binary = tmp_path / "layout"
    argv = ["gcc", f"-I{build.find_header_dir()}", "-o", str(binary), str(source)]
    compiled = proc.run(argv, timeout=60)
    assert compiled.ok, compiled.stderr
    ran = proc.run([str(binary)], timeout=10, check=True)
    c_side = dict(line.split() for line in ran.stdout.splitlines())

    py_side: dict[str, str] = {}
    for ctype, struct in STRUCTS.items():
        py_side[ctype] = str(ctypes.sizeof(struct))
        for name, *_ in struct._fields_:
            py_side[f"{ctype}.{name}"] = str(getattr(struct, name).offset)
    py_side.update({name: str(value) for name, value in VERSIONS.items()})
    assert c_side == py_side


# ---- what pynvml sees ---------------------------------------------------------------------------


def test_default_node_inventory(lib_dir: Path, node_file: Path) -> None:
    data = run_probe(probe_env(lib_dir, node_file.parent), "inventory")
    expected = sc.default_scenario("n1")
    assert data["count"] == 8
    assert data["driver"] == "550.127.05"
    assert data["nvml"] == "12.550.127.05"
    assert data["cuda"] == data["cuda_v2"] == 12040
    buses = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    for i, (gpu, want) in enumerate(zip(data["gpus"], expected.gpus, strict=True)):
        assert gpu["index"] == gpu["minor"] == i
        assert gpu["name"] == "NVIDIA H100 80GB HBM3"
        assert gpu["uuid"] == want.uuid and gpu["uuid"].startswith("GPU-")
        assert gpu["serial"] == want.serial
        assert gpu["pci"]["busId"] == f"00000000:{buses[i]}:00.0"
        assert gpu["pci"]["busIdLegacy"] == f"0000:{buses[i]}:00.0"
        assert gpu["pci"]["pciDeviceId"] == 0x233010DE
        assert gpu["by_uuid_same"] == gpu["by_pci_same"] == i
        assert gpu["memory"] == [81559 * 2**20, 81559 * 2**20, 0]
        assert gpu["pcie"] == [5, 16, 5, 16]
        assert gpu["nvlinks"] == [1] * 18
        assert gpu["persistence"] == 1 and gpu["ecc_mode"] == [1, 1]
        assert gpu["retired_pending"] == 0 and gpu["retired_dbe"] == []
        assert gpu["remapped_rows"] == [0, 0, 0, 0]
        assert gpu["compute_processes"] == [] and gpu["graphics_processes"] == 0
        assert gpu["supported_events"] & (XID | DBE) == XID | DBE
        assert gpu["field_values"] == [[0, 0], [pynvml.NVML_ERROR_NOT_SUPPORTED, 0]]
    assert len({g["uuid"] for g in data["gpus"]}) == 8


def test_injected_values_reach_pynvml(lib_dir: Path, node_file: Path) -> None:
    update(node_file, 2, "ecc.dbe=2", "retired.dbe=3", "retired.pending=1", "remap.pending=1")
    update(node_file, 3, "nvlink.3=down", "pcie.width=8", "pcie.gen=3", "temperature=92")
    update(node_file, 4, "throttle=hw_slowdown|hw_power_brake", "process=4242:2048")
    update(node_file, 5, "persistence=0", "remap.failure=1", "remap.uncorrectable=1")
    update(node_file, None, "driver=535.104.05")
    data = run_probe(probe_env(lib_dir, node_file.parent), "inventory")
    g2, g3, g4, g5 = data["gpus"][2:6]
    assert data["driver"] == "535.104.05" and data["cuda"] == 12020
    assert g2["ecc"]["dbe.volatile"] == g2["ecc"]["dbe.aggregate"] == 2
    assert g2["dram_dbe_volatile"] == 2 and g2["field_values"][0] == [0, 2]
    assert len(g2["retired_dbe"]) == g2["retired_dbe_v2"] == 3
    assert g2["retired_pending"] == 1 and g2["remapped_rows"] == [0, 0, 1, 0]
    assert g3["nvlinks"][3] == 0 and sum(g3["nvlinks"]) == 17
    assert g3["pcie"] == [3, 8, 5, 16]
    assert g3["temperature"] == g3["temperature_v"] == 92
    assert g4["clocks_event_reasons"] == g4["clocks_throttle_reasons"] == 0x8 | 0x80
    assert g4["compute_processes"] == [[4242, 2048 * 2**20]]
    assert g4["memory"][2] == 2048 * 2**20 and g4["memory_v2"][3] == 2048 * 2**20
    assert g5["persistence"] == 0 and g5["remapped_rows"] == [0, 1, 0, 1]


def test_fail_lost_and_missing(lib_dir: Path, node_file: Path) -> None:
    update(node_file, 1, "fail.nvmlDeviceGetTemperature=999")
    update(node_file, None, "fail.nvmlDeviceGetSerial=NOT_SUPPORTED")
    update(node_file, 3, "missing=1")
    update(node_file, 5, "lost=1")
    data = run_probe(probe_env(lib_dir, node_file.parent), "inventory")
    unknown = {"error": "NVMLError_Unknown", "code": 999}
    assert data["count"] == 7
    assert data["gpus"][1]["temperature"] == data["gpus"][1]["temperature_v"] == unknown
    assert data["gpus"][0]["temperature"] == 33
    assert all(g["serial"]["code"] == 3 for i, g in enumerate(data["gpus"]) if i != 4)
    # NVML index 3 is now slot 4; the lost GPU (slot 5) is NVML index 4.
    assert data["gpus"][3]["pci"]["busId"] == "00000000:9A:00.0"
    assert data["gpus"][4] == {"error": "NVMLError_GpuIsLost", "code": 15}


def test_init_failure_rule(lib_dir: Path, node_file: Path) -> None:
    update(node_file, None, "fail.nvmlInit=DRIVER_NOT_LOADED")
    data = run_probe(probe_env(lib_dir, node_file.parent), "init")
    assert data["init"] == {"error": "NVMLError_DriverNotLoaded", "code": 9}


def test_calls_before_init_and_after_shutdown(lib_dir: Path, node_file: Path) -> None:
    data = run_probe(probe_env(lib_dir, node_file.parent), "uninit")
    uninitialized = {"error": "NVMLError_Uninitialized", "code": 1}
    assert data["before"] == data["before_event_set"] == uninitialized
    assert data["during"] == 8
    assert data["after"] == data["shutdown_again"] == uninitialized


@pytest.mark.parametrize("content", [None, "this is not a scenario\n", "version=1\ngpus=x\n"])
def test_missing_or_bad_scenario_fails_init(
    lib_dir: Path, tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "n1.scenario"
    if content is not None:
        path.write_text(content)
    env = probe_env(lib_dir, tmp_path)
    result = proc.run([sys.executable, str(PROBE), "init"], timeout=30, env=env)
    assert json.loads(result.stdout)["init"] == {"error": "NVMLError_DriverNotLoaded", "code": 9}
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0]


def test_node_name_selects_the_scenario(lib_dir: Path, node_file: Path) -> None:
    sc.write_scenario(node_file.parent / "n2.scenario", sc.default_scenario("n2"))
    n2 = sc.default_scenario("n2").gpus[0].uuid
    by_slurmd = probe_env(lib_dir, node_file.parent, SLURMD_NODENAME="n2")
    assert run_probe(by_slurmd, "inventory")["gpus"][0]["uuid"] == n2
    both = probe_env(lib_dir, node_file.parent, MEDIC_NODE_NAME="n1", SLURMD_NODENAME="n2")
    n1 = sc.default_scenario("n1").gpus[0].uuid
    assert run_probe(both, "inventory")["gpus"][0]["uuid"] == n1


# ---- a running process sees changes --------------------------------------------------------------


def test_xid_after_registration_is_delivered_and_earlier_one_is_not(
    lib_dir: Path, node_file: Path, tmp_path: Path, background: ThreadPoolExecutor
) -> None:
    update(node_file, 1, "xid=48")  # before registration: must never be delivered
    ready = tmp_path / "ready"
    env = probe_env(lib_dir, node_file.parent)
    future = start_probe(background, env, "events", "--ready", str(ready), "--count", "2")
    wait_for(ready.exists)
    written = update(node_file, 2, "xid=79")
    update(node_file, 5, "ecc.dbe=1")
    received = future.result(timeout=30)["events"]
    assert [(e["index"], e["type"], e["data"]) for e in received] == [(2, XID, 79), (5, DBE, 0)]
    latency = received[0]["at"] - written
    print(f"xid latency: {latency * 1000:.0f} ms")
    assert latency < 1.0


def test_event_wait_honours_its_timeout(
    lib_dir: Path, node_file: Path, tmp_path: Path, background: ThreadPoolExecutor
) -> None:
    ready = tmp_path / "ready"
    env = probe_env(lib_dir, node_file.parent)
    args = ("events", "--ready", str(ready), "--count", "1", "--deadline", "0.5")
    data = start_probe(background, env, *args).result(timeout=30)
    assert data["events"] == []
    assert 3 <= data["timeouts"] <= 6  # 100 ms waits over 0.5 s


def test_running_process_sees_new_values(
    lib_dir: Path, node_file: Path, tmp_path: Path, background: ThreadPoolExecutor
) -> None:
    ready = tmp_path / "ready"
    env = probe_env(lib_dir, node_file.parent)
    args = ("watch-temperature", "--ready", str(ready), "--gpu", "6", "--target", "95")
    future = start_probe(background, env, *args)
    wait_for(ready.exists)
    update(node_file, 6, "temperature=95")
    data = future.result(timeout=30)
    assert (data["first"], data["last"]) == (33, 95)


def test_concurrent_readers_while_the_file_is_rewritten(
    lib_dir: Path, node_file: Path, tmp_path: Path, background: ThreadPoolExecutor
) -> None:
    ready = tmp_path / "ready"
    env = probe_env(lib_dir, node_file.parent)
    future = start_probe(background, env, "stress", "--ready", str(ready), "--deadline", "1.5")
    wait_for(ready.exists)
    rewrites = 0
    while not future.done():
        update(node_file, rewrites % 8, f"temperature={40 + rewrites % 2}")
        rewrites += 1
    data = future.result()
    print(f"stress: {data['calls']} calls across {rewrites} rewrites")
    assert data["errors"] == []
    assert set(data["seen"]) <= {33, 40, 41} and {40, 41} <= set(data["seen"])
    assert rewrites >= 10


def test_hang_blocks_the_caller_but_not_other_threads(lib_dir: Path, node_file: Path) -> None:
    update(node_file, 0, "hang.nvmlDeviceGetPowerUsage=0.5")
    data = run_probe(probe_env(lib_dir, node_file.parent), "hang", "--gpu", "0")
    assert data["power"] == 71000
    assert 0.5 <= data["seconds"] < 1.5
    assert data["ticks"] >= 10  # the ticker thread ran while the call hung
    assert data["other_gpu_seconds"] < 0.2  # the rule was for gpu 0 only


def test_forever_hang_ends_when_the_rule_is_removed(
    lib_dir: Path, node_file: Path, tmp_path: Path, background: ThreadPoolExecutor
) -> None:
    update(node_file, 0, "hang.nvmlDeviceGetPowerUsage=forever")
    ready = tmp_path / "ready"
    env = probe_env(lib_dir, node_file.parent)
    future = start_probe(background, env, "hang", "--gpu", "0", "--ready", str(ready))
    wait_for(ready.exists)
    assert not future.done()
    update(node_file, 0, "hang.nvmlDeviceGetPowerUsage=0")
    assert future.result(timeout=30)["power"] == 71000


# ---- the Python model ---------------------------------------------------------------------


def test_default_scenario_identities() -> None:
    a, b = sc.default_scenario("n1"), sc.default_scenario("n2")
    assert a == sc.default_scenario("n1")
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in b.gpus)
    assert len({g.serial for g in a.gpus}) == 8
    assert all(len(g.serial) == 13 for g in a.gpus)
    assert [g.pci_bus_id for g in sc.default_scenario("n1", 10).gpus[7:]] == [
        "00000000:DB:00.0",
        "00000001:18:00.0",
        "00000001:2A:00.0",
    ]


def test_write_read_round_trip(tmp_path: Path) -> None:
    scenario = sc.default_scenario("n7")
    for gpu, spec in [
        (0, "xid=79"),
        (1, "nvlink.17=down"),
        (2, "process=11:100"),
        (2, "process=12:200"),
        (3, "missing=reload"),
        (4, "hang.nvmlDeviceGetPowerUsage=2.5"),
        (None, "fail.nvmlDeviceGetTemperature=GPU_IS_LOST"),
        (5, "hardware_fault=1"),
        (6, "throttle=sw_thermal"),
    ]:
        scenario = sc.inject(scenario, gpu, spec)
    path = tmp_path / "x" / "n7.scenario"
    sc.write_scenario(path, scenario)
    assert sc.read_scenario(path) == scenario
    assert [p.name for p in path.parent.iterdir()] == ["n7.scenario"]


@pytest.mark.parametrize(
    ("gpu", "spec", "fragment"),
    [
        (0, "bogus=1", "valid keys: xid, ecc.sbe"),
        (0, "xid", "expected key=value"),
        (0, "nvlink.18=down", "out of range"),
        (0, "throttle=too_hot", "unknown reason"),
        (0, "fail.nvmlDeviceDoesNotExist=3", "not an NVML function"),
        (9, "xid=79", "gpu 9 out of range"),
        (None, "xid=79", "give a gpu"),
        (0, "driver=535.104.05", "node-wide"),
        (0, "ecc.dbe=-1", "negative"),
        (0, "missing=sometimes", "expected 0, 1"),
    ],
)
def test_bad_spec_is_a_one_line_error(gpu: int | None, spec: str, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        sc.inject(sc.default_scenario("n1"), gpu, spec)
    message = str(err.value)
    assert "\n" not in message and spec in message and fragment in message


def _faulty() -> sc.NodeScenario:
    s = sc.default_scenario("n1")
    for spec in ["xid=79", "ecc.dbe=1", "ecc.sbe=4", "retired.pending=1", "retired.dbe=1"]:
        s = sc.inject(s, 0, spec)
    for spec in ["remap.pending=1", "lost=1", "throttle=hw_slowdown", "pcie.width=8"]:
        s = sc.inject(s, 0, spec)
    s = sc.inject(s, 0, "fail.nvmlDeviceGetPowerUsage=999")
    s = sc.inject(s, 1, "remap.pending=1")
    s = sc.inject(s, 1, "remap.failure=1")
    s = sc.inject(s, 2, "missing=reload")
    s = sc.inject(s, 3, "missing=1")
    s = sc.inject(s, 4, "missing=never")
    s = sc.inject(s, 5, "xid=79")
    s = sc.inject(s, 5, "hardware_fault=1")
    s = sc.inject(s, None, "hang.nvmlDeviceGetCount=5")
    return sc.inject(s, 6, "persistence=0")


def test_gpu_reset_clears_volatile_state_only() -> None:
    before = _faulty()
    after = sc.gpu_reset(before, 0)
    g = after.gpus[0]
    assert (g.ecc_volatile_dbe, g.ecc_volatile_sbe) == (0, 0)
    assert (g.ecc_aggregate_dbe, g.ecc_aggregate_sbe) == (1, 4)
    assert not g.lost and g.throttle == 0 and g.pcie_width == 16
    assert not g.retired_pending and g.retired_dbe == 1
    assert not g.remap_pending
    assert [e.gpu for e in after.events] == [5]
    assert after.failures == () and after.hangs == before.hangs  # node-wide hang stays
    assert after.gpus[1:] == before.gpus[1:]
    failed = sc.gpu_reset(before, 1).gpus[1]
    assert failed.remap_pending and failed.remap_failure  # a failed remap needs an RMA
    assert sc.gpu_reset(before, 2) == before  # a missing GPU cannot be reset


def test_hardware_fault_survives_every_repair() -> None:
    before = _faulty()
    for repair in (lambda s: sc.gpu_reset(s, 5), sc.driver_reload, sc.reboot):
        after = repair(before)
        assert after.gpus[5] == before.gpus[5]
        recurred = after.events[-1]
        assert (recurred.gpu, recurred.xid) == (5, 79)
        assert recurred.seq == before.event_seq + 1 == after.event_seq


def test_driver_reload_and_reboot() -> None:
    before = _faulty()
    reloaded = sc.driver_reload(before)
    assert [g.missing for g in reloaded.gpus[2:5]] == [False, True, True]
    assert reloaded.hangs == () and reloaded.failures == ()
    assert reloaded.gpus[6].persistence and not reloaded.gpus[0].lost
    assert reloaded.gpus[0].ecc_aggregate_dbe == 1 and reloaded.gpus[1].remap_failure
    rebooted = sc.reboot(before)
    assert [g.missing for g in rebooted.gpus[2:5]] == [False, False, True]
    assert len(rebooted.present_gpus()) == 7
    assert sc.reboot(rebooted).gpus == rebooted.gpus


def test_event_seq_never_goes_back() -> None:
    s = sc.inject(sc.default_scenario("n1"), 0, "xid=79")
    s = sc.gpu_reset(s, 0)
    assert s.events == () and s.event_seq == 1
    s = sc.inject(s, 0, "xid=31")
    assert s.events[0].seq == 2


def test_fail_and_hang_rules_replace_and_clear() -> None:
    s = sc.inject(sc.default_scenario("n1"), 1, "fail.nvmlDeviceGetTemperature=999")
    s = sc.inject(s, 1, "fail.nvmlDeviceGetTemperature=NVML_ERROR_GPU_IS_LOST")
    assert s.failures == (sc.Failure("nvmlDeviceGetTemperature", 15, 1),)
    assert sc.inject(s, 1, "fail.nvmlDeviceGetTemperature=0").failures == ()
    s = sc.inject(s, None, "hang.nvmlInit=forever")
    assert s.hangs == (sc.Hang("nvmlInit", -1.0, None),)
    assert replace(s, hangs=()) == sc.inject(s, None, "hang.nvmlInit=0")


# ---- the trend counters (Medic's trends check reads them) ------------------------------------

_TREND_PROBE = """
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    thermal = n.nvmlDeviceGetViolationStatus(h, n.NVML_PERF_POLICY_THERMAL)
    out.append({
        "replay": n.nvmlDeviceGetPcieReplayCounter(h),
        "link0": [n.nvmlDeviceGetNvLinkErrorCounter(h, 0, c) for c in range(4)],
        "link1": [n.nvmlDeviceGetNvLinkErrorCounter(h, 1, c) for c in range(4)],
        "thermal_ns": thermal.violationTime, "reference_us": thermal.referenceTime,
        "power_ns": n.nvmlDeviceGetViolationStatus(h, n.NVML_PERF_POLICY_POWER).violationTime,
        "sbe": n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
    })
try:
    n.nvmlDeviceGetNvLinkErrorCounter(n.nvmlDeviceGetHandleByIndex(0), 18, 0)
except n.NVMLError as exc:
    out.append({"past_last_link": exc.value})
print(json.dumps(out))
"""


def _trend_counters(lib_dir: Path, node_file: Path) -> list[dict[str, Any]]:
    env = probe_env(lib_dir, node_file.parent)
    result = proc.run([sys.executable, "-c", _TREND_PROBE], timeout=30, env=env)
    assert result.ok, result.describe_failure() + "\n" + result.stderr
    data: list[dict[str, Any]] = json.loads(result.stdout)
    return data


def test_trend_counters_reach_pynvml_and_a_reset_clears_them(
    lib_dir: Path, node_file: Path
) -> None:
    update(node_file, 2, "ecc.sbe=9", "pcie.replay=5", "nvlink.crc_flit=7", "nvlink.replay=2")
    update(node_file, 2, "violation.thermal=1500", "violation.power=3", "pcie.replay=1")
    before = time.time() * 1e6
    data = _trend_counters(lib_dir, node_file)
    g0, g2 = data[0], data[2]
    assert g2["sbe"] == 9 and g2["replay"] == 6  # counters add up
    # DL_REPLAY=0, RECOVERY=1, CRC_FLIT=2, CRC_DATA=3; link 0 carries the GPU's count
    assert g2["link0"] == [2, 0, 7, 0] and g2["link1"] == [0, 0, 0, 0]
    assert g2["thermal_ns"] == 1_500_000_000 and g2["power_ns"] == 3_000_000
    assert g2["reference_us"] >= before - 5e6  # a CPU timestamp in microseconds
    assert g0 == {**g0, "replay": 0, "link0": [0] * 4, "thermal_ns": 0, "sbe": 0}
    assert data[-1] == {"past_last_link": pynvml.NVML_ERROR_INVALID_ARGUMENT}
    # A GPU reset clears them, as the driver does: a trend must not read the drop as a spike.
    sc.write_scenario(node_file, sc.gpu_reset(sc.read_scenario(node_file), 2))
    after = _trend_counters(lib_dir, node_file)[2]
    cleared = (after["replay"], after["link0"], after["thermal_ns"], after["sbe"])
    assert cleared == (0, [0] * 4, 0, 0)


def test_trend_counter_specs_round_trip_and_refuse_bad_values(tmp_path: Path) -> None:
    s = sc.default_scenario("n1")
    for spec in ("pcie.replay=3", "nvlink.recovery=4", "nvlink.crc_data=5", "violation.power=2"):
        s = sc.inject(s, 1, spec)
    path = tmp_path / "n1.scenario"
    sc.write_scenario(path, s)
    back = sc.read_scenario(path)
    assert back == s and back.gpus[1].violation_power_ns == 2_000_000
    assert sc.inject(s, 1, "nvlink.3=down").gpus[1].nvlinks_down == frozenset({3})
    with pytest.raises(ValueError, match="negative"):
        sc.inject(s, 1, "pcie.replay=-1")
    with pytest.raises(ValueError, match="applies to one GPU"):
        sc.inject(s, None, "nvlink.crc_flit=1")

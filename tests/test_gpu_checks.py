"""The GPU checks: pure evaluate() on observations, then gather() end to end with the real
pynvml loading the NVML injection library.

The library is built once per session and loaded by absolute path with ctypes before
pynvml's first nvmlInit in this process, so pynvml's CDLL("libnvidia-ml.so.1") gets it
(same soname); each test points NVML_INJECT_SCENARIO at its own scenario file and opens a
fresh client (the library reads the variable at the first nvmlInit after a full shutdown).
"""

from __future__ import annotations

import ctypes
import datetime as dt
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from cli.lab.cluster import slack
from cli.lab.nvml.build import build_library
from cli.lab.scenario import NodeScenario, default_scenario, inject, write_scenario
from healthd.checks import get, registry
from healthd.checks.base import CheckConfig, CheckContext, Kind, Recommendation, Result, Status
from healthd.checks.gpu_common import GpuContext, GpuSamples, JobState, StaticJobState
from healthd.checks.gpu_count import GpuCountConfig, GpuCountObservation, GpuIdentity
from healthd.checks.gpu_ecc import GpuEccCheck, GpuEccConfig, GpuEccObservation
from healthd.checks.gpu_processes import GpuProcessesConfig, GpuProcessesObservation
from healthd.checks.gpu_thermal import GpuThermalCheck, GpuThermalConfig
from healthd.checks.gpu_xid import GpuXidCheck, GpuXidConfig, GpuXidObservation
from healthd.nvml_client import (
    CallHealth,
    EccCounts,
    GpuInfo,
    Problem,
    PynvmlClient,
    Reading,
    Thermal,
)
from healthd.runner import Runner, RunState
from healthd.xid import XidBuffer, XidRecord
from healthd.xid_listener import EventKind, GpuEvent, XidListener, record_into
from medic_core.config import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "kmsg"
GPU_CHECKS = [s.name for s in registry() if s.name.startswith("gpu_")]
DRIVER = "550.127.05"


def _poll(what: str, predicate: Any, timeout: float = 5.0) -> None:
    timeout *= slack()
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def _info(index: int) -> GpuInfo:
    return GpuInfo(
        index, f"GPU-{index}", f"S{index}", "NVIDIA H100 80GB HBM3", f"0000:{index:02x}:00.0"
    )


def _samples(*values: Any) -> GpuSamples[Any]:
    from healthd.checks.gpu_common import GpuSample

    return GpuSamples(
        Reading(len(values)),
        tuple(
            GpuSample(i, _info(i), v if isinstance(v, Reading) else Reading(v))
            for i, v in enumerate(values)
        ),
    )


def _by_class(results: list[Result]) -> dict[str | None, Result]:
    return {r.fault_class: r for r in results}


# --- pure evaluate ----------------------------------------------------------------------------


def test_ecc_volatile_dbe_is_critical_and_sbe_over_limit_warn() -> None:
    obs = GpuEccObservation(_samples(EccCounts(0, 0, 0, 0), EccCounts(2000, 1, 2000, 1)))
    results = GpuEccCheck.evaluate(obs, GpuEccConfig())
    assert [(r.target, r.status) for r in results] == [
        ("0", Status.OK),
        ("1", Status.CRITICAL),
        ("1", Status.WARN),
    ]
    dbe = _by_class(results)["gpu.ecc.dbe"]
    assert dbe.evidence["recommendation"] == "gpu_reset" and dbe.evidence["uuid"] == "GPU-1"


def test_ecc_lifetime_growth_between_runs_is_critical() -> None:
    before = {"GPU-0": EccCounts(0, 0, 0, 3)}
    obs = GpuEccObservation(_samples(EccCounts(0, 0, 0, 4)), before)
    assert GpuEccCheck.evaluate(obs, GpuEccConfig())[0].fault_class == "gpu.ecc.dbe"
    same = GpuEccObservation(_samples(EccCounts(0, 0, 0, 3)), before)
    assert GpuEccCheck.evaluate(same, GpuEccConfig())[0].status == Status.OK


def test_reading_problems_are_unknown_or_not_applicable() -> None:
    obs = GpuEccObservation(
        _samples(
            Reading(None, Problem.TIMEOUT, "slow"),
            Reading(None, Problem.NOT_SUPPORTED, "no ECC"),
            Reading(None, Problem.GPU_LOST, "lost"),
        )
    )
    results = GpuEccCheck.evaluate(obs, GpuEccConfig())
    assert [(r.status, r.fault_class) for r in results] == [
        (Status.UNKNOWN, "check.nvml.timeout"),
        (Status.NOT_APPLICABLE, None),
        (Status.UNKNOWN, "check.nvml.gpu_lost"),
    ]
    assert all(r.remediation in (None, Recommendation.NONE) for r in results)


def test_thermal_reasons_and_temperature() -> None:
    from healthd.checks.gpu_thermal import GpuThermalObservation

    obs = GpuThermalObservation(_samples(Thermal(40, 0x1), Thermal(88, 0x8 | 0x40)))
    results = GpuThermalCheck.evaluate(obs, GpuThermalConfig())
    assert [(r.target, r.fault_class, r.status) for r in results] == [
        ("0", None, Status.OK),
        ("1", "gpu.thermal.high", Status.WARN),
        ("1", "gpu.clocks.hw_slowdown", Status.WARN),
        ("1", "gpu.clocks.hw_thermal", Status.WARN),
    ]
    strict = GpuThermalConfig(reason_status={"hw_thermal": "CRITICAL"})
    found = _by_class(GpuThermalCheck.evaluate(obs, strict))
    assert found["gpu.clocks.hw_thermal"].status == Status.CRITICAL
    assert "gpu.clocks.hw_slowdown" not in found


def test_thermal_config_is_validated() -> None:
    spec = get("gpu_thermal")
    from healthd.checks.base import parse_check_config

    with pytest.raises(ConfigError, match=r"checks\.gpu_thermal\.reason_status\.gpu_idle"):
        parse_check_config(
            spec.config_type,
            {"reason_status": {"gpu_idle": "WARN"}},
            prefix="checks.gpu_thermal",
            source=None,
        )
    with pytest.raises(ConfigError, match="critical_temperature_c"):
        parse_check_config(
            spec.config_type,
            {"warn_temperature_c": 90, "critical_temperature_c": 80},
            prefix="checks.gpu_thermal",
            source=None,
        )


def test_processes_need_the_job_state() -> None:
    from healthd.checks.gpu_processes import GpuProcessesCheck, GpuUsage
    from healthd.nvml_client import GpuProcess, MemoryUsage

    usage = GpuUsage((GpuProcess(4242, 2048),), MemoryUsage(81559, 2048))
    idle = JobState(running=False, idle_seconds=600)
    leak = GpuProcessesCheck.evaluate(
        GpuProcessesObservation(idle, _samples(usage)), GpuProcessesConfig()
    )
    assert leak[0].fault_class == "gpu.leak.process" and "4242" in leak[0].message
    busy = JobState(running=True, job_ids=("17",))
    assert (
        GpuProcessesCheck.evaluate(
            GpuProcessesObservation(busy, _samples(usage)), GpuProcessesConfig()
        )[0].status
        == Status.OK
    )
    other_gpu = JobState(running=True, job_ids=("17",), gpus_in_use=frozenset({1}))
    assert (
        GpuProcessesCheck.evaluate(
            GpuProcessesObservation(other_gpu, _samples(usage)), GpuProcessesConfig()
        )[0].fault_class
        == "gpu.leak.process"
    )
    just_ended = JobState(running=False, idle_seconds=5)
    assert (
        GpuProcessesCheck.evaluate(
            GpuProcessesObservation(just_ended, _samples(usage)), GpuProcessesConfig()
        )[0].status
        == Status.OK
    )
    unknown = GpuProcessesCheck.evaluate(
        GpuProcessesObservation(None, GpuSamples(Reading(0))), GpuProcessesConfig()
    )
    assert unknown[0].status == Status.NOT_APPLICABLE


def test_count_missing_by_count_and_pci_id() -> None:
    from healthd.checks.gpu_count import GpuCountCheck

    gpus = tuple(GpuIdentity(i, Reading(_info(i))) for i in range(7))
    cfg = GpuCountConfig(
        expected_count=8, expected_pci_bus_ids=tuple(f"0000:{i:02x}:00.0" for i in range(8))
    )
    results = GpuCountCheck.evaluate(GpuCountObservation(Reading(7), gpus), cfg)
    assert [(r.fault_class, r.target, r.status) for r in results] == [
        ("gpu.missing", None, Status.CRITICAL),
        ("gpu.missing", "0000:07:00.0", Status.CRITICAL),
    ]


def test_one_timeout_is_unknown_repeated_is_unresponsive() -> None:
    from healthd.checks.gpu_count import GpuCountCheck

    failed = Reading[GpuInfo](None, Problem.TIMEOUT, "no answer")
    gpus = (GpuIdentity(0, Reading(_info(0))), GpuIdentity(1, failed, _info(1)))
    once = GpuCountObservation(Reading(2), gpus, {1: CallHealth(consecutive_timeouts=1)})
    results = GpuCountCheck.evaluate(once, GpuCountConfig())
    assert [(r.target, r.status) for r in results] == [("1", Status.UNKNOWN)]
    thrice = GpuCountObservation(Reading(2), gpus, {1: CallHealth(consecutive_timeouts=3)})
    results = GpuCountCheck.evaluate(thrice, GpuCountConfig())
    assert [(r.target, r.status, r.fault_class) for r in results] == [
        ("1", Status.CRITICAL, "gpu.nvml.unresponsive")
    ]
    assert results[0].remediation == Recommendation.REBOOT
    assert results[0].evidence["serial"] == "S1"


def _record(seq: int, xid: int, gpu: int | None, t: float) -> XidRecord:
    return XidRecord(seq, xid, gpu, t, ("nvml",))


def test_xid_conditions_and_events() -> None:
    records = (
        _record(1, 79, 3, 50.0),
        _record(2, 13, 1, 60.0),
        _record(3, 63, 2, 61.0),
        _record(4, 9999, 0, 62.0),
        _record(5, 79, 3, 70.0),
    )
    results = GpuXidCheck.evaluate(GpuXidObservation(100.0, records, 0), GpuXidConfig())
    summary = [(r.fault_class, r.target, r.status, r.kind) for r in results]
    assert summary == [
        ("gpu.xid.79", "3", Status.CRITICAL, Kind.CONDITION),
        ("gpu.xid.13", "1", Status.WARN, Kind.CONDITION),  # new RESTART_APP: restart_app
        ("gpu.xid.13", "1", Status.WARN, Kind.EVENT),
        (None, "2", Status.OK, Kind.EVENT),
        ("gpu.xid.9999", "0", Status.WARN, Kind.EVENT),
    ]
    assert results[0].evidence["count"] == 2 and results[0].remediation == Recommendation.REBOOT
    assert results[1].remediation == Recommendation.RESTART_APP
    assert results[4].evidence["bucket"] == "UNKNOWN"
    assert results[4].remediation == Recommendation.NONE
    # the next run: events are not repeated, the condition stays until the window passes
    again = GpuXidCheck.evaluate(GpuXidObservation(100.0, records, 5), GpuXidConfig())
    assert [r.fault_class for r in again] == ["gpu.xid.79"]
    later = GpuXidCheck.evaluate(GpuXidObservation(5000.0, records, 5), GpuXidConfig())
    assert [(r.status, r.fault_class) for r in later] == [(Status.OK, None)]
    relaxed = GpuXidConfig(status_overrides={"79": "WARN"})
    assert all(
        r.status != Status.CRITICAL
        for r in GpuXidCheck.evaluate(GpuXidObservation(100.0, records, 0), relaxed)
    )


def test_xid_94_is_a_fresh_restart_app_warn_condition_once() -> None:
    """XID 94 (contained ECC, NVIDIA: RESTART_APP) on GPU 2: the run that first sees it reports
    a WARN condition recommending restart_app (no follow-up); the next
    run clears it; a second XID 94 raises it again with a higher last_seq."""
    cfg = GpuXidConfig()
    first = (_record(7, 94, 2, 90.0),)
    results = GpuXidCheck.evaluate(GpuXidObservation(100.0, first, 6), cfg)
    conditions = [r for r in results if r.kind is Kind.CONDITION]
    assert [(r.fault_class, r.target, r.status) for r in conditions] == [
        ("gpu.xid.94", "2", Status.WARN)
    ]
    [found] = conditions
    assert found.remediation == Recommendation.RESTART_APP
    assert found.evidence["recommendation"] == "restart_app"
    assert "follow_up" not in found.evidence  # the pending remap is gpu_remapped_rows' finding
    assert (found.evidence["bucket"], found.evidence["last_seq"]) == ("RESTART_APP", 7)
    assert [r.kind for r in results if r.fault_class == "gpu.xid.94"] == [
        Kind.CONDITION,
        Kind.EVENT,
    ]
    # the next run, nothing new: only the OK condition (the daemon clears GPU 2's WARN)
    again = GpuXidCheck.evaluate(GpuXidObservation(130.0, first, 7), cfg)
    assert [(r.status, r.target, r.kind) for r in again] == [(Status.OK, None, Kind.CONDITION)]
    # a second XID 94 later: a new WARN condition
    second = (*first, _record(9, 94, 2, 140.0))
    later = GpuXidCheck.evaluate(GpuXidObservation(150.0, second, 7), cfg)
    [warn] = [r for r in later if r.kind is Kind.CONDITION]
    assert (warn.status, warn.evidence["last_seq"], warn.evidence["count"]) == (Status.WARN, 9, 1)
    # an XID 94 from long ago (a fresh reader of the kernel log since boot): history only
    stale = GpuXidCheck.evaluate(GpuXidObservation(90.0 + 121.0, first, 0), cfg)
    assert [(r.kind, r.fault_class) for r in stale if r.status != Status.OK] == [
        (Kind.EVENT, "gpu.xid.94")
    ]
    # an operator who makes XID 94 OK gets history only; one who makes it CRITICAL drains
    quiet = GpuXidConfig(status_overrides={"94": "OK"})
    assert all(
        r.kind is Kind.EVENT or r.status == Status.OK
        for r in GpuXidCheck.evaluate(GpuXidObservation(100.0, first, 6), quiet)
    )
    loud = GpuXidConfig(status_overrides={"94": "CRITICAL"})
    [crit] = GpuXidCheck.evaluate(GpuXidObservation(100.0, first, 6), loud)
    assert (crit.status, crit.kind) == (Status.CRITICAL, Kind.CONDITION)


class _NoGpus:
    """An NVML client that sees no GPU: kernel-log XIDs keep their PCI id as the target."""

    def device_count(self) -> int:
        return 0


def test_restart_app_xid_from_the_kernel_log(tmp_path: Path) -> None:
    """The driver's exact XID 94 line, read from dev/kmsg under the host root."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text(
        "3,1201,5123456789,-;NVRM: Xid (PCI:0000:3b:00): 94, pid=4242, name=python,"
        " Contained: CE User Channel (0x9). RST: No, D-RST: No\n"
    )
    xids = XidBuffer()
    check = GpuXidCheck()
    cfg = GpuXidConfig()
    ctx = CheckContext.for_root(
        tmp_path, nvml=GpuContext(cast(Any, _NoGpus()), xids, None), clock=_Clock(monotonic=5200.0)
    )
    results = check.evaluate(check.gather(ctx, cfg), cfg)
    [condition] = [r for r in results if r.kind is Kind.CONDITION]
    assert (condition.fault_class, condition.target, condition.status) == (
        "gpu.xid.94",
        "pci:0000:3b:00",
        Status.WARN,
    )
    assert condition.evidence["recommendation"] == "restart_app"
    [record] = condition.evidence["records"]
    assert (record["pid"], record["process"]) == (4242, "python")
    assert record["message"].startswith("Contained: CE User Channel")
    # read once: the next run neither repeats the event nor keeps the condition
    again = check.evaluate(check.gather(ctx, cfg), cfg)
    assert [(r.status, r.kind) for r in again] == [(Status.OK, Kind.CONDITION)]


def test_every_gpu_check_is_registered_with_its_tiers() -> None:
    launch = {s.name for s in registry() if s.name.startswith("gpu_") and "launch" in s.tiers}
    periodic = {s.name for s in registry() if s.name.startswith("gpu_") and "periodic" in s.tiers}
    assert periodic == set(GPU_CHECKS) and len(GPU_CHECKS) == 12
    assert launch == set(GPU_CHECKS) - {"gpu_thermal", "gpu_trends"}
    assert all(get(n).needs == ("nvml",) for n in GPU_CHECKS)


# --- end to end: the real pynvml against the injection library ---------------------------------


@pytest.fixture(scope="session")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_library(tmp_path_factory.mktemp("nvml"))
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # before pynvml's first nvmlInit
    return path


class _Clock:
    def __init__(self, monotonic: float | None = None) -> None:
        self.fixed = monotonic

    def monotonic(self) -> float:
        return self.fixed if self.fixed is not None else time.monotonic()

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


@dataclass
class Lab:
    path: Path
    scenario: NodeScenario
    client: PynvmlClient
    root: Path
    xids: XidBuffer = field(default_factory=XidBuffer)
    jobs: JobState = field(default_factory=lambda: JobState(running=False, idle_seconds=600))

    def apply(self, gpu: int | None, spec: str) -> None:
        self.scenario = inject(self.scenario, gpu, spec)
        write_scenario(self.path, self.scenario)

    def ctx(self, clock: _Clock | None = None) -> CheckContext:
        gpu = GpuContext(self.client, self.xids, StaticJobState(self.jobs))
        return CheckContext.for_root(self.root, nvml=gpu, clock=clock or _Clock())

    def run(self, name: str, cfg: CheckConfig | None = None, check: Any = None) -> list[Result]:
        spec = get(name)
        check = check or spec.create()
        cfg = cfg or spec.default_config()
        return list(check.evaluate(check.gather(self.ctx(), cfg), cfg))


@pytest.fixture
def lab(nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    path = tmp_path / "scenario.txt"
    scenario = default_scenario("gpu-test", 8)
    write_scenario(path, scenario)
    monkeypatch.setenv("NVML_INJECT_SCENARIO", str(path))
    (tmp_path / "root" / "dev").mkdir(parents=True)
    client = PynvmlClient(call_timeout=0.5).open()
    lab = Lab(path, scenario, client, tmp_path / "root")
    try:
        yield lab
    finally:
        write_scenario(path, default_scenario("gpu-test", 8))  # ends any injected hang
        client.close()


def _configs() -> dict[str, CheckConfig]:
    from healthd.checks.gpu_driver import GpuDriverConfig

    return {
        "gpu_count": GpuCountConfig(expected_count=8),
        "gpu_driver": GpuDriverConfig(expected_versions=(DRIVER,)),
    }


def test_healthy_node_is_all_ok(lab: Lab) -> None:
    report = Runner(lab.ctx(), _configs(), [get(n) for n in GPU_CHECKS]).run()
    assert {o.name: o.state for o in report.outcomes} == {n: RunState.DONE for n in GPU_CHECKS}
    bad = [r for r in report.results if r.status != Status.OK]
    assert bad == []
    assert len([r for r in report.results if r.check == "gpu_nvlink"]) == 8


@pytest.mark.parametrize(
    ("gpu", "spec", "check", "fault_class", "status"),
    [
        (2, "ecc.dbe=1", "gpu_ecc", "gpu.ecc.dbe", Status.CRITICAL),
        (2, "ecc.sbe=5000", "gpu_ecc", "gpu.ecc.sbe", Status.WARN),
        (2, "retired.pending=1", "gpu_retired_pages", "gpu.retired_pages.pending", Status.WARN),
        (2, "retired.dbe=60", "gpu_retired_pages", "gpu.retired_pages.limit", Status.CRITICAL),
        (2, "remap.pending=1", "gpu_remapped_rows", "gpu.remap.pending", Status.WARN),
        (2, "remap.failure=1", "gpu_remapped_rows", "gpu.remap.failure", Status.CRITICAL),
        (2, "nvlink.3=down", "gpu_nvlink", "gpu.nvlink.down", Status.CRITICAL),
        (2, "pcie.width=8", "gpu_pcie", "gpu.pcie.degraded", Status.WARN),
        (2, "pcie.gen=3", "gpu_pcie", "gpu.pcie.degraded", Status.WARN),
        (2, "temperature=95", "gpu_thermal", "gpu.thermal.high", Status.CRITICAL),
        (2, "throttle=hw_slowdown", "gpu_thermal", "gpu.clocks.hw_slowdown", Status.WARN),
        (2, "throttle=hw_thermal", "gpu_thermal", "gpu.clocks.hw_thermal", Status.WARN),
        (2, "throttle=hw_power_brake", "gpu_thermal", "gpu.clocks.hw_power_brake", Status.WARN),
        (2, "persistence=0", "gpu_persistence", "gpu.persistence.off", Status.WARN),
        (2, "process=4242:2048", "gpu_processes", "gpu.leak.process", Status.WARN),
        (2, "lost=1", "gpu_count", "gpu.nvml.unresponsive", Status.CRITICAL),
        (2, "missing=1", "gpu_count", "gpu.missing", Status.CRITICAL),
        (None, "driver=535.104.05", "gpu_driver", "gpu.driver.version", Status.WARN),
    ],
)
def test_injected_fault_gives_its_fault_class(
    lab: Lab, gpu: int | None, spec: str, check: str, fault_class: str, status: Status
) -> None:
    lab.run("gpu_count")  # a running daemon knows its GPUs before one fails
    lab.apply(gpu, spec)
    results = lab.run(check, _configs().get(check))
    found = [r for r in results if r.fault_class == fault_class]
    assert found, results
    assert found[0].status == status
    if gpu is not None and fault_class != "gpu.missing":
        assert found[0].target == str(gpu)
        assert found[0].evidence["pci_bus_id"] == "0000:3a:00.0"
    others = [r for r in results if r.target not in (None, str(gpu))]
    assert all(r.status == Status.OK for r in others)


def test_xid_79_reaches_the_check_through_the_listener_within_a_second(lab: Lab) -> None:
    events: list[GpuEvent] = []
    listener = XidListener(lab.client, record_into(lab.xids, then=events.append))
    assert listener.start()
    try:
        injected = time.monotonic()
        lab.apply(3, "xid=79")
        _poll("the XID 79 record", lambda: lab.xids.records(), timeout=1.0)
        latency = lab.xids.records()[0].monotonic - injected
        assert 0 <= latency < 1.0
    finally:
        stopping = time.monotonic()
        assert listener.stop()
        assert time.monotonic() - stopping < listener.wait_ms / 1000 + 0.5
    assert [(e.kind, e.gpu, e.xid) for e in events] == [(EventKind.XID, 3, 79)]
    results = lab.run("gpu_xid")
    assert [(r.fault_class, r.target, r.status) for r in results] == [
        ("gpu.xid.79", "3", Status.CRITICAL)
    ]
    assert results[0].remediation == Recommendation.REBOOT
    assert results[0].evidence["bucket"] == "RESTART_BM"


def test_xid_13_restart_app_is_not_critical(lab: Lab) -> None:
    listener = XidListener(lab.client, record_into(lab.xids))
    assert listener.start()
    try:
        lab.apply(1, "xid=13")
        _poll("the XID 13 record", lambda: lab.xids.records(), timeout=1.0)
    finally:
        assert listener.stop()
    results = lab.run("gpu_xid")
    assert all(r.status != Status.CRITICAL for r in results)
    found = [(r.status, r.kind, r.remediation) for r in results if r.fault_class == "gpu.xid.13"]
    assert found == [
        (Status.WARN, Kind.CONDITION, Recommendation.RESTART_APP),
        (Status.WARN, Kind.EVENT, Recommendation.RESTART_APP),
    ]


def test_listener_survives_a_lost_gpu(lab: Lab) -> None:
    lab.apply(1, "lost=1")
    events: list[GpuEvent] = []
    listener = XidListener(lab.client, record_into(lab.xids, then=events.append))
    assert listener.start()
    try:
        assert listener.status.lost == {1} and len(listener.status.registered) == 7
        lab.apply(5, "xid=48")
        _poll("the XID 48 event", lambda: any(e.kind is EventKind.XID for e in events))
    finally:
        assert listener.stop()
    assert [(e.kind, e.gpu) for e in events] == [(EventKind.GPU_LOST, 1), (EventKind.XID, 5)]


def test_hung_temperature_call_is_unknown_while_other_checks_finish(lab: Lab) -> None:
    lab.apply(4, "hang.nvmlDeviceGetTemperature=30")
    report = Runner(lab.ctx(), _configs(), [get(n) for n in GPU_CHECKS]).run()
    assert {o.name: o.state for o in report.outcomes} == {n: RunState.DONE for n in GPU_CHECKS}
    thermal = [r for r in report.results if r.check == "gpu_thermal"]
    assert [(r.target, r.status) for r in thermal if r.status != Status.OK] == [
        ("4", Status.UNKNOWN)
    ]
    assert thermal[4].fault_class == "check.nvml.timeout"
    assert all(r.status == Status.OK for r in report.results if r.check != "gpu_thermal")
    # the next run does not wait again: the hung call is remembered
    check = GpuThermalCheck()
    again = lab.run("gpu_thermal", check=check)
    assert "still hung" in again[4].message


def test_repeated_timeouts_make_the_gpu_unresponsive(lab: Lab) -> None:
    lab.apply(5, "hang.nvmlDeviceGetPciInfo=forever")
    first = lab.run("gpu_count")
    assert [(r.target, r.status) for r in first if r.status != Status.OK] == [("5", Status.UNKNOWN)]
    lab.run("gpu_count")
    third = lab.run("gpu_count")
    critical = [r for r in third if r.status == Status.CRITICAL]
    assert [(r.fault_class, r.target) for r in critical] == [("gpu.nvml.unresponsive", "5")]
    assert critical[0].evidence["consecutive_timeouts"] == 3


def test_kernel_log_xids_map_to_gpus_by_pci_id(lab: Lab) -> None:
    (lab.root / "dev" / "kmsg").write_text((FIXTURES / "nvrm_xid_lab.txt").read_text())
    check = GpuXidCheck()
    cfg = GpuXidConfig()
    gpu = GpuContext(lab.client, lab.xids, None)
    ctx = CheckContext.for_root(lab.root, nvml=gpu, clock=_Clock(monotonic=60.0))
    results = check.evaluate(check.gather(ctx, cfg), cfg)
    assert [(r.fault_class, r.target, r.status, r.kind) for r in results] == [
        ("gpu.xid.79", "1", Status.CRITICAL, Kind.CONDITION),
        ("gpu.xid.13", "2", Status.WARN, Kind.CONDITION),
        ("gpu.xid.13", "2", Status.WARN, Kind.EVENT),
    ]
    assert results[0].evidence["records"][0]["pid"] == 2201
    # the same XID arriving from NVML too is one record; the next run repeats no event
    lab.xids.add(79, 1, source="nvml", monotonic=9.3)
    again = check.evaluate(check.gather(ctx, cfg), cfg)
    assert [(r.fault_class, r.evidence["count"]) for r in again] == [("gpu.xid.79", 1)]
    assert again[0].evidence["records"][0]["sources"] == ["kmsg", "nvml"]

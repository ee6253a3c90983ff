"""The deep tier: parsers on exact-format tool output (tests/fixtures/deep, provenance in its
README), evaluate() on tables of observations, NOT_APPLICABLE without the tool, the
filesystem probe for real, and tools faked by small executables run through medic_core.proc.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import healthd.checks as checks
from healthd.checks.base import (
    CheckContext,
    Recommendation,
    Result,
    Status,
    Tier,
    parse_check_config,
)
from healthd.checks.deep_common import find_tool, threshold_for
from healthd.checks.deep_dcgm import (
    DcgmDiag,
    DcgmResult,
    DeepDcgmCheck,
    DeepDcgmConfig,
    DeepDcgmObservation,
    parse_dcgmi_diag,
)
from healthd.checks.deep_fs_io import (
    DeepFsIoCheck,
    DeepFsIoConfig,
    DeepFsIoObservation,
    IoReading,
)
from healthd.checks.deep_gpu_perf import (
    DeepGpuPerfCheck,
    DeepGpuPerfConfig,
    DeepGpuPerfObservation,
    GpuPerf,
    GpuPerfReport,
    parse_gpu_perf,
)
from healthd.checks.deep_ib import (
    DeepIbCheck,
    DeepIbConfig,
    DeepIbObservation,
    HcaRun,
    parse_perftest_bw,
)
from healthd.checks.deep_nccl import (
    DeepNcclCheck,
    DeepNcclConfig,
    DeepNcclObservation,
    parse_all_reduce_perf,
)
from healthd.checks.deep_stream import (
    DeepStreamCheck,
    DeepStreamConfig,
    DeepStreamObservation,
    cpu_model,
    parse_stream,
)
from healthd.fixtures import write_ib_port
from medic_core.config import ConfigError
from medic_core.proc import CommandResult
from tests.conftest import poll

FIXTURES = Path(__file__).parent / "fixtures" / "deep"
H100 = "NVIDIA H100 80GB HBM3"
DEEP = {"deep_dcgm", "deep_nccl", "deep_ib", "deep_stream", "deep_gpu_perf", "deep_fs_io"}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def triples(results: list[Result]) -> list[tuple[Status, str | None, str | None]]:
    return [(r.status, r.fault_class, r.target) for r in results]


def ran(argv: list[str], stdout: str, returncode: int | None = 0, **kw: Any) -> CommandResult:
    return CommandResult(tuple(argv), returncode, stdout, "", 1.5, **kw)


def fake_tool(directory: Path, name: str, body: str) -> Path:
    """An executable shell script standing in for a tool."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


# --- the registry -----------------------------------------------------------------------------


def test_every_deep_check_is_registered_deep_only_with_a_long_timeout() -> None:
    specs = {s.name: s for s in checks.registry()}
    assert set(specs) >= DEEP
    for name in DEEP:
        spec = specs[name]
        assert spec.tiers == {Tier.DEEP}, name
        assert spec.timeout >= 300 and "nvml" not in spec.needs, name
        assert spec.description and "\n" not in spec.description
    for name in DEEP - {"deep_fs_io"}:
        assert set(specs[name].needs) == {"host", "commands"}, name


def test_find_tool_searches_directories_in_order_and_ignores_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    fake_tool(second, "stream", "exit 0\n")
    fake_tool(first, "stream_c.exe", "exit 0\n")
    (first / "stream").write_text("not executable")
    monkeypatch.setenv("PATH", str(second))
    assert find_tool(("stream", "stream_c.exe"), [str(first), str(second)]) == str(
        first / "stream_c.exe"
    )
    assert find_tool(("stream",), [str(tmp_path / "none")]) is None


@pytest.mark.parametrize(
    ("model", "table", "default", "expected"),
    [
        (H100, {H100: 300.0}, 0.0, 300.0),
        ("NVIDIA B200", {H100: 300.0}, 0.0, None),
        ("NVIDIA B200", {H100: 300.0}, 50.0, 50.0),
        (H100, {H100: 0.0}, 50.0, None),  # an explicit 0 switches the floor off
        (None, {H100: 300.0}, 10.0, 10.0),
    ],
)
def test_threshold_per_model(
    model: str | None, table: dict[str, float], default: float, expected: float | None
) -> None:
    assert threshold_for(model, table, default) == expected


def test_config_tables_merge_and_timeouts_are_checked() -> None:
    cfg = parse_check_config(
        DeepNcclConfig,
        {"min_busbw_gbps": {"NVIDIA A100-SXM4-80GB": 150}, "gpus": 8},
        prefix="checks.deep_nccl",
        source=None,
    )
    assert cfg.min_busbw_gbps == {H100: 300.0, "NVIDIA A100-SXM4-80GB": 150.0}
    with pytest.raises(ConfigError, match=r"checks.deep_dcgm.command_timeout: .*not below"):
        parse_check_config(
            DeepDcgmConfig,
            {"timeout": 600, "command_timeout": 900},
            prefix="checks.deep_dcgm",
            source=None,
        )
    with pytest.raises(ConfigError, match=r"checks.deep_stream.search_dirs: 'bin' is not"):
        parse_check_config(
            DeepStreamConfig, {"search_dirs": ["bin"]}, prefix="checks.deep_stream", source=None
        )
    with pytest.raises(ConfigError, match=r"checks.deep_dcgm.level: 5 is above"):
        parse_check_config(DeepDcgmConfig, {"level": 5}, prefix="checks.deep_dcgm", source=None)


# --- DCGM -------------------------------------------------------------------------------------


def test_parse_dcgm4_real_gb10_document() -> None:
    diag = parse_dcgmi_diag(fixture("dcgmi_diag_r1_gb10.json"))
    assert (diag.version, diag.driver_version, diag.runtime_error) == ("4.2.3", "580.82.09", None)
    assert diag.gpu_device_ids == {0: "2e12"}
    (result,) = diag.results
    assert (result.category, result.test, result.entity_group, result.entity_id) == (
        "Deployment",
        "software",
        "GPU",
        0,
    )
    assert result.status == "fail" and "Persistence mode for GPU 0" in result.warnings[0]


def test_parse_dcgm4_eight_gpus() -> None:
    diag = parse_dcgmi_diag(fixture("dcgmi_diag_r2_h100_memory_fail.json"))
    assert len(diag.results) == 32 and sorted(diag.gpu_device_ids) == list(range(8))
    by = {(r.test, r.entity_id): r for r in diag.results}
    assert by[("memory", 3)].status == "fail"
    assert by[("memory", 3)].warnings == ("Found 4 faulty memory elements on GPU 3",)
    assert by[("diagnostic", 3)].status == "skip"
    assert "Host to GPU bandwidth:\t\t25.93 GB/s" in by[("pcie", 0)].info[1]
    assert by[("diagnostic", 0)].info[2].endswith("859.08 gigaflops during this test")


def test_parse_dcgm3_layout_with_node_wide_deployment_tests() -> None:
    diag = parse_dcgmi_diag(
        "Successfully ran diagnostic for group.\n" + fixture("dcgmi_diag_r2_dcgm3_warn.json")
    )
    assert (diag.version, diag.driver_version) == ("3.3.5", "535.161.08")
    node = [r for r in diag.results if r.entity_id is None]
    assert len(node) == 9 and {r.status for r in node} == {"pass"}
    (warned,) = [r for r in diag.results if r.status == "warn"]
    assert (warned.test, warned.entity_id, warned.target) == ("Diagnostic", 1, "1")
    assert "did not reach desired stress level" in warned.warnings[0]
    assert (
        "GPU 0 Host to GPU bandwidth" in next(r for r in diag.results if r.test == "PCIe").info[0]
    )


@pytest.mark.parametrize("text", ["", "Error: unable to connect to host engine", "{not json"])
def test_parse_dcgm_rejects_output_without_a_document(text: str) -> None:
    with pytest.raises(ValueError):
        parse_dcgmi_diag(text)


def test_dcgm_evaluate_fixture_fails_the_bad_gpu_only() -> None:
    obs = DeepDcgmObservation(
        "/usr/bin/dcgmi",
        ran(["/usr/bin/dcgmi"], "", 226),
        parse_dcgmi_diag(fixture("dcgmi_diag_r2_h100_memory_fail.json")),
    )
    results = DeepDcgmCheck.evaluate(obs, DeepDcgmConfig())
    assert triples(results) == [
        (Status.CRITICAL, "gpu.dcgm.diag", "3") if i == 3 else (Status.OK, None, str(i))
        for i in range(8)
    ]
    bad = results[3]
    assert "memory (Found 4 faulty memory elements on GPU 3)" in bad.message
    assert bad.remediation is Recommendation.DRAIN and bad.evidence["failed"] == ["memory"]
    assert bad.evidence["skipped"] == ["diagnostic"] and bad.evidence["dcgm_version"] == "4.1.1"
    assert results[0].message == "GPU 0: DCGM diag level 2: 4 tests passed"


def test_dcgm_evaluate_dcgm3_warn_and_ignored_tests() -> None:
    diag = parse_dcgmi_diag(fixture("dcgmi_diag_r2_dcgm3_warn.json"))
    obs = DeepDcgmObservation("/usr/bin/dcgmi", ran(["dcgmi"], ""), diag)
    assert triples(DeepDcgmCheck.evaluate(obs, DeepDcgmConfig())) == [
        (Status.OK, None, None),
        (Status.OK, None, "0"),
        (Status.WARN, "gpu.dcgm.diag", "1"),
    ]
    quiet = DeepDcgmConfig(ignore_tests=("diagnostic",))
    assert {r.status for r in DeepDcgmCheck.evaluate(obs, quiet)} == {Status.OK}


def _diag(*results: DcgmResult, runtime_error: str | None = None) -> DeepDcgmObservation:
    return DeepDcgmObservation(
        "/usr/bin/dcgmi", ran(["dcgmi"], ""), DcgmDiag("4.1.1", "550", results, runtime_error)
    )


def _r(test: str, status: str, gpu: int | None = 0, warning: str = "") -> DcgmResult:
    return DcgmResult(
        "Hardware",
        test,
        "GPU" if gpu is not None else "",
        gpu,
        status,
        ((warning,) if warning else ()),
    )


@pytest.mark.parametrize(
    ("observation", "expected"),
    [
        (_diag(_r("memory", "pass"), _r("pcie", "pass")), [(Status.OK, None, "0")]),
        (_diag(_r("memory", "pass"), _r("pcie", "skip")), [(Status.OK, None, "0")]),
        (_diag(_r("memory", "not run")), [(Status.OK, None, "0")]),
        (
            _diag(_r("memory", "fail", warning="x"), _r("pcie", "warn")),
            [(Status.CRITICAL, "gpu.dcgm.diag", "0"), (Status.WARN, "gpu.dcgm.diag", "0")],
        ),
        (_diag(_r("pcie", "warn", gpu=1)), [(Status.WARN, "gpu.dcgm.diag", "1")]),
        (_diag(_r("memory", "inconclusive")), [(Status.UNKNOWN, "check.read_error", "0")]),
        (_diag(_r("Inforom", "fail", gpu=None)), [(Status.CRITICAL, "gpu.dcgm.diag", None)]),
        (
            _diag(_r("pcie", "pass", gpu=10), _r("pcie", "pass", gpu=2)),
            [(Status.OK, None, "2"), (Status.OK, None, "10")],
        ),
        (_diag(), [(Status.UNKNOWN, "check.command_failed", None)]),
        (
            _diag(_r("memory", "pass"), runtime_error="Error: DCGM is paused"),
            [(Status.UNKNOWN, "check.command_failed", None)],
        ),
        (DeepDcgmObservation(None), [(Status.NOT_APPLICABLE, None, None)]),
        (
            DeepDcgmObservation("/usr/bin/dcgmi", ran(["dcgmi"], "", None, timed_out=True)),
            [(Status.UNKNOWN, "check.command_failed", None)],
        ),
    ],
)
def test_dcgm_evaluate_table(
    observation: DeepDcgmObservation, expected: list[tuple[Status, str | None, str | None]]
) -> None:
    assert triples(DeepDcgmCheck.evaluate(observation, DeepDcgmConfig())) == expected


def test_dcgm_runtime_error_document() -> None:
    text = (
        '{\n\t"DCGM Diagnostic" :\n\t{\n\t\t"runtime_error" : "Error: Diagnostic could not'
        ' be run while DCGM is paused.",\n\t\t"version" : "4.1.1"\n\t}\n}\n'
    )
    diag = parse_dcgmi_diag(text)
    assert diag.runtime_error is not None and diag.version == "4.1.1"
    (result,) = DeepDcgmCheck.evaluate(
        DeepDcgmObservation("dcgmi", ran(["dcgmi"], text, 1), diag), DeepDcgmConfig()
    )
    assert result.status is Status.UNKNOWN and "paused" in result.message


# --- nccl-tests -------------------------------------------------------------------------------


def test_parse_all_reduce_perf_real_output() -> None:
    run = parse_all_reduce_perf(fixture("all_reduce_perf_4xh100.txt"))
    assert [d.device for d in run.devices] == [0, 1, 2, 3] and run.model == H100
    assert run.devices[0].bus_id == "0000:06:00" and run.devices[0].host == "192-222-52-239"
    assert len(run.samples) == 28 and run.samples[0].size == 8
    last = run.samples[-1]
    assert (last.size, last.count, last.dtype, last.redop) == (
        1073741824,
        268435456,
        "float",
        "sum",
    )
    assert (last.oop_time_us, last.oop_algbw, last.oop_busbw) == (4525.6, 237.26, 355.89)
    assert (last.ip_time_us, last.ip_busbw, last.busbw, last.wrong) == (4557.5, 353.40, 353.40, 0)
    assert (run.avg_busbw, run.out_of_bounds) == (98.414, 0)


def test_parse_all_reduce_perf_through_mpirun_prefixes_and_info_lines() -> None:
    lines = fixture("all_reduce_perf_4xh100.txt").splitlines()
    noisy = [f"[1,0]<stdout>:{line}" for line in lines]
    noisy.insert(8, "[1,0]<stdout>:host:16629:16629 [0] NCCL INFO NCCL version 2.26.2+cuda12.8")
    assert parse_all_reduce_perf("\n".join(noisy)) == parse_all_reduce_perf("\n".join(lines))


@pytest.mark.parametrize("text", ["", "# nThread 1 nGpus 4\n# Using devices\n", "NCCL failure"])
def test_parse_all_reduce_perf_rejects_output_without_rows(text: str) -> None:
    with pytest.raises(ValueError):
        parse_all_reduce_perf(text)


def _nccl(text: str, returncode: int = 0, gpus: int = 4) -> DeepNcclObservation:
    argv = ["/opt/nccl-tests/build/all_reduce_perf", "-g", str(gpus)]
    return DeepNcclObservation(
        argv[0], gpus, ran(argv, text, returncode), parse_all_reduce_perf(text)
    )


REAL_NCCL = fixture("all_reduce_perf_4xh100.txt")
WRONG_NCCL = REAL_NCCL.replace(
    "355.89      0    4557.5  235.60  353.40      0",
    "355.89      0    4557.5  235.60  353.40      3",
).replace("Out of bounds values : 0 OK", "Out of bounds values : 3 FAILED")


@pytest.mark.parametrize(
    ("observation", "cfg", "expected"),
    [
        (_nccl(REAL_NCCL), DeepNcclConfig(), [(Status.OK, None, None)]),
        (
            _nccl(REAL_NCCL),
            DeepNcclConfig(min_busbw_gbps={H100: 400.0}),
            [(Status.CRITICAL, "nccl.allreduce.bw", None)],
        ),
        (_nccl(REAL_NCCL), DeepNcclConfig(min_busbw_gbps={H100: 353.4}), [(Status.OK, None, None)]),
        (
            _nccl(REAL_NCCL.replace(H100, "NVIDIA B200")),
            DeepNcclConfig(),
            [(Status.OK, None, None)],
        ),
        (
            _nccl(REAL_NCCL.replace(H100, "NVIDIA B200")),
            DeepNcclConfig(default_min_busbw_gbps=500),
            [(Status.CRITICAL, "nccl.allreduce.bw", None)],
        ),
        (
            _nccl(WRONG_NCCL, returncode=1),
            DeepNcclConfig(),
            [(Status.CRITICAL, "nccl.allreduce.wrong", None)],
        ),
        (
            _nccl(REAL_NCCL, returncode=1),
            DeepNcclConfig(),
            [(Status.UNKNOWN, "check.command_failed", None)],
        ),
        (DeepNcclObservation(None, 8), DeepNcclConfig(), [(Status.NOT_APPLICABLE, None, None)]),
        (DeepNcclObservation("x", 0), DeepNcclConfig(), [(Status.NOT_APPLICABLE, None, None)]),
        (
            DeepNcclObservation("x", 8, ran(["x"], "", None, timed_out=True)),
            DeepNcclConfig(),
            [(Status.UNKNOWN, "check.command_failed", None)],
        ),
    ],
)
def test_nccl_evaluate_table(
    observation: DeepNcclObservation,
    cfg: DeepNcclConfig,
    expected: list[tuple[Status, str | None, str | None]],
) -> None:
    assert triples(DeepNcclCheck.evaluate(observation, cfg)) == expected


def test_nccl_evidence_names_the_numbers() -> None:
    (result,) = DeepNcclCheck.evaluate(_nccl(REAL_NCCL), DeepNcclConfig())
    assert result.evidence["busbw_gbps"] == 353.40 and result.evidence["min_busbw_gbps"] == 300
    assert result.evidence["avg_busbw_gbps"] == 98.414 and result.evidence["model"] == H100
    assert "353.4 GB/s at 1073741824 bytes over 4 GPUs" in result.message


# --- perftest ib_write_bw ---------------------------------------------------------------------


def test_parse_ib_write_bw_mb_per_sec_loopback() -> None:
    bw = parse_perftest_bw(fixture("ib_write_bw_loopback_mbs.txt"))
    assert (bw.unit, bw.device, bw.link_type) == ("MB/sec", "mlx5_1", "Ethernet")
    (row,) = bw.rows
    assert (row.size, row.iterations, row.bw_peak, row.bw_average, row.msg_rate_mpps) == (
        65536,
        5000,
        44326.24,
        44276.64,
        0.708426,
    )
    assert bw.gbps(row.bw_average) == pytest.approx(371.42, abs=0.01)  # MB is 2^20 bytes


def test_parse_ib_write_bw_report_gbits() -> None:
    bw = parse_perftest_bw(fixture("ib_write_bw_report_gbits.txt"))
    assert bw.unit == "Gb/sec" and bw.device == "mlx5_0"
    assert (bw.largest.size, bw.largest.bw_peak, bw.gbps(bw.largest.bw_average)) == (
        65536,
        0.0,
        98.03,
    )


def test_parse_ib_write_bw_multi_size_table_uses_the_largest() -> None:
    text = fixture("ib_write_bw_report_gbits.txt").replace(
        " 65536      560960",
        " 4096       5000             92.13              92.06              2.809419\n"
        " 65536      560960",
    )
    bw = parse_perftest_bw(text)
    assert [r.size for r in bw.rows] == [4096, 65536] and bw.largest.size == 65536


def test_parse_ib_write_bw_server_waiting_has_no_table() -> None:
    with pytest.raises(ValueError):
        parse_perftest_bw(
            "************************************\n* Waiting for client to connect... *\n"
        )


def _hca(name: str, rate: str | None, fixture_name: str | None) -> HcaRun:
    run = ran(["ib_write_bw", "127.0.0.1"], fixture(fixture_name) if fixture_name else "", 0)
    parsed = parse_perftest_bw(run.stdout) if fixture_name else None
    return HcaRun(name, 1, rate, run, run, parsed, None if parsed else "no result table")


@pytest.mark.parametrize(
    ("run", "cfg", "expected"),
    [
        (
            _hca("mlx5_0", "400 Gb/sec (4X NDR)", "ib_write_bw_loopback_mbs.txt"),
            DeepIbConfig(),
            (Status.OK, None, "mlx5_0/1"),
        ),
        (
            _hca("mlx5_0", "100 Gb/sec (4X EDR)", "ib_write_bw_report_gbits.txt"),
            DeepIbConfig(),
            (Status.OK, None, "mlx5_0/1"),
        ),
        (
            _hca("mlx5_0", "200 Gb/sec (4X HDR)", "ib_write_bw_report_gbits.txt"),
            DeepIbConfig(),
            (Status.CRITICAL, "ib.loopback.bw", "mlx5_0/1"),
        ),
        (
            _hca("mlx5_0", None, "ib_write_bw_report_gbits.txt"),
            DeepIbConfig(),
            (Status.OK, None, "mlx5_0/1"),
        ),
        (
            _hca("mlx5_0", None, "ib_write_bw_report_gbits.txt"),
            DeepIbConfig(min_gbps=150),
            (Status.CRITICAL, "ib.loopback.bw", "mlx5_0/1"),
        ),
        (
            _hca("mlx5_0", "400 Gb/sec (4X NDR)", "ib_write_bw_loopback_mbs.txt"),
            DeepIbConfig(min_fraction_of_rate=0.95),
            (Status.CRITICAL, "ib.loopback.bw", "mlx5_0/1"),
        ),
        (
            _hca("mlx5_3", "400 Gb/sec (4X NDR)", None),
            DeepIbConfig(),
            (Status.UNKNOWN, "check.command_failed", "mlx5_3/1"),
        ),
    ],
)
def test_ib_evaluate_table(
    run: HcaRun, cfg: DeepIbConfig, expected: tuple[Status, str | None, str | None]
) -> None:
    (result,) = DeepIbCheck.evaluate(DeepIbObservation("/usr/bin/ib_write_bw", (run,)), cfg)
    assert triples([result]) == [expected]


def test_ib_not_applicable_without_tool_or_ports() -> None:
    for obs in (DeepIbObservation(None), DeepIbObservation("/usr/bin/ib_write_bw", ())):
        (result,) = DeepIbCheck.evaluate(obs, DeepIbConfig())
        assert result.status is Status.NOT_APPLICABLE


def test_ib_loopback_runs_server_and_client_through_proc(tmp_path: Path) -> None:
    """A fake ib_write_bw: the server call waits until the client has run, like the real
    one, and both print the table; ports that are down or Ethernet are not tested."""
    root, tools = tmp_path / "root", tmp_path / "bin"
    write_ib_port(root, "mlx5_0")
    write_ib_port(root, "mlx5_1", state="1: DOWN", phys_state="3: Disabled")
    write_ib_port(root, "mlx5_8", rate="100 Gb/sec (2X HDR)", link_layer="Ethernet")
    log = tmp_path / "calls.log"
    fake_tool(
        tools,
        "ib_write_bw",
        f'echo "$*" >> {log}\n'
        "for last; do :; done\n"
        'if [ "$last" = "127.0.0.1" ]; then touch ' + str(tmp_path / "client-ran") + "\n"
        "else i=0; while [ ! -e " + str(tmp_path / "client-ran") + " ] && [ $i -lt 100 ];"
        " do sleep 0.05; i=$((i+1)); done; fi\n"
        f"cat {FIXTURES / 'ib_write_bw_loopback_mbs.txt'}\n",
    )
    cfg = DeepIbConfig(search_dirs=(str(tools),), retry_delay=0.05, command_timeout=20)
    check = DeepIbCheck()
    (result,) = DeepIbCheck.evaluate(check.gather(CheckContext.for_root(root), cfg), cfg)
    assert (result.status, result.target) == (Status.OK, "mlx5_0/1"), result.message
    assert result.evidence["bw_average_gbps"] == pytest.approx(371.42, abs=0.01)
    calls = sorted(log.read_text().splitlines())
    assert calls == [
        "-d mlx5_0 -i 1 -p 18515 -s 65536 -n 5000 -F --report_gbits",
        "-d mlx5_0 -i 1 -p 18515 -s 65536 -n 5000 -F --report_gbits 127.0.0.1",
    ]


# --- STREAM -----------------------------------------------------------------------------------


def test_parse_stream_real_output() -> None:
    run = parse_stream(fixture("stream_c_exe.txt"))
    assert {f: r.best_mbps for f, r in run.rates.items()} == {
        "Copy": 25576.0,
        "Scale": 18857.2,
        "Add": 21613.6,
        "Triad": 21177.1,
    }
    triad = run.rates["Triad"]
    assert (triad.avg_s, triad.min_s, triad.max_s) == (0.011542, 0.011333, 0.012044)
    assert (run.validates, run.threads, run.array_size, run.version) == (True, 8, 10000000, "5.10")


FAILED_STREAM = fixture("stream_c_exe.txt").replace(
    "Solution Validates: avg error less than 1.000000e-13 on all three arrays",
    "Failed Validation on array a[], AvgRelAbsErr > epsilon (1.000000e-13)\n"
    "     Expected Value: 1.153301e+12, AvgAbsErr: 6.025542e+09, AvgRelAbsErr: 5.224608e-03",
)


def test_parse_stream_failed_validation_and_truncated_output() -> None:
    run = parse_stream(FAILED_STREAM)
    assert run.validates is False and run.failures[0].startswith("Failed Validation on array a[]")
    with pytest.raises(ValueError, match="lacks Add, Triad"):
        parse_stream(fixture("stream_c_exe.txt").split("Add:")[0])


def test_cpu_model_from_cpuinfo() -> None:
    text = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n"
    )
    assert cpu_model(text) == "Intel(R) Xeon(R) Platinum 8480C"
    assert cpu_model(None) is None and cpu_model("processor\t: 0\n") is None


XEON = "Intel(R) Xeon(R) Platinum 8480C"


def _stream(text: str, model: str | None = XEON) -> DeepStreamObservation:
    return DeepStreamObservation(
        "/opt/stream/stream", model, ran(["stream"], text), parse_stream(text)
    )


@pytest.mark.parametrize(
    ("observation", "cfg", "expected"),
    [
        (_stream(fixture("stream_c_exe.txt")), DeepStreamConfig(), [(Status.OK, None, None)]),
        (
            _stream(fixture("stream_c_exe.txt")),
            DeepStreamConfig(min_triad_mbps={XEON: 200000.0}),
            [(Status.CRITICAL, "mem.bandwidth", None)],
        ),
        (
            _stream(fixture("stream_c_exe.txt"), model="AMD EPYC 9654 96-Core Processor"),
            DeepStreamConfig(min_triad_mbps={XEON: 200000.0}),
            [(Status.OK, None, None)],
        ),
        (
            _stream(fixture("stream_c_exe.txt"), model=None),
            DeepStreamConfig(default_min_triad_mbps=21177.1),
            [(Status.OK, None, None)],
        ),
        (
            _stream(FAILED_STREAM),
            DeepStreamConfig(),
            [(Status.CRITICAL, "mem.bandwidth.validation", None)],
        ),
        (DeepStreamObservation(None), DeepStreamConfig(), [(Status.NOT_APPLICABLE, None, None)]),
        (
            DeepStreamObservation("stream", XEON, ran(["stream"], "", -9)),
            DeepStreamConfig(),
            [(Status.UNKNOWN, "check.command_failed", None)],
        ),
    ],
)
def test_stream_evaluate_table(
    observation: DeepStreamObservation,
    cfg: DeepStreamConfig,
    expected: list[tuple[Status, str | None, str | None]],
) -> None:
    assert triples(DeepStreamCheck.evaluate(observation, cfg)) == expected


# --- GPU matmul and copy bandwidth ------------------------------------------------------------


def test_parse_gpu_perf_line_after_framework_noise() -> None:
    text = "some framework warning\n" + fixture("gpu_perf_torch_8xh100.txt")
    report = parse_gpu_perf(text)
    assert (report.framework, report.dtype, report.matmul_n, report.error) == (
        "torch",
        "bfloat16",
        8192,
        None,
    )
    assert len(report.gpus) == 8 and report.gpus[0] == GpuPerf(0, H100, 712.41, 53.21, 52.87)
    with pytest.raises(ValueError):
        parse_gpu_perf("Traceback (most recent call last):\n")


def test_gpu_perf_fixture_flags_the_half_width_link() -> None:
    report = parse_gpu_perf(fixture("gpu_perf_torch_8xh100.txt"))
    obs = DeepGpuPerfObservation("/opt/conda/bin/python3", ran(["python3"], ""), report)
    results = DeepGpuPerfCheck.evaluate(obs, DeepGpuPerfConfig())
    bad = [(r.fault_class, r.target) for r in results if r.status is not Status.OK]
    assert bad == [("gpu.pcie.h2d_bw", "5"), ("gpu.pcie.d2h_bw", "5")]
    assert len(results) == 9 and results[5].remediation is Recommendation.DRAIN


def _perf(
    *gpus: GpuPerf, error: str | None = None, framework: str | None = "torch"
) -> DeepGpuPerfObservation:
    report = GpuPerfReport(framework, "2.4.1", "bfloat16", 8192, error, gpus)
    return DeepGpuPerfObservation("/usr/bin/python3", ran(["python3"], ""), report)


@pytest.mark.parametrize(
    ("observation", "expected"),
    [
        (_perf(GpuPerf(0, H100, 712.0, 53.0, 52.0)), [(Status.OK, None, "0")]),
        (_perf(GpuPerf(0, H100, 380.0, 53.0, 52.0)), [(Status.CRITICAL, "gpu.perf.matmul", "0")]),
        (_perf(GpuPerf(1, H100, 712.0, 12.0, 52.0)), [(Status.CRITICAL, "gpu.pcie.h2d_bw", "1")]),
        (_perf(GpuPerf(0, "NVIDIA B200", 1.0, 1.0, 1.0)), [(Status.OK, None, "0")]),
        (
            _perf(GpuPerf(0, "NVIDIA A100-SXM4-80GB", 150.0, 25.0, 25.0)),
            [(Status.CRITICAL, "gpu.perf.matmul", "0")],
        ),
        (_perf(error="no_framework", framework=None), [(Status.NOT_APPLICABLE, None, None)]),
        (_perf(error="no_gpu"), [(Status.NOT_APPLICABLE, None, None)]),
        (
            _perf(error="RuntimeError: CUDA error: ECC error"),
            [(Status.UNKNOWN, "check.command_failed", None)],
        ),
        (_perf(), [(Status.UNKNOWN, "check.command_failed", None)]),
        (DeepGpuPerfObservation(None), [(Status.NOT_APPLICABLE, None, None)]),
    ],
)
def test_gpu_perf_evaluate_table(
    observation: DeepGpuPerfObservation, expected: list[tuple[Status, str | None, str | None]]
) -> None:
    assert triples(DeepGpuPerfCheck.evaluate(observation, DeepGpuPerfConfig())) == expected


def test_gpu_perf_script_runs_and_is_not_applicable_without_a_framework(tmp_path: Path) -> None:
    """The real script through the real interpreter: this machine has no torch or cupy."""
    for module in ("torch", "cupy"):
        try:
            __import__(module)
        except ImportError:
            continue
        pytest.skip(f"{module} is importable here")
    cfg = DeepGpuPerfConfig(
        search_dirs=(str(Path(sys.executable).parent),),
        interpreter_names=(Path(sys.executable).name,),
        command_timeout=60,
    )
    check = DeepGpuPerfCheck()
    observation = check.gather(CheckContext.for_root(tmp_path), cfg)
    assert observation.report is not None and observation.report.error == "no_framework"
    (result,) = DeepGpuPerfCheck.evaluate(observation, cfg)
    assert result.status is Status.NOT_APPLICABLE and "neither torch nor cupy" in result.message


# --- filesystem I/O (for real) ----------------------------------------------------------------


def test_fs_io_measures_for_real_and_cleans_up(tmp_path: Path) -> None:
    (tmp_path / "scratch").mkdir()
    cfg = DeepFsIoConfig(
        directory="/scratch",
        size_mib=8,
        block_kib=256,
        min_write_mbps=0,
        min_read_mbps=0,
        io_timeout=60,
    )
    check = DeepFsIoCheck()
    observation = check.gather(CheckContext.for_root(tmp_path), cfg)
    reading = observation.reading
    assert reading is not None and reading.error is None and reading.complete
    assert reading.written_bytes == reading.read_bytes == 8 << 20
    assert reading.write_mbps > 0 and reading.read_mbps > 0
    (result,) = DeepFsIoCheck.evaluate(observation, cfg)
    assert (result.status, result.target) == (Status.OK, "/scratch")
    assert result.evidence["written_bytes"] == 8 << 20 and "8 MiB" in result.message
    assert list((tmp_path / "scratch").iterdir()) == []


def test_fs_io_absent_directory_is_not_applicable(tmp_path: Path) -> None:
    cfg = DeepFsIoConfig(directory="/no/such/scratch")
    (result,) = DeepFsIoCheck.evaluate(
        DeepFsIoCheck().gather(CheckContext.for_root(tmp_path), cfg), cfg
    )
    assert result.status is Status.NOT_APPLICABLE


def test_fs_io_hung_probe_is_critical_and_not_started_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe stuck in the filesystem (a dead NFS server): creating the file blocks until
    the server answers. (A FIFO at the name can no longer do this: see test_probe_files.)"""
    import contextlib
    import threading

    import healthd.checks.deep_fs_io as deep_fs_io

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    server_back = threading.Event()
    real = deep_fs_io.private_file

    @contextlib.contextmanager
    def hanging(directory: Path, prefix: str, flags: int = os.O_WRONLY) -> Any:
        server_back.wait()
        with real(directory, prefix, flags) as fd:
            yield fd

    monkeypatch.setattr(deep_fs_io, "private_file", hanging)
    cfg = DeepFsIoConfig(directory="/scratch", size_mib=1, io_timeout=0.3)
    check = DeepFsIoCheck()
    ctx = CheckContext.for_root(tmp_path)
    try:
        (first,) = DeepFsIoCheck.evaluate(check.gather(ctx, cfg), cfg)
        assert (first.status, first.fault_class) == (Status.CRITICAL, "fs.io.hung")
        second = check.gather(ctx, cfg)
        assert second.still_hung and "still without an answer" in (
            DeepFsIoCheck.evaluate(second, cfg)[0].message
        )
    finally:
        server_back.set()
    cfg_ok = dataclasses.replace(cfg, io_timeout=30.0, min_write_mbps=0, min_read_mbps=0)
    poll(
        "a fresh probe",
        lambda: DeepFsIoCheck.evaluate(check.gather(ctx, cfg_ok), cfg_ok)[0].status is Status.OK,
    )
    assert list(scratch.iterdir()) == []


def _io(**changes: Any) -> DeepFsIoObservation:
    reading = IoReading(256 << 20, 0.5, 256 << 20, 0.25, True)
    return DeepFsIoObservation("/var/tmp", True, dataclasses.replace(reading, **changes))


@pytest.mark.parametrize(
    ("observation", "expected"),
    [
        (_io(), (Status.OK, None)),  # 537 MB/s write, 1074 MB/s read
        (_io(write_seconds=5.0), (Status.CRITICAL, "fs.io.throughput")),
        (_io(read_seconds=5.0), (Status.CRITICAL, "fs.io.throughput")),
        (_io(error="/var/tmp/x: [Errno 28] No space left"), (Status.CRITICAL, "fs.io.error")),
        (DeepFsIoObservation("/var/tmp", True, None, 120.0), (Status.CRITICAL, "fs.io.hung")),
        (DeepFsIoObservation("/var/tmp", False), (Status.NOT_APPLICABLE, None)),
    ],
)
def test_fs_io_evaluate_table(
    observation: DeepFsIoObservation, expected: tuple[Status, str | None]
) -> None:
    (result,) = DeepFsIoCheck.evaluate(observation, DeepFsIoConfig())
    assert (result.status, result.fault_class) == expected


def test_fs_io_slow_message_names_both_directions() -> None:
    (result,) = DeepFsIoCheck.evaluate(_io(write_seconds=5.0, read_seconds=5.0), DeepFsIoConfig())
    assert result.message == "/var/tmp: write+fsync 53.7 MB/s < 100; read 53.7 MB/s < 100"


# --- end to end through medic_core.proc with fake tools ---------------------------------------


def test_dcgm_end_to_end_with_a_fake_dcgmi(tmp_path: Path) -> None:
    """gather -> parse -> evaluate for real: dcgmi prints the fixture and exits 226 as the
    real one does when a test fails."""
    tools = tmp_path / "bin"
    fake_tool(tools, "dcgmi", f"cat {FIXTURES / 'dcgmi_diag_r2_h100_memory_fail.json'}\nexit 226\n")
    cfg = DeepDcgmConfig(search_dirs=(str(tmp_path / "empty"), str(tools)), level=2)
    check = checks.get("deep_dcgm").create()
    results = check.evaluate(check.gather(CheckContext.for_root(tmp_path), cfg), cfg)
    assert [r.target for r in results if r.status is Status.CRITICAL] == ["3"]
    assert results[3].evidence["argv"] == [str(tools / "dcgmi"), "diag", "-r", "2", "-j"]
    assert sum(r.status is Status.OK for r in results) == 7


def test_stream_end_to_end_and_a_hung_tool(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(f"processor\t: 0\nmodel name\t: {XEON}\n")
    fake_tool(tools, "stream_c.exe", f"cat {FIXTURES / 'stream_c_exe.txt'}\n")
    cfg = DeepStreamConfig(search_dirs=(str(tools),), min_triad_mbps={XEON: 30000.0})
    ctx = CheckContext.for_root(tmp_path)
    (result,) = DeepStreamCheck.evaluate(DeepStreamCheck().gather(ctx, cfg), cfg)
    assert (result.status, result.fault_class) == (Status.CRITICAL, "mem.bandwidth")
    assert result.evidence["cpu_model"] == XEON and "21177.1 MB/s" in result.message

    fake_tool(tools, "stream", "sleep 30\n")  # found first: "stream" precedes "stream_c.exe"
    slow = dataclasses.replace(cfg, command_timeout=1.0)
    started = time.monotonic()
    (result,) = DeepStreamCheck.evaluate(DeepStreamCheck().gather(ctx, slow), slow)
    assert (result.status, result.fault_class) == (Status.UNKNOWN, "check.command_failed")
    assert "timed out" in result.message and time.monotonic() - started < 10


def test_nccl_end_to_end_counts_gpus_from_dev(tmp_path: Path) -> None:
    tools, dev = tmp_path / "bin", tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    fake_tool(tools, "all_reduce_perf", f"cat {FIXTURES / 'all_reduce_perf_4xh100.txt'}\n")
    cfg = DeepNcclConfig(search_dirs=(str(tools),))
    observation = DeepNcclCheck().gather(CheckContext.for_root(tmp_path), cfg)
    assert observation.gpus == 4 and observation.run is not None
    assert list(observation.run.argv[1:]) == ["-b", "8", "-e", "1G", "-f", "2", "-g", "4"]
    (result,) = DeepNcclCheck.evaluate(observation, cfg)
    assert result.status is Status.OK and result.evidence["busbw_gbps"] == 353.40


def test_parse_dcgm3_cpu_eud_results_target_the_cpu() -> None:
    text = (
        '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": ['
        '{"name": "CPU EUD Test", "results": [{"cpu_id": "1", "status": "Fail", "warnings": ['
        '{"warning": "CPU 1 failed", "error_id": 1, "error_category": 1, "error_severity": 1}'
        "]}]}]}]}}"
    )
    (result,) = parse_dcgmi_diag(text).results
    assert (result.entity_group, result.entity_id, result.target) == ("CPU", 1, "CPU:1")
    (verdict,) = DeepDcgmCheck.evaluate(
        DeepDcgmObservation("dcgmi", ran(["dcgmi"], text, 226), parse_dcgmi_diag(text)),
        DeepDcgmConfig(),
    )
    assert (verdict.status, verdict.target) == (Status.CRITICAL, "CPU:1")
    assert verdict.message.startswith("CPU:1: DCGM diag level 2 failed: CPU EUD Test (CPU 1")

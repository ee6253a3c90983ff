"""`medic check`: the node's checks run once, in this process, on a fixture host tree (no
GPU) and on lab nodes with simulated GPUs (NVML injection, so in a child process that loads
the lab's libnvidia-ml); exit codes, the table, --json and --record into SQLite and
PostgreSQL."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cli import check as cli_check
from cli.check import check, exit_code
from cli.lab.cluster import Lab
from healthd.checks.base import CheckContext, Status, Tier
from healthd.checks.base import Result as CheckResult
from healthd.fixtures import write_host_tree
from healthd.runner import Runner
from medic_core import proc
from medic_core.store import open_store
from tests.pg import PostgresServer, pg_server  # noqa: F401  (pytest fixture)

MEDIC = str(Path(sys.executable).parent / "medic")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A healthy H100 host tree without GPUs ([healthd] gpus = none), node name c1."""
    write_host_tree(tmp_path / "host")
    conf = tmp_path / "medic.toml"
    conf.write_text(
        f'[node]\nhost_root = "{tmp_path / "host"}"\n[healthd]\ngpus = "none"\n'
        f'[store]\nurl = "sqlite:///{tmp_path / "medic.db"}"\n'
    )
    monkeypatch.setenv("MEDIC_NODE_NAME", "c1")
    return conf


def run(conf: Path, *args: str) -> Result:
    return CliRunner().invoke(check, ["--config", str(conf), *args], catch_exceptions=False)


def stop_service(root: Path, comm: str) -> None:
    for comm_file in (root / "proc").glob("*/comm"):
        if comm_file.read_text().strip() == comm:
            shutil.rmtree(comm_file.parent)


def test_a_healthy_node_exits_0_with_every_result_in_the_table(host: Path) -> None:
    result = run(host)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["CHECK", "TARGET", "STATUS", "FAULT", "MESSAGE"]
    rows = [line.split()[:3] for line in lines[1:] if not line.startswith(("c1:", "skipped"))]
    assert {r[0] for r in rows} == {"cpus", "filesystems", "host_trends", "ib", "kernel_log",
                                    "memory", "services"}  # fmt: skip
    assert {r[2] for r in rows} <= {"OK", "NOT_APPLICABLE"}
    assert ["ib", "mlx5_3/1", "OK"] in rows
    summary = next(line for line in lines if line.startswith("c1:"))
    assert summary.startswith(f"c1: 7 checks, {len(rows)} results: 0 CRITICAL, 0 UNKNOWN, 0 WARN")
    assert lines[-1].startswith("skipped (not a GPU node ([healthd] gpus = none)): gpu_count, ")


def test_a_critical_finding_exits_1(host: Path, tmp_path: Path) -> None:
    # nvidia-persistenced is not required on a CPU node (tests/test_cpu_node.py); munged is.
    stop_service(tmp_path / "host", "nvidia-persiste")  # comm is cut at 15 characters
    assert run(host, "--tier", "launch").exit_code == 0
    stop_service(tmp_path / "host", "munged")
    result = run(host, "--tier", "launch")
    assert result.exit_code == 1, result.output
    [row] = [line for line in result.stdout.splitlines() if "CRITICAL " in line]
    assert row.split()[:4] == ["services", "munged", "CRITICAL", "service.down"]
    doc = json.loads(run(host, "--tier", "launch", "--json").stdout)
    assert (doc["status"], doc["exit_code"], doc["tiers"]) == ("CRITICAL", 1, ["launch"])
    assert "kernel_log" not in [c["name"] for c in doc["checks"]]  # periodic only
    only = json.loads(run(host, "--check", "cpus", "--json").stdout)
    assert [c["name"] for c in only["checks"]] == ["cpus"] and only["exit_code"] == 0


def test_a_gpu_node_without_nvml_exits_3(tmp_path: Path, host: Path) -> None:
    conf = tmp_path / "required.toml"
    conf.write_text(host.read_text().replace('gpus = "none"', 'gpus = "required"'))
    doc = json.loads(run(conf, "--check", "gpu_ecc", "--json").stdout)
    [outcome] = doc["checks"]
    assert outcome["state"] == "unavailable"
    assert outcome["results"][0]["fault_class"] == "check.unavailable"
    assert run(conf, "--check", "gpu_ecc").exit_code == 3


def test_exit_codes_follow_the_worst_result() -> None:
    def r(status: Status) -> CheckResult:
        return CheckResult("x", status, None, None, "m")

    assert exit_code([r(Status.OK), r(Status.NOT_APPLICABLE)]) == 0
    assert exit_code([r(Status.OK), r(Status.WARN)]) == 4
    assert exit_code([r(Status.WARN), r(Status.UNKNOWN)]) == 3
    assert exit_code([r(Status.UNKNOWN), r(Status.CRITICAL), r(Status.WARN)]) == 1
    assert exit_code([]) == 0


def test_usage_errors_exit_2(host: Path, tmp_path: Path) -> None:
    unknown = run(host, "--check", "nope")
    assert unknown.exit_code == 2
    assert unknown.stderr.splitlines()[:2] == ["medic: no check named nope",
                                               "  why: not a registered check"]  # fmt: skip
    wrong_tier = run(host, "--tier", "deep", "--check", "cpus")
    assert wrong_tier.exit_code == 2
    assert "cpus: not in the deep tier (launch,periodic)" in wrong_tier.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(host.read_text() + "\n[checks.cpus]\ntimeout = -1\n")
    assert run(bad).exit_code == 2
    assert run(host, "--tier", "sometimes").exit_code == 2
    mixed = run(host, "--requalify", "--check", "cpus")
    assert mixed.exit_code == 2 and "--requalify runs its own set of checks" in mixed.stderr
    nothing = run(host, "--requalify")  # no closed RMA ticket waits for c1
    assert nothing.exit_code == 1
    assert nothing.stderr.startswith(
        "medic: c1 has no closed RMA ticket waiting for re-qualification\n"
    )


def test_the_deep_tier_runs_one_check_after_another(host: Path) -> None:
    doc = json.loads(run(host, "--tier", "deep", "--json").stdout)
    names = [c["name"] for c in doc["checks"]]
    assert names == ["deep_dcgm", "deep_fs_io", "deep_gpu_perf", "deep_ib", "deep_nccl",
                     "deep_stream"]  # fmt: skip
    # No tool on this host tree: each says so rather than guessing.
    assert {r["status"] for c in doc["checks"] for r in c["results"]} == {"NOT_APPLICABLE"}
    assert doc["exit_code"] == 0


def test_a_progress_bar_on_a_terminal_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    write_host_tree(tmp_path / "host")
    runner = Runner(CheckContext.for_root(tmp_path / "host"))
    deep = cli_check.plan(runner, (Tier.DEEP,), ())
    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(cli_check.sys, "stderr", stream)
        outcomes = cli_check.run_plan(runner, deep, None)
        assert [o.name for o in outcomes] == list(deep.names)
        drawn = stream.getvalue()
        assert ("deep checks" in drawn and "deep_stream" in drawn) is shown, drawn


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'recorded.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database()


def test_record_writes_the_results_as_conditions(
    host: Path, tmp_path: Path, store_url: str
) -> None:
    with open_store(store_url):
        pass  # created, as a daemon would have
    stop_service(tmp_path / "host", "munged")
    result = run(host, "--record", "--store", store_url)
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-1] == "recorded in the store as c1's conditions"
    with open_store(store_url) as store:
        found = {(c.type, c.target): c for c in store.conditions(node="c1")}
    bad = found[("services", "munged")]
    assert (bad.status.value, bad.reason) == ("CRITICAL", "service.down")
    assert found[("cpus", "")].status.value == "OK"
    assert ("ib", "mlx5_7/1") in found


# --- the lab: simulated GPUs ----------------------------------------------------------------


def medic_check(lab: Lab, node: str, *args: str) -> tuple[int | None, Any]:
    done = proc.run([MEDIC, "check", "--json", *args], timeout=60, env=lab.process_env(node))
    assert done.returncode is not None and done.stdout, done.describe_failure()
    return done.returncode, json.loads(done.stdout)


def test_on_lab_nodes_with_gpus(lab: Lab) -> None:
    code, healthy = medic_check(lab, "n2", "--tier", "launch")
    assert code == 0, healthy
    assert healthy["node"] == "n2" and healthy["skipped"] == []
    gpu_ecc = next(c for c in healthy["checks"] if c["name"] == "gpu_ecc")
    assert sorted(r["target"] for r in gpu_ecc["results"]) == [str(g) for g in range(8)]

    lab.inject("n1", 3, ["ecc.dbe=2"])
    code, sick = medic_check(lab, "n1", "--tier", "launch", "--record")
    assert code == 1, sick
    bad = [
        r
        for c in sick["checks"]
        for r in c["results"]
        if r["status"] not in ("OK", "NOT_APPLICABLE")
    ]
    assert [(r["check"], r["target"], r["status"]) for r in bad] == [
        ("gpu_ecc", "3", "CRITICAL")
    ], bad
    assert bad[0]["fault_class"].startswith("gpu.ecc")
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        [recorded] = [c for c in store.conditions(node="n1") if c.status.value == "CRITICAL"]
    assert (recorded.type, recorded.target, recorded.reason) == (
        "gpu_ecc", "3", bad[0]["fault_class"],
    )  # fmt: skip

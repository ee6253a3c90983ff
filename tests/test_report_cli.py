"""`medic report` and `medic report what-if` end to end: a real SQLite store written through
the same calls the daemon, the ladder and the checkpoint helper make; click's runner."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cli.main import medic
from medic_core.store import Severity, Store, open_store
from remediation import episodes as ep
from remediation import report_store as rs
from remediation import tickets
from remediation.report.rows import REBOOT_SEEN
from slurm_hooks.checkpoint import CheckpointDir
from tests.pg import PostgresServer, pg_server  # noqa: F401

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


def t(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(hours=2) + dt.timedelta(seconds=seconds)


def run(*args: str) -> Result:
    return CliRunner().invoke(medic, list(args))


def record_day(store: Store) -> None:
    """Job 41 on n1 and n2: XID 79 on n1, drained and requeued, back on n2 and n3; n1
    rebooted and resolved. n4 was drained for a link that came back (a false ejection)."""

    def event(node: str, when: dt.datetime, kind: str, **kw: object) -> None:
        store.add_event(node, at=when, kind=kind, source="test", **kw)  # type: ignore[arg-type]

    for node in ("n1", "n2"):
        event(
            node,
            t(0),
            "gate",
            severity=Severity.INFO,
            target="job:41",
            evidence={"job_id": "41", "allow": True},
        )
    event(
        "n1",
        t(3600),
        "gpu_xid",
        severity=Severity.CRITICAL,
        fault_class="gpu.xid.79",
        target="3",
        message="XID 79",
    )
    event(
        "n1",
        t(3601),
        "job_action",
        severity=Severity.CRITICAL,
        fault_class="gpu.xid.79",
        target="3",
        evidence={"drain": "drained", "why": ""},
    )
    event(
        "n1",
        t(3601),
        "job_action",
        severity=Severity.WARN,
        fault_class="gpu.xid.79",
        target="job:41",
        evidence={"action": "requeued", "job_id": "41"},
    )
    event("n1", t(3603), "job_summary", severity=Severity.CRITICAL, target="job:41")
    for node, seconds in (("n2", 3650), ("n3", 3650.5)):
        event(
            node,
            t(seconds),
            "gate",
            severity=Severity.INFO,
            target="job:41",
            evidence={"job_id": "41", "allow": True},
        )
    event(
        "n9",
        t(100),
        "job_action",
        severity=Severity.WARN,
        fault_class="gpu.xid.79",
        target="job:99",
        evidence={"action": "not_resilient", "job_id": "99"},
    )

    clock = [t(3601)]
    episodes = ep.EpisodeStore(store, clock=lambda: clock[0])
    e = episodes.open_episode(
        "n1",
        state=ep.WAITING_IDLE,
        fault_class="gpu.xid.79",
        target="3",
        check="gpu_xid",
        recommendation="restart_bm",
        rung=3,
        message="XID 79",
        evidence={},
    )
    clock[0] = t(3700)
    step = episodes.record_intent(e, 3, "reboot", ["scontrol", "reboot"], "boot-a")
    clock[0] = t(4300)  # the ladder ends a reboot's step when it sees the new boot
    episodes.finish_step(step.id, "done", 0, f"asked Slurm; {REBOOT_SEEN}")
    episodes.update(e.id, state=ep.RESOLVED)
    clock[0] = t(200)
    link = episodes.open_episode(
        "n4",
        state=ep.VERIFYING,
        fault_class="ib.port.down",
        target="mlx5_0:1",
        check="ib",
        recommendation="recheck",
        rung=0,
        message="link down",
        evidence={},
    )
    clock[0] = t(260)
    episodes.update(link.id, state=ep.RESOLVED)
    tickets.open_ticket(store, "n5", "gpu.ecc.dbe", "DBE", [], {}, "test", at=t(10))


def checkpoints(root: Path) -> None:
    """Job 41's checkpoint directory: step 300 committed at +1800 s, and the restarted
    run's resume mark at +3710 s (times set by hand, the rest as the helper writes it), as
    a job wrote it before the ledger: the report reads the manifest and the mark file."""
    first = CheckpointDir(root, env={"SLURM_JOB_ID": "41"})
    with first.writing(300) as tmp:
        (tmp / "model.pt").write_bytes(b"w" * 10)
    manifest = root / "step-000000300" / "medic-manifest.json"
    raw = json.loads(manifest.read_text())
    raw["time"] = t(1800).timestamp()
    manifest.write_text(json.dumps(raw))
    again = CheckpointDir(root, env={"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "1"})
    assert again.resume_step() == 300
    assert again.resume_step() == 300  # a second look marks nothing more
    (mark,) = root.glob(".resume-*")
    raw = json.loads(mark.read_text())
    assert (raw["step"], raw["restart_count"]) == (300, 1)
    raw["time"] = t(3710).timestamp()
    mark.write_text(json.dumps(raw))
    (root / ".medic-ledger.jsonl").unlink()  # a directory from before the ledger


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'medic.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database("report")


def test_report_on_a_real_store(store_url: str, tmp_path: Path) -> None:
    url = store_url
    with open_store(url) as store:
        record_day(store)
    checkpoints(tmp_path / "ckpt")
    window = ["--store", url, "--since", "3h", "--nodes", "10"]
    result = run("report", *window, "--checkpoints", f"41={tmp_path / 'ckpt'}", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    (job,) = out["jobs"]
    (i,) = job["interruptions"]
    assert job["job_id"] == "41" and i["node"] == "n1" and i["fault_class"] == "gpu.xid.79"
    parts = (i["detection_s"], i["isolation_s"], i["scheduling_s"], i["restart_s"])
    assert parts == (None, 1, 49, 60) and i["wall_s"] == 110
    assert (i["lost_work_s"], i["resumed_from_step"]) == (1800, 300)
    assert 0 < job["ettr"] < 1 and job["ettr_is_upper_bound"] is False
    fleet = out["fleet"]
    assert (fleet["nodes"], fleet["gpus"], fleet["episodes"], fleet["interruptions"]) == (
        10,
        80,
        2,
        1,
    )
    assert [f["node"] for f in fleet["false_ejections"]] == ["n4"]
    assert fleet["rungs"] == [
        {
            "rung": 3,
            "action": "reboot",
            "attempts": 1,
            "worked": 1,
            "failed": 0,
            "p50_s": 600.0,
            "p90_s": 600.0,
            "not_repaired": 0,
            "pending": 0,
            "measured": 1,
        }
    ]
    by_node = {n["node"]: n for n in fleet["by_node"]}
    assert by_node["n5"]["rma_s"] > 0 and by_node["n9"]["jobs_touched"] == 1
    assert out["cannot_know"]

    # the same answer whether SQLite reads the events table in order or through its indexes
    since = NOW - dt.timedelta(hours=3)

    def rows(store: Store, scan: bool) -> list[str]:
        starts, ends = rs.job_records(store, ["41"], since, NOW, scan=scan)
        return sorted(map(repr, [*starts, *ends, *rs.job_actions(store, since, NOW, scan=scan)]))

    with open_store(url) as store:
        assert rs.scan_whole_table(store, since, NOW) == url.startswith("sqlite")
        assert rows(store, scan=False) == rows(store, scan=url.startswith("sqlite"))

    table = run("report", *window)
    assert table.exit_code == 0, table.output
    assert "gpu.xid.79" in table.output and "What this report cannot know yet" in table.output
    # without the checkpoint directory, restart and lost work are unknown: ETTR a bound
    assert "<=" in table.output

    # what-if with the window's own failure rate and MTTR (its outage plus its lost work)
    with_ckpt = [*window, "--checkpoints", f"41={tmp_path / 'ckpt'}"]
    what_if = run(
        "report", *with_ckpt, "what-if", "--nodes", "100", "--days", "1",
        "--failure-rate", "measured", "--mttr", "measured", "--mttr", "5m", "--json",
    )  # fmt: skip
    assert what_if.exit_code == 0, what_if.output
    measured, given = json.loads(what_if.output)["what_if"]
    assert measured["scenario"]["failure_rate"] == fleet["failure_rate_per_node_hour"]
    assert measured["scenario"]["mttr_hours"] * 3600 == pytest.approx(110 + 1800, rel=1e-5)
    assert given["scenario"]["mttr_hours"] * 60 == pytest.approx(5)


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    open_store(url).close()
    for args, words in (
        (["--since", "yesterday"], "--since 'yesterday' is neither a duration"),
        (["--since", "1h", "--until", "2h"], "is not before --until"),
        (["--job", "x1"], "expected a Slurm job id"),
        (["--checkpoints", "41"], "expected JOB=DIR"),
    ):
        result = run("report", "--store", url, *args)
        assert result.exit_code == 2, result.output
        assert words in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_what_if_reproduces_aws_hyperpod_case() -> None:
    result = run(
        "report",
        "what-if",
        "--nodes",
        "256",
        "--failure-rate",
        "0.05%",
        "--gpu-hours",
        "10000000",
        "--mttr",
        "280m",
        "--mttr",
        "40m",
        "--json",
    )
    assert result.exit_code == 0, result.output
    slow, fast = json.loads(result.output)["what_if"]
    assert round(slow["wall_hours"] / 24) == 325 and round(fast["wall_hours"] / 24) == 221
    table = run(
        "report", "what-if", "--nodes", "256", "--failure-rate", "x", "--days", "1", "--mttr", "1h"
    )
    assert table.exit_code == 2 and "--failure-rate 'x'" in table.output

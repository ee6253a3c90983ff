"""Issue 28's report: each resume names the tier it reloaded from and how long the reload
took (the resume mark and the ledger carry both), `medic report` shows the reload as the part
of restart it is, and `medic report what-if` takes a reload time per tier."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import medic
from cli.report_gather import checkpoint_marks
from cli.report_tables import print_report
from remediation import report as rp
from remediation import whatif as wi
from slurm_hooks.checkpoint import (
    COMMIT,
    RESUME,
    CheckpointDir,
    LedgerRecord,
    parse_ledger,
)
from tests.test_report import at, one_job

PROGRESS = {"MEDIC_PROGRESS_DIR": "/nonexistent/medic-progress"}


def test_a_resume_records_its_tier_and_reload_time_in_mark_and_ledger(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "8", **PROGRESS}
    local = tmp_path / "shm" / "job-8"
    first = CheckpointDir(tmp_path / "ckpt", env=env, local=local, background_drain=False)
    with first.writing(5) as tmp:
        (tmp / "w").write_bytes(b"5" * 4096)
    first.drain(30)
    again = CheckpointDir(tmp_path / "ckpt", env={**env, "SLURM_RESTART_COUNT": "1"}, local=local)
    found = again.latest()
    assert found is not None and found.tier == "local" and found.read_s is not None
    [resume] = again.resumes()
    assert (resume.tier, resume.reload_s) == ("local", found.read_s)
    [record] = [r for r in again.ledger() if r.kind == RESUME]
    assert (record.tier, record.reload_s) == ("local", found.read_s)
    [mark] = [m for m in checkpoint_marks([f"8={tmp_path / 'ckpt'}"]) if m.kind == "resume"]
    assert (mark.tier, mark.reload_s, mark.step) == ("local", found.read_s, 5)


def test_after_a_node_loss_the_resume_names_the_durable_tier(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "9", **PROGRESS}
    first = CheckpointDir(
        tmp_path / "ckpt", env=env, local=tmp_path / "a" / "job-9", background_drain=False
    )
    with first.writing(5) as tmp:
        (tmp / "w").write_text("5")
    first.drain(30)
    elsewhere = CheckpointDir(
        tmp_path / "ckpt",
        env={**env, "SLURM_RESTART_COUNT": "1"},
        local=tmp_path / "b" / "job-9",  # another node: its local tier is empty
    )
    found = elsewhere.latest()
    assert found is not None and found.tier == "durable"
    assert elsewhere.resumes()[0].tier == "durable"


@pytest.mark.parametrize(
    ("tier", "reload_s", "want"),
    [("local", 1.5, ("local", 1.5)), ("ssd", 1.5, (None, 1.5)), ("durable", -1, ("durable", None)),
     (7, "x", (None, None)), ("peer", float("nan"), ("peer", None))],
)  # fmt: skip
def test_a_ledger_resume_keeps_only_a_known_tier_and_a_real_duration(
    tier: object, reload_s: object, want: tuple[object, object]
) -> None:
    line = LedgerRecord(RESUME, 100.0, 3, "8", 1).line().decode()
    body = json.loads(line)
    body |= {"tier": tier, "reload_s": reload_s}
    [record] = parse_ledger(
        json.dumps(body, separators=(",", ":")).replace("NaN", "1e400").encode()
    )
    assert (record.tier, record.reload_s) == want


def test_a_commit_line_carries_no_tier() -> None:
    assert "tier" not in LedgerRecord(COMMIT, 100.0, 3, "8", 0).line().decode()


def test_the_report_splits_the_reload_out_of_restart_and_names_its_tier(
    capsys: pytest.CaptureFixture[str],
) -> None:
    resume = rp.CheckpointMark("7", at(3760), "resume", 300, 1, tier="local", reload_s=12.5)
    report = rp.build_report(
        one_job(checkpoints=[rp.CheckpointMark("7", at(1800), "commit", 300), resume])
    )
    (i,) = report.jobs[0].interruptions
    assert (i.restart_s, i.reload_s, i.resumed_tier) == (60, 12.5, "local")
    assert i.wall_s == 160  # the reload is inside restart: nothing counted twice
    assert report.components["reload"].count == 1 and report.components["reload"].mean_s == 12.5
    print_report(report, 5)
    out = capsys.readouterr().out
    assert "RELOAD" in out and "12 s local" in out


def test_a_reload_longer_than_its_restart_is_capped_and_an_old_mark_has_none() -> None:
    skewed = rp.CheckpointMark("7", at(3760), "resume", 300, 1, tier="durable", reload_s=900.0)
    old = dataclasses.replace(skewed, tier=None, reload_s=None)
    commit = rp.CheckpointMark("7", at(1800), "commit", 300)
    (i,) = rp.build_report(one_job(checkpoints=[commit, skewed])).jobs[0].interruptions
    assert i.reload_s == i.restart_s == 60
    (j,) = rp.build_report(one_job(checkpoints=[commit, old])).jobs[0].interruptions
    assert (j.reload_s, j.resumed_tier, j.restart_s) == (None, None, 60)


def test_what_if_reload_rows() -> None:
    reloads = wi.Reloads.of({"durable": 0.5, "local": 0.01}, 0.6)
    (d_label, durable), (m_label, mixed) = reloads.rows(0.1)
    assert d_label == "durable" and durable == pytest.approx(0.6)
    assert m_label == "local 60%, else durable" and mixed == pytest.approx(0.1 + 0.006 + 0.2)
    assert wi.Reloads.of({"durable": 0.5}, None).rows(0.1) == [("durable", pytest.approx(0.6))]


def run(*args: str) -> object:
    return CliRunner().invoke(medic, ["report", "what-if", *args])


BASE = ("--nodes", "100", "--days", "30", "--failure-rate", "0.0005", "--mttr", "5m")


def test_what_if_takes_a_reload_per_tier_and_shows_the_lever() -> None:
    result = run(*BASE, "--reload", "durable=25m", "--reload", "local=20s", "--local-share", "0.5")
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    out = result.output  # type: ignore[attr-defined]
    assert "RELOAD" in out and "local 50%, else durable" in out and "saves" in out
    as_json = run(*BASE, "--reload", "durable=25m", "--json")
    rows = json.loads(as_json.output)["what_if"]  # type: ignore[attr-defined]
    assert [r["reload"] for r in rows] == ["durable"]
    assert rows[0]["scenario"]["mttr_hours"] == pytest.approx(0.5)
    plain = json.loads(run(*BASE, "--json").output)["what_if"]  # type: ignore[attr-defined]
    assert plain[0]["reload"] is None and plain[0]["scenario"]["mttr_hours"] == pytest.approx(
        5 / 60
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--reload", "local=20s", "--local-share", "0.5"), "--reload durable=DURATION is needed"),
        (("--reload", "durable=25m", "--reload", "local=20s"), "go together"),
        (("--reload", "durable=25m", "--local-share", "0.5"), "go together"),
        (("--local-share", "0.5"), "--local-share needs --reload"),
        (("--reload", "durable=25m", "--reload", "local=1s", "--local-share", "2"), "from 0 to 1"),
        (("--reload", "nvme=20s"), "TIER one of local, durable"),
        (("--reload", "durable"), "expected TIER=DURATION"),
        (("--reload", "durable=soon"), "expected a duration"),
    ],
)
def test_what_if_refuses_a_bad_reload_in_one_line(args: tuple[str, ...], says: str) -> None:
    result = run(*BASE, *args)
    assert result.exit_code != 0  # type: ignore[attr-defined]
    assert says in result.output and "Traceback" not in result.output  # type: ignore[attr-defined]

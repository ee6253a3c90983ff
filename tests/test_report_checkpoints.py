"""What the checkpoint helper records for `medic report` with no extra work for the job: a
commit's time, duration and step (its manifest), a restarted run's resume time and step
(the resume mark `latest()` leaves), and `medic report --checkpoints JOB=DIR` reading them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import medic
from cli.report_gather import checkpoint_marks
from slurm_hooks import checkpoint as ck
from slurm_hooks.checkpoint import CheckpointDir
from slurm_hooks.checkpoint import commit as ck_commit
from slurm_hooks.checkpoint import ledger as ck_ledger


class Clock:
    """Stands in for the module `time` in the commit and the resume mark (slurm_hooks.checkpoint's
    commit and ledger modules): each call of time()
    returns the next of `times`."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def time(self) -> float:
        return self.times.pop(0)


def test_a_commit_records_when_it_began_and_ended_and_a_resume_its_time_and_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpt"
    job = {"SLURM_JOB_ID": "8"}
    # The job's own code, unchanged: writing(step) to commit, latest() to resume.
    clock = Clock(1000.0, 1003.5, 2000.0, 2001.25)
    for module in (ck_commit, ck_ledger):
        monkeypatch.setattr(module, "time", clock)
    first = CheckpointDir(root, env=job)
    with first.writing(10) as tmp:
        (tmp / "w").write_text("10")
    with first.writing(20) as tmp:
        (tmp / "w").write_text("20")
    clock = Clock(2100.0)
    for module in (ck_commit, ck_ledger):
        monkeypatch.setattr(module, "time", clock)
    again = CheckpointDir(root, env={**job, "SLURM_RESTART_COUNT": "1"})
    found = again.latest()
    assert found is not None and (found.step, found.started, found.time) == (20, 2000.0, 2001.25)
    assert found.duration == 1.25 and found.to_json()["duration_s"] == 1.25
    [resume] = again.resumes()
    assert (resume.time, resume.step, resume.restart_count) == (2100.0, 20, 1)

    marks = checkpoint_marks([f"8={root}"])
    commits = [(m.at.timestamp(), m.step, m.duration_s) for m in marks if m.kind == "commit"]
    assert commits == [(1003.5, 10, 3.5), (2001.25, 20, 1.25)]
    assert [(m.at.timestamp(), m.step) for m in marks if m.kind == "resume"] == [(2100.0, 20)]


@pytest.mark.parametrize("started", [None, "noon", True, float("nan"), 1e400, [1]])
def test_a_manifest_without_a_usable_start_has_no_duration(tmp_path: Path, started: object) -> None:
    root = tmp_path / "ckpt"
    with CheckpointDir(root, env={}).writing(1) as tmp:
        (tmp / "w").write_text("1")
    manifest = root / "step-000000001" / ck.MANIFEST
    raw = json.loads(manifest.read_text())
    assert raw["started"] <= raw["time"]
    if started is None:
        del raw["started"]  # a manifest from before the field
    else:
        raw["started"] = started
    manifest.write_text(json.dumps(raw).replace("Infinity", "1e400"))
    found = CheckpointDir(root, env={}).latest()
    assert found is not None and found.started is None and found.duration is None


def test_the_report_shows_each_jobs_checkpoints_and_their_time(tmp_path: Path) -> None:
    """A job interrupted once, whose directory holds two commits: the Jobs table and the
    JSON count them and sum their durations."""
    import datetime as dt

    from medic_core.store import Severity, open_store

    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    root = tmp_path / "ckpt"
    for step in (1, 2):
        with CheckpointDir(root, env={"SLURM_JOB_ID": "9"}).writing(step) as tmp:
            (tmp / "w").write_bytes(b"x" * 1000)
    with open_store(url) as store:
        for when, node in ((now - dt.timedelta(minutes=30), "n1"), (now, "n2")):
            store.add_event(node, at=when, kind="gate", severity=Severity.INFO, source="test",
                            target="job:9", evidence={"job_id": "9", "allow": True})  # fmt: skip
        store.add_event("n1", at=now - dt.timedelta(seconds=1), kind="job_action",
                        severity=Severity.WARN, source="test", fault_class="gpu.xid.79",
                        target="job:9", evidence={"action": "requeued", "job_id": "9"})  # fmt: skip
    args = ["report", "--store", url, "--since", "1h", "--checkpoints", f"9={root}"]
    out = json.loads(CliRunner().invoke(medic, [*args, "--json"]).output)
    [job] = out["jobs"]
    assert job["checkpoints"] == 2 and 0 <= job["checkpoint_s"] < 5
    table = CliRunner().invoke(medic, args).output
    assert "CHECKPOINTS" in table and "2 (" in table

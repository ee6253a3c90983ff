"""`medic jobs` counts what the decision core counts (issue 25, point 7): the restarts Medic
charged (the job's ledger in its AdminComment), beside Slurm's own restart count, which a
prolog refusal raises too; the budget allowed is the tag capped by max_restarts.

The command runs against a `squeue` that prints Slurm 24.11's `squeue --json` (the recorded
fixture's record with this test's jobs in it), through the real `CliSlurm`, and a store in a
temporary SQLite file."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import cli.admin
from cli.admin import job_json, jobs
from medic_core.slurm import CliSlurm, JobInfo
from medic_core.store import Severity, open_store
from remediation.decide import LEDGER_TAG, Ledger

SQUEUE_24_11 = Path(__file__).parent / "fixtures" / "slurm" / "24.11" / "squeue.json"
REQUEUED_NOTE = "medic: requeued off n1 (gpu.xid.79); restart 1/1"


def job(restart_count: int, admin_comment: str = "") -> JobInfo:
    return JobInfo("7", "train", "alice", "RUNNING", "None", "n2", True, restart_count,
                   "medic:resilient=50", admin_comment)  # fmt: skip


def test_a_job_refused_at_launch_shows_nothing_charged_and_slurms_count_apart() -> None:
    shown = job_json(job(restart_count=1), 50, [], max_restarts=20)
    assert (shown["restarts_used"], shown["slurm_restarts"]) == (0, 1)
    assert (shown["restarts_asked"], shown["restarts_allowed"]) == (50, 20)


def test_a_requeue_medic_charged_is_counted_from_the_ledger() -> None:
    ledger = Ledger(1, ("run0",)).text()
    shown = job_json(job(2, f"medic: requeued off n1 (gpu.xid.79) {ledger}"), 50, [], None)
    assert (shown["restarts_used"], shown["slurm_restarts"], shown["restarts_allowed"]) == (
        1,
        2,
        50,
    )


# --- the command, on squeue's exact output ---------------------------------------------------


def squeue_record(job_id: int, **fields: Any) -> dict[str, Any]:
    """The recorded 24.11 job record with this test's id and fields."""
    template: dict[str, Any] = json.loads(SQUEUE_24_11.read_text())["jobs"][0]
    record = copy.deepcopy(template)
    record.update(job_id=job_id, **fields)
    return record


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`medic jobs` against a squeue printing the records `cluster(records)` is given, with
    `--config` naming a SQLite store (and `[remediation]` lines when given); returns
    (invoke, store)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    output = tmp_path / "squeue.json"
    squeue = bin_dir / "squeue"
    squeue.write_text(f"#!/bin/sh\nexec cat {output}\n")
    squeue.chmod(0o755)
    monkeypatch.setattr(cli.admin, "slurm_client", lambda config: CliSlurm(bin_dirs=[bin_dir]))
    db = tmp_path / "medic.db"
    with open_store(f"sqlite:///{db}"):
        pass  # a store Medic has written: `medic jobs` refuses to create one
    conf = tmp_path / "medic.toml"

    def invoke(records: list[dict[str, Any]], *args: str, remediation: str = "") -> Result:
        document = json.loads(SQUEUE_24_11.read_text())
        document["jobs"] = records
        output.write_text(json.dumps(document))
        conf.write_text(f'[store]\nurl = "sqlite:///{db}"\n[remediation]\n{remediation}\n')
        return CliRunner().invoke(jobs, [*args, "--config", str(conf)], catch_exceptions=False)

    return invoke, db


def listed(result: Result) -> dict[str, dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return {j["job_id"]: j for j in json.loads(result.stdout)}


def rows(result: Result) -> dict[str, list[str]]:
    """The table's rows by job id, as the header's columns (the last, free text, kept
    whole)."""
    assert result.exit_code == 0, result.output
    header, *lines = result.stdout.splitlines()
    assert header.split()[:7] == [
        "JOB", "NAME", "USER", "STATE", "MEDIC_RESTARTS", "SLURM_RESTARTS", "NODES"
    ]  # fmt: skip
    columns = ("JOB", "NAME", "USER", "STATE", "MEDIC_RESTARTS", "SLURM_RESTARTS", "NODES",
               "LAST MEDIC ACTION")  # fmt: skip
    starts = [header.index(c) for c in columns]
    out = {}
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        out[cells[0]] = cells
    return out


def test_refused_at_launch_charged_nothing_while_slurm_counts_one(cluster: Any) -> None:
    invoke, _ = cluster
    refused = squeue_record(101, restart_cnt=1, comment="medic:resilient=1", admin_comment="")
    by_medic = squeue_record(
        102, restart_cnt=1, comment="medic:resilient=1",
        admin_comment=f"{REQUEUED_NOTE} {Ledger(1, ('run0',)).text()}",
    )  # fmt: skip
    table = rows(invoke([refused, by_medic]))
    assert table["101"][4:6] == ["0/1", "1"]  # Medic charged 0 of 1; Slurm counted the refusal
    assert table["102"][4:6] == ["1/1", "1"]  # the requeue Medic charged, Slurm's count too
    shown = listed(invoke([refused, by_medic], "--json"))
    counts = ("restarts_used", "restarts_allowed", "slurm_restarts")
    assert [shown["101"][k] for k in counts] == [0, 1, 1]
    assert [shown["102"][k] for k in counts] == [1, 1, 1]


def test_a_job_without_a_ledger_has_nothing_charged(cluster: Any) -> None:
    invoke, _ = cluster
    jobs_ = [
        squeue_record(201, restart_cnt=0, comment="medic:resilient=3", admin_comment=""),
        # An admin's own note, and a requeue note from before the ledger: no ledger either.
        squeue_record(
            202, restart_cnt=0, comment="medic:resilient=3", admin_comment="reserved for INC-5512"
        ),
        squeue_record(
            203,
            restart_cnt=2,
            comment="medic:resilient=3",
            admin_comment="medic: requeued off n4 (gpu.xid.79); restart 1/3",
        ),
        squeue_record(204, restart_cnt=0, comment="", admin_comment=""),  # not resilient
    ]
    table = rows(invoke(jobs_))
    assert set(table) == {"201", "202", "203"}
    assert [table[j][4:6] for j in ("201", "202", "203")] == [
        ["0/3", "0"], ["0/3", "0"], ["0/3", "2"]
    ]  # fmt: skip
    every = rows(invoke(jobs_, "--all"))
    assert every["204"][4:6] == ["-", "0"]  # not resilient: no budget, Slurm's count all the same
    shown = listed(invoke(jobs_, "--all", "--json"))
    assert (shown["204"]["restarts_used"], shown["204"]["restarts_allowed"]) == (0, None)


def test_the_budget_shown_is_the_tag_capped_by_max_restarts(cluster: Any) -> None:
    invoke, _ = cluster
    asked = squeue_record(
        301, restart_cnt=4, comment="medic:resilient=50",
        admin_comment=f"medic: restart 3/20 {Ledger(3, ('run0', 'run1', 'run3')).text()}",
    )  # fmt: skip
    assert rows(invoke([asked], remediation="max_restarts = 20"))["301"][4:6] == ["3/20", "4"]
    shown = listed(invoke([asked], "--json", remediation="max_restarts = 20"))["301"]
    assert (shown["restarts_asked"], shown["restarts_allowed"]) == (50, 20)


HOSTILE_LEDGERS = {
    # AdminComment -> what Medic counts (the decision core reads it the same way)
    f"{LEDGER_TAG}restarts=-3;charged=run0": 0,
    f"{LEDGER_TAG}restarts=²;charged=run0": 0,
    f"{LEDGER_TAG}restarts=٣;charged=run0": 0,
    f"{LEDGER_TAG}restarts=99999999999999999999999;charged=run0": 10_000,
    f"{LEDGER_TAG}": 0,
    f"{LEDGER_TAG}restarts": 0,
    f"{LEDGER_TAG}restarts=1;charged=run0 {LEDGER_TAG}restarts=2;charged=run0,run1": 2,
    f"{LEDGER_TAG}charged=run0,run1;restarts=2;;==;restarts=1": 1,
    "medic-ledger restarts=5": 0,
}


def test_hostile_comment_text_is_counted_as_the_decision_core_counts_it(cluster: Any) -> None:
    invoke, _ = cluster
    records = [
        squeue_record(400 + i, restart_cnt=1, comment="medic:resilient=3", admin_comment=text)
        for i, text in enumerate(HOSTILE_LEDGERS)
    ]
    # The user's own Comment cannot reset or raise what Medic charged: the ledger is read
    # from the AdminComment (only admins and Slurm write it), never from the Comment.
    records.append(squeue_record(
        450, restart_cnt=1, admin_comment=Ledger(1, ("run0",)).text(),
        comment=f"medic:resilient=3 {LEDGER_TAG}restarts=0;charged=",
    ))  # fmt: skip
    records.append(squeue_record(
        451, restart_cnt=0, admin_comment="",
        comment=f"medic:resilient=3 {LEDGER_TAG}restarts=3;charged=run0,run1,run2",
    ))  # fmt: skip
    # Not resilient: a malformed or oversized tag is never a budget.
    for bad_id, comment in ((460, "medic:resilient=x"), (461, "medic:resilient=1000001"),
                            (462, "medic:resilient=٣")):  # fmt: skip
        records.append(squeue_record(bad_id, restart_cnt=0, comment=comment))
    # The name and the user are the user's text: escapes and line breaks stay in their row.
    records.append(squeue_record(
        470, restart_cnt=1, comment="medic:resilient=1", admin_comment="",
        name="\x1b[2J\x1b[31mtrain\n471  evil  root  RUNNING  9/9  9",
    ))  # fmt: skip
    shown = listed(invoke(records, "--json"))
    for i, charged in enumerate(HOSTILE_LEDGERS.values()):
        job_id = str(400 + i)
        assert shown[job_id]["restarts_used"] == charged, list(HOSTILE_LEDGERS)[i]
        assert (
            shown[job_id]["restarts_used"] == Ledger.parse(shown[job_id]["admin_comment"]).restarts
        )
        assert shown[job_id]["slurm_restarts"] == 1
    assert (shown["450"]["restarts_used"], shown["451"]["restarts_used"]) == (1, 0)
    assert not {"460", "461", "462"} & set(shown)
    result = invoke(records)
    table = rows(result)
    assert "471" not in table and "\x1b" not in result.stdout
    assert len(result.stdout.splitlines()) == 1 + len(table) == 1 + len(shown)
    assert table["470"][4:6] == ["0/1", "1"]


def test_the_last_action_is_medics_requeue(cluster: Any) -> None:
    invoke, db = cluster
    requeued = squeue_record(
        501, restart_cnt=1, comment="medic:resilient=2",
        admin_comment=f"{REQUEUED_NOTE} {Ledger(1, ('run0',)).text()}",
    )  # fmt: skip
    at = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=3)
    with open_store(f"sqlite:///{db}") as store:
        store.add_event("n1", at=at, kind="job_action", severity=Severity.WARN, source="healthd",
                        message="requeued", fault_class="gpu.xid.79", target="job:501",
                        evidence={"action": "requeued"})  # fmt: skip
    row = rows(invoke([requeued]))["501"]
    assert row[4:6] == ["1/2", "1"] and row[7].endswith("n1: requeued (gpu.xid.79)")

"""`medic maintenance` (remediation.maintenance): which jobs on the window's nodes are
requeued before the start (resilient, requeueable, running) and which are named and left;
the requeue says why in the job's AdminComment first; a Slurm refusal is reported, never
raised."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.main import medic
from medic_core.slurm import JobInfo
from remediation.maintenance import due_requeues, requeue_before
from tests.fakes import FakeSlurm

STATES = ("RUNNING", "SUSPENDED", "PENDING", "COMPLETING")


def job(job_id: str, comment: str = "medic:resilient=3", requeue: bool = True,
        state: str = "RUNNING") -> JobInfo:  # fmt: skip
    return JobInfo(job_id, "j", "alice", state, "None", "n1", requeue, 0, comment)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["1", "2", "3", "4"]), st.booleans(), st.booleans(),
                  st.sampled_from(STATES)),
        max_size=8,
    )
)  # fmt: skip
def test_only_running_resilient_requeueable_jobs_are_requeued_each_once(
    rows: list[tuple[str, bool, bool, str]],
) -> None:
    jobs = [job(i, "medic:resilient=2" if tagged else "", requeue, s)
            for i, tagged, requeue, s in rows]  # fmt: skip
    plan = due_requeues(jobs)
    last = {j.job_id: j for j in jobs}
    assert sorted([*plan.requeue, *(j for j, _ in plan.left)]) == sorted(last)
    for job_id in plan.requeue:
        j = last[job_id]
        assert j.requeue and j.comment and j.state in ("RUNNING", "SUSPENDED")


def test_the_requeue_says_why_first_and_a_refusal_is_reported() -> None:
    fake = FakeSlurm(["n1", "n2"])
    fake.start_job("7", "n1", comment="medic:resilient=3")
    fake.start_job("8", "n2", comment="")
    fake.start_job("9", "n2", comment="medic:resilient=1")
    fake.fail("requeue", times=1)  # job 7's
    plan, failed = requeue_before(fake, ["n1", "n2"], "medic-maint-x")
    assert plan.requeue == ("7", "9") and [j for j, _ in plan.left] == ["8"]
    assert [j for j, _ in failed] == ["7"]
    assert fake.called("set_admin_comment", "9") == [
        ("set_admin_comment", "9", "medic: requeued before maintenance medic-maint-x")
    ]
    assert fake.called("requeue", "9") and not fake.jobs_["9"].running


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--start", "tomorrow", "--start 'tomorrow': expected +DURATION"),
        ("--start", "2001-01-01T00:00", "is not in the future"),
        ("--nodes", "n[0-99999999999]", "--nodes 'n[0-99999999999]'"),
        ("--name", "a b", "--name 'a b'"),
        ("--duration", "soon", "--duration 'soon'"),
    ],
)
def test_bad_input_is_one_line(flag: str, value: str, says: str) -> None:
    options = {"--nodes": "n1", "--start": "+30m", "--duration": "2h", flag: value}
    result = CliRunner().invoke(medic, ["maintenance", *(x for o in options.items() for x in o)])
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output

"""A handed spare refuses another job in its prolog (issue 22: a user cannot run a second
job on the spare handed to their first). The decision (remediation.decide), the pool's
refusal and the lifting of its drain on a real SQLite store with the fake Slurm of
tests/test_spares.py, and the launch gate's answer; the lab proof is
tests/test_spares_lab.py."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from healthd.checks.base import Result, Status
from medic_core.config import NodePaths
from medic_core.drain_book import SPARES, DrainBook
from medic_core.settings import SpareSettings
from medic_core.slurm import JobInfo
from medic_core.store import Store
from medic_core.vocabulary import Finding
from remediation import spares as spares_module
from remediation.decide_spares import (
    ReservedJob,
    decide_refusal_lift,
    decide_spare_tending,
    decide_unseen_launch,
)
from remediation.spares import REFUSAL_FAULT, REFUSAL_LIFTED, REFUSED_JOB, SparePool
from tests.test_gate_recorder import GatedStore, make_gate
from tests.test_gate_recorder import paths as paths
from tests.test_spares import (
    BOUND,
    IN_RESERVATION,
    RES,
    SpareSlurm,
    handed_lab,
    pool,
    rj,
    start,
)
from tests.test_spares import fresh_looks as fresh_looks  # autouse: the pool's module state
from tests.test_spares import store as store

INTRUDER = "9"


def job_on(job_id: str, state: str, nodes: str) -> JobInfo:
    return JobInfo(job_id, "other", "alice", state, "None", nodes, True, 0)


def intruder_in_its_prolog(store: Store) -> SpareSlurm:
    """n5 handed to BOUND (still waiting for it); the same user's job 9, which named the
    reservation, allocated n5 and in its prolog. The spare's daemon watches it."""
    slurm = handed_lab(store)
    start(slurm, INTRUDER)
    slurm.add_job(job_on(INTRUDER, "RUNNING", "n5"))
    spares_module._next_look["n5"] = 0.0  # handed: the spare's daemon looks every loop
    return slurm


def drained(slurm: SpareSlurm) -> bool:
    n5 = slurm.node("n5")
    return n5 is not None and n5.drained


def actions(store: Store) -> list[str]:
    return [str(e.evidence.get("action")) for e in reversed(store.events(kind="spare"))]


# --- the decision -----------------------------------------------------------------------------


def test_a_launching_job_of_the_reservation_is_refused_not_requeued() -> None:
    jobs = [rj(BOUND), rj(INTRUDER, "RUNNING", ("n5",)), rj("10", "RUNNING", ("n5",))]
    got = decide_spare_tending(BOUND, "n5", jobs, moved=True, launching=INTRUDER)
    assert got.refuse == INTRUDER
    assert got.requeue == ("10",)  # Slurm requeues the refused one: never twice
    assert not got.delete


def test_a_job_refused_in_its_prolog_is_left_to_slurms_requeue_at_the_next_loops() -> None:
    jobs = [rj(BOUND), rj(INTRUDER, "COMPLETING", ("n5",)), rj("10", "RUNNING", ("n5",))]
    got = decide_spare_tending(BOUND, "n5", jobs, moved=True, refused={INTRUDER})
    assert (got.refuse, got.requeue) == ("", ("10",))
    assert INTRUDER in got.unbind  # cleared of the reservation (an admin may, running too)


def test_the_bound_run_and_strangers_are_never_refused() -> None:
    jobs = [rj(BOUND, "RUNNING", ("n5",))]
    assert decide_spare_tending(BOUND, "n5", jobs, moved=True, launching=BOUND).refuse == ""
    assert decide_spare_tending(BOUND, "n5", jobs, moved=True, launching="77").refuse == ""


def test_a_job_in_its_prolog_is_left_to_the_prologs_gate() -> None:
    jobs = [rj(BOUND), rj(INTRUDER, "CONFIGURING", ("n5",))]
    got = decide_spare_tending(BOUND, "n5", jobs, moved=True)
    assert (got.requeue, got.unbind, got.refuse) == ((), (), "")  # its gate refuses it
    now = decide_spare_tending(BOUND, "n5", jobs, moved=True, launching=INTRUDER)
    assert (now.requeue, now.unbind, now.refuse) == ((), (), INTRUDER)


@given(IN_RESERVATION, st.booleans(), st.sampled_from(["", BOUND, "5", "6", "77"]))
def test_refusal_invariants(jobs: list[ReservedJob], moved: bool, launching: str) -> None:
    """A job is refused in its prolog only when it is that launch and in the reservation
    but not the bound run; the refused job is left to Slurm's requeue; everything else is
    decided as without a launch."""
    got = decide_spare_tending(BOUND, "n5", jobs, moved=moved, launching=launching)
    without = decide_spare_tending(BOUND, "n5", jobs, moved=moved)
    others = {j.job_id for j in jobs if j.job_id != BOUND}
    assert got.refuse == (launching if launching in others else "")
    assert got.refuse not in got.requeue
    assert set(got.requeue) == set(without.requeue) - {got.refuse}
    assert got.unbind == tuple(j for j in without.unbind if j != got.refuse)  # it runs yet
    assert got.delete == without.delete


def test_the_refusals_drain_waits_for_the_refused_job_to_leave_the_spare() -> None:
    assert "still running" in decide_refusal_lift([("RUNNING", ("n5",))], "n5", True)
    assert "still configuring" in decide_refusal_lift([("CONFIGURING", ("n5",))], "n5", True)
    assert decide_refusal_lift([("PENDING", ())], "n5", True) == ""
    # Its prolog failed and Slurm requeued it; its epilog may still run: no job waits on that.
    assert decide_refusal_lift([("COMPLETING", ("n5",))], "n5", True) == ""
    assert decide_refusal_lift([("RUNNING", ("n2",))], "n5", True) == ""  # elsewhere now
    assert decide_refusal_lift([], "n5", True) == ""  # gone from Slurm
    assert "no longer" in decide_refusal_lift([("PENDING", ())], "n5", False)


# --- the pool ---------------------------------------------------------------------------------


def test_another_job_is_refused_in_its_prolog_with_a_drain_medic_recorded(store: Store) -> None:
    slurm = intruder_in_its_prolog(store)
    spares = pool(slurm, store, at="n5")
    finding = spares.guard_launch(INTRUDER)
    assert finding is not None
    assert (finding.status, finding.fault_class) == (Status.CRITICAL, REFUSAL_FAULT)
    assert ("requeue", INTRUDER) not in slurm.calls  # the prolog's failure requeues it
    assert slurm.calls[0][:2] == ("drain", "n5")  # before anything else: the prolog waits
    n5 = slurm.node("n5")
    assert n5 is not None
    assert n5.drained and n5.reason.startswith(f"medic: {REFUSAL_FAULT} job:{BOUND}")
    own = DrainBook.of(store).ownership("n5", n5)
    assert own.recorded and own.record is not None and own.record.actor == SPARES
    [refused] = [e for e in store.events(kind="spare") if e.evidence["action"] == REFUSED_JOB]
    assert (refused.evidence["refused"], refused.evidence["drained"]) == (INTRUDER, True)


def test_the_refusals_drain_is_lifted_once_slurm_has_requeued_the_job(store: Store) -> None:
    slurm = intruder_in_its_prolog(store)
    spares = pool(slurm, store, at="n5")
    assert spares.guard_launch(INTRUDER) is not None
    spares.tend()  # the prolog has not failed yet: the job is still on the spare
    assert slurm.called("resume") == [] and drained(slurm)
    assert slurm.called("requeue") == []  # the prolog's failure requeues it, not Medic
    slurm.add_job(job_on(INTRUDER, "PENDING", ""))  # requeued, held
    spares.tend()
    assert slurm.called("resume") == [("resume", "n5")] and not drained(slurm)
    [record] = store.drain_records("n5")
    assert (record.closed_by, record.open) == (SPARES, False)
    assert actions(store)[-1] == REFUSAL_LIFTED
    spares.tend()  # lifted once, never again
    assert len(slurm.called("resume")) == 1


def test_a_drain_someone_made_since_is_never_lifted_by_the_refusal(store: Store) -> None:
    slurm = intruder_in_its_prolog(store)
    spares = pool(slurm, store, at="n5")
    assert spares.guard_launch(INTRUDER) is not None
    slurm.admin_drain("n5", "admin: fan noise")
    slurm.add_job(job_on(INTRUDER, "PENDING", ""))
    spares.tend()
    assert slurm.called("resume") == [] and drained(slurm)
    [lifted] = [e for e in store.events(kind="spare") if e.evidence["action"] == REFUSAL_LIFTED]
    assert "left as it is" in lifted.message


def test_the_bound_run_starts_and_a_stranger_is_not_the_spares_to_refuse(store: Store) -> None:
    slurm = handed_lab(store)
    spares_module._next_look["n5"] = 0.0
    spares = pool(slurm, store, at="n5")
    assert spares.guard_launch("77") is None  # in no handed reservation
    start(slurm, BOUND)
    assert spares.guard_launch(BOUND) is None
    assert slurm.called("drain") == [] and not drained(slurm)


def test_a_spare_not_watched_is_not_read_at_launch(store: Store) -> None:
    slurm = handed_lab(store)
    start(slurm, INTRUDER)
    spares_module._next_look["n5"] = time.monotonic() + 60  # not handed as far as it knows
    assert pool(slurm, store, at="n5").guard_launch(INTRUDER) is None
    assert slurm.calls == []


# --- the launch gate --------------------------------------------------------------------------


def test_the_gate_refuses_the_launch_for_the_spares_finding_without_running_checks(
    tmp_path: Path, paths: NodePaths, store: Store
) -> None:
    ok = Result("gpu_count", Status.OK, "", None, "8 GPUs")
    gate = make_gate(tmp_path, paths, GatedStore(store), ok)
    refusal = Finding("spares", Status.CRITICAL, REFUSAL_FAULT, "job:9", "n1 is handed")
    gate.before_launch = lambda job_id: refusal if job_id == INTRUDER else None
    reply = gate.launch(5.0, job_id=INTRUDER)
    assert (reply["allow"], reply["status"], reply["ran"]) == (False, "CRITICAL", [])
    assert [b["fault_class"] for b in reply["blocking"]] == [REFUSAL_FAULT]
    assert gate.launch(5.0, job_id="10")["allow"] is True
    assert gate.recorder.flush(10)
    events = store.events("n1", kind="gate")
    assert {(e.target, e.evidence["allow"]) for e in events} == {
        ("job:9", False),
        ("job:10", True),
    }


def test_the_refusal_stands_when_slurm_fails_the_rest_of_the_tending(store: Store) -> None:
    slurm = intruder_in_its_prolog(store)
    slurm.in_res[RES]["10"] = rj("10")  # another of the user's jobs waits in the reservation
    slurm.fail("unbind")
    finding = pool(slurm, store, at="n5").guard_launch(INTRUDER)
    assert finding is not None and drained(slurm)
    assert slurm.called("unbind") == [("unbind", "10")]  # tried, failed: the next loop's


def test_a_job_started_on_the_spare_is_left_to_its_prologs_gate_for_the_prologs_time(
    store: Store,
) -> None:
    """Slurm shows a job in its prolog as RUNNING: requeued by the loop at once, it could
    slip past its gate (a requeue in the prolog does not always stop its script)."""
    slurm = intruder_in_its_prolog(store)
    spares = SparePool(SpareSettings(size=1), slurm, store, "n5", prolog_grace=60.0)  # type: ignore[arg-type]
    spares.tend()
    assert slurm.called("requeue") == [] and slurm.called("unbind") == []
    assert spares.guard_launch(INTRUDER) is not None  # its prolog asks: refused there
    late = SparePool(SpareSettings(size=1), slurm, store, "n5", prolog_grace=0.0)  # type: ignore[arg-type]
    slurm.in_res[RES]["10"] = rj("10", "RUNNING", ("n5",))  # its gate never asked us
    late.tend()
    assert slurm.called("requeue") == [("requeue", "10")]


def test_a_launch_on_a_spare_whose_reservation_slurm_does_not_show_fails_closed(
    store: Store,
) -> None:
    """Slurm unreachable while the user's other job is in its prolog on the handed spare: it
    is refused unseen (it started open: the gate allowed it), the bound run is not."""
    slurm = intruder_in_its_prolog(store)
    slurm.fail("reservation_exists", times=None)
    spares = pool(slurm, store, at="n5")
    assert spares.guard_launch(BOUND) is None
    finding = spares.guard_launch(INTRUDER)
    assert finding is not None and finding.fault_class == REFUSAL_FAULT
    assert drained(slurm)  # the drain is Medic's, lifted as any refusal's
    [refused] = [e for e in store.events(kind="spare") if e.evidence["action"] == REFUSED_JOB]
    assert (refused.evidence["refused"], refused.evidence["drained"]) == (INTRUDER, True)


def test_the_refusal_stands_when_slurm_refuses_its_drain(store: Store) -> None:
    slurm = intruder_in_its_prolog(store)
    slurm.fail("drain", times=None)
    finding = pool(slurm, store, at="n5").guard_launch(INTRUDER)
    assert finding is not None  # it raised out of the tending before: the job started
    [refused] = [e for e in store.events(kind="spare") if e.evidence["action"] == REFUSED_JOB]
    assert refused.evidence["drained"] is False and "not drained" in refused.message


@given(st.frozensets(st.sampled_from([BOUND, "5", "6"])), st.sampled_from(["", BOUND, "5", "77"]))
def test_an_unseen_launch_is_refused_unless_it_is_a_bound_run(
    bound_runs: frozenset[str], launching: str
) -> None:
    got = decide_unseen_launch(bound_runs, launching)
    refuse = bool(launching) and launching not in bound_runs
    assert (got is not None) == refuse
    assert got is None or (got.refuse, got.requeue, got.unbind, got.delete) == (
        launching,
        (),
        (),
        False,
    )

"""Example-based tests of the decision core (remediation.decide) for the defects of issue 10
that it decides: each builds the facts of the lab's scenario and checks the decision."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from medic_core.drain_reason import as_slurm_stores, claims_medic_prefix
from medic_core.settings import HookSettings
from medic_core.slurm import NodeInfo
from medic_core.status import Status, worst
from medic_core.vocabulary import Finding, Recommendation, Verdict
from remediation.decide import (
    NEEDS_HUMAN,
    PAUSED,
    SPARE_REFUSAL,
    WAITING_CAP,
    WAITING_IDLE,
    EpisodeMove,
    FaultFacts,
    JobFacts,
    Ledger,
    NodeFacts,
    Rails,
    cap_reason,
    decide_fault,
    decide_launch,
)
from remediation.decide_resume import decide_resume
from remediation.policy import Rung

XID79 = Finding(
    "gpu_xid", Status.CRITICAL, "gpu.xid.79", "2", "fell off the bus", Recommendation.GPU_RESET
)
IN_SERVICE = NodeFacts()
MEDIC_DRAINED = NodeFacts(drained=True, reason="medic: gpu.xid.79 gpu2 fell off the bus")


def resilient(job_id: str = "7", budget: int = 2, **kw: object) -> JobFacts:
    return JobFacts(job_id, "RUNNING", budget, True, False, **kw)  # type: ignore[arg-type]


# --- 2: paused, drains and requeues go on ----------------------------------------------------


def test_paused_a_fault_still_drains_and_requeues_only_repairs_wait() -> None:
    facts = FaultFacts("n1", IN_SERVICE, (resilient(),), Rails(paused="paused by alice: x"))
    d = decide_fault([XID79], facts)
    assert d.drain
    assert d.requeued == ("7",)
    assert d.episode is EpisodeMove.OPEN
    assert d.state == PAUSED and "alice" in d.why


# --- 4: the drain cap ---------------------------------------------------------------------


def test_cap_reached_no_drain_no_requeue_owner_told_episode_waits_for_the_cap() -> None:
    cap = "drain cap reached in partition gpu: 2 of 10 nodes drained by Medic (cap 2)"
    facts = FaultFacts("n1", IN_SERVICE, (resilient(),), Rails(cap=cap))
    d = decide_fault([XID79], facts)
    assert not d.drain
    assert d.requeued == ()
    (job,) = d.jobs
    assert job.action == "cap" and cap in job.note and job.note.startswith("medic: n1 ")
    assert d.state == WAITING_CAP and d.why == cap


def test_cap_does_not_hold_back_a_node_medic_already_drained() -> None:
    facts = FaultFacts("n1", MEDIC_DRAINED, (resilient(),), Rails(cap="cap reached"))
    d = decide_fault([XID79], facts)
    assert not d.drain  # already drained: nothing to do in Slurm
    assert d.requeued == ("7",)  # the node is out: the job may leave


def test_cap_is_counted_from_medics_reasons_in_slurm() -> None:
    def node(name: str, reason: str = "", drained: bool = False) -> NodeInfo:
        flags = frozenset({"DRAIN"} if drained else set())
        return NodeInfo(name, "IDLE", flags, reason, partitions=("gpu",))

    nodes = [node(f"n{i}") for i in range(10)]
    nodes[1] = node("n1", "medic: gpu.xid.79 gpu0 x", drained=True)
    nodes[2] = node("n2", "maintenance", drained=True)  # an admin's: not Medic's to count
    assert cap_reason(nodes, "n5", 0.2, 1) == ""  # cap 2, Medic holds 1
    assert "cap 2" in cap_reason(nodes, "n5", 0.2, 1, pending={"n3"})
    assert cap_reason(nodes, "n1", 0.2, 1, pending={"n3"}) == ""  # n1 itself never counts


def test_cap_counts_medics_drains_by_its_records_where_the_store_holds_them() -> None:
    """An admin's "medic: x" drain is not Medic's where the store holds that node's drain
    records; a node it holds none of is judged by Slurm's text (its own store elsewhere)."""

    def node(name: str, reason: str) -> NodeInfo:
        return NodeInfo(name, "IDLE", frozenset({"DRAIN"}), reason, partitions=("gpu",))

    ours = "medic: gpu.xid.79 gpu0 x"
    nodes = [NodeInfo(f"n{i}", "IDLE", frozenset(), "", partitions=("gpu",)) for i in range(10)]
    nodes[1], nodes[2] = node("n1", ours + " : reboot issued"), node("n2", "medic: x")
    nodes[3] = node("n3", "medic: y")
    # Cap 3: by the text alone n1, n2 and n3 are Medic's and the cap is reached.
    assert "3 of 10 nodes drained by Medic (cap 3)" in cap_reason(nodes, "n5", 0.3, 1)
    records = {"n1": ours, "n2": None}  # n2: Medic drained it once, resumed it since
    assert cap_reason(nodes, "n5", 0.3, 1, records=records) == ""  # n1 (record), n3 (text)
    assert "cap 3" in cap_reason(nodes, "n5", 0.3, 1, records={"n1": ours, "n2": "medic: x"})


# --- 7: the restart budget counts Medic's requeues, once per fault ---------------------------


def test_prolog_refusals_are_not_charged_only_the_ledger_counts() -> None:
    job = resilient(budget=1, slurm_restarts=3)  # Slurm counted three refused launches
    d = decide_fault([XID79], FaultFacts("n1", IN_SERVICE, (job,)))
    (decision,) = d.jobs
    assert decision.action == "requeue"
    assert decision.ledger is not None and decision.ledger.restarts == 1


def test_one_fault_reported_as_two_findings_charges_once() -> None:
    xid48 = Finding("gpu_xid", Status.CRITICAL, "gpu.xid.48", "2", "DBE", Recommendation.GPU_RESET)
    dbe = Finding("gpu_ecc", Status.CRITICAL, "gpu.ecc.dbe", "2", "DBE", Recommendation.GPU_RESET)
    d = decide_fault([xid48, dbe], FaultFacts("n1", IN_SERVICE, (resilient(budget=1),)))
    (job,) = d.jobs
    assert job.action == "requeue"
    assert job.ledger is not None
    assert job.ledger.restarts == 1 and len(job.ledger.charged) == 1
    assert "budget spent" not in job.note
    # The same fault reported again in its episode: the job is already off the node, and
    # the ledger read back from the AdminComment says 1 of 1.
    assert Ledger.parse(f"{job.note} {job.ledger.text()}") == job.ledger


def test_a_note_that_is_not_a_requeue_keeps_the_ledger_in_the_admin_comment() -> None:
    """Found by the model: carry_out writes every note as the job's AdminComment, so a
    "budget spent" note without the ledger erased it and the next fault requeued again."""
    spent = Ledger(1, ("run0",))
    run1 = resilient(budget=1, ledger=spent, slurm_restarts=1)  # run 0 spent the budget
    d = decide_fault([XID79], FaultFacts("n1", IN_SERVICE, (run1,)))
    (job,) = d.jobs
    assert job.action == "budget_spent"
    assert Ledger.parse(job.note) == spent
    again = decide_fault(
        [XID79],
        FaultFacts(
            "n1",
            MEDIC_DRAINED,
            (resilient(budget=1, ledger=Ledger.parse(job.note), slurm_restarts=1),),
            open_episode=2,
        ),
    )
    assert again.requeued == ()


XID94 = Finding(
    "gpu_xid", Status.WARN, "gpu.xid.94", "1", "contained ECC error", Recommendation.RESTART_APP
)


@pytest.mark.parametrize("fault", [XID79, XID94], ids=["new-episode", "restart-app"])
def test_a_recurring_fault_is_charged_again(fault: Finding) -> None:
    """Found by the model: the same fault coming back on the same node (a new episode, or
    restart_app again) was keyed like the first one, so the job's next run was requeued for
    free past its budget. A charge is per run now: the requeued run is Slurm's run 1."""
    first = decide_fault([fault], FaultFacts("n0", IN_SERVICE, (resilient(budget=1),)))
    (job,) = first.jobs
    assert job.ledger is not None and job.ledger.restarts == 1
    ledger = Ledger.parse(f"{job.note} {job.ledger.text()}")
    back = resilient(budget=1, ledger=ledger, slurm_restarts=1)
    second = decide_fault([fault], FaultFacts("n0", IN_SERVICE, (back,)))
    assert second.requeued == ()  # its budget of 1 went to the first fault


# --- 8: a service fault never reaches a GPU or driver rung ------------------------------------


@pytest.mark.parametrize("status", [Status.CRITICAL, Status.WARN, Status.UNKNOWN])
def test_service_down_is_never_a_gpu_or_driver_rung(status: Status) -> None:
    munge = Finding("services", status, "service.down", "munge", "munged not running",
                    Recommendation.RESTART_SERVICE)  # fmt: skip
    d = decide_fault([munge], FaultFacts("n1", IN_SERVICE))
    assert d.rung not in (Rung.GPU_RESET, Rung.DRIVER_RELOAD)
    assert d.rung is None and d.state == NEEDS_HUMAN
    assert d.drain


# --- 9: XID 94 (RESTART_APP): requeue, no drain -------------------------------------------


def test_restart_app_requeues_the_resilient_job_without_a_drain() -> None:
    plain = JobFacts("8", "RUNNING", None, False, False)
    d = decide_fault([XID94], FaultFacts("n1", IN_SERVICE, (resilient(), plain)))
    assert not d.drain
    assert d.episode is EpisodeMove.NONE
    assert d.requeued == ("7",)
    assert [j.action for j in d.jobs] == ["requeue", "not_resilient"]


XID94_FOLLOW_UP = Finding(
    "gpu_xid", Status.WARN, "gpu.xid.94", "1", "contained ECC error",
    Recommendation.RESTART_APP, evidence={"follow_up": "gpu_reset_when_idle", "xid": 94},
)  # fmt: skip


def test_a_catalog_follow_up_goes_on_as_a_fault_of_its_own() -> None:
    """An entry naming a follow-up (none of the shipped ones does): the application restarts
    now; the node takes no new job and its GPU is reset once idle."""
    plain = JobFacts("8", "RUNNING", None, False, False)
    d = decide_fault([XID94_FOLLOW_UP], FaultFacts("n1", IN_SERVICE, (resilient(), plain)))
    assert d.requeued == ("7",)
    assert [j.action for j in d.jobs] == ["requeue", "not_resilient"]
    assert d.drain and d.episode is EpisodeMove.OPEN
    assert (d.state, d.rung, d.recommendation) == (
        WAITING_IDLE, Rung.GPU_RESET, Recommendation.GPU_RESET_WHEN_IDLE,
    )  # fmt: skip


@pytest.mark.parametrize("word", ["", "none", "restart_app"])
def test_a_follow_up_that_is_no_repair_leaves_the_node_in_service(word: str) -> None:
    finding = Finding("gpu_xid", Status.WARN, "gpu.xid.94", "1", "contained",
                      Recommendation.RESTART_APP, evidence={"follow_up": word})  # fmt: skip
    d = decide_fault([finding], FaultFacts("n1", IN_SERVICE, (resilient(),)))
    assert not d.drain and d.episode is EpisodeMove.NONE and d.requeued == ("7",)


# --- 12: a job pinned with -w is told ---------------------------------------------------------


def test_a_job_pinned_to_the_node_is_told_it_waits_for_it() -> None:
    pinned = JobFacts("9", "RUNNING", 2, True, True)
    d = decide_fault([XID79], FaultFacts("n1", IN_SERVICE, (pinned,)))
    (job,) = d.jobs
    assert "(-w)" in job.note and "n1" in job.note and "resubmit without" in job.note


# --- ownership: Medic resumes only its own drains -----------------------------------------


@pytest.mark.parametrize(
    "typed", ['"maintenance"', '"admin: reseat GPU 2"', "bios", "medic: x", '"medic: x"']
)
def test_medic_never_resumes_an_admins_drain_quoted_or_not(typed: str) -> None:
    stored = as_slurm_stores(typed)
    assert not stored.startswith('"')
    # The records were read and none holds it: not Medic's, whatever the text says.
    d = decide_resume(NodeFacts(drained=True, reason=stored, recorded=False))
    assert not d.resume and "not Medic's drain" in d.why
    # The records unreachable: no resume without a record, whatever the text says.
    d = decide_resume(NodeFacts(drained=True, reason=stored, recorded=None))
    assert not d.resume and "no resume without a record" in d.why
    # and a human's quoted "medic: ..." is refused before Slurm stores it as Medic's
    assert claims_medic_prefix(f'"medic: {typed}"')


def test_medic_resumes_its_own_drain_unless_a_ticket_or_another_episode_holds_it() -> None:
    ours = dataclasses.replace(MEDIC_DRAINED, recorded=True)
    assert decide_resume(ours).resume
    assert decide_resume(NodeFacts(down=True, reason=ours.reason, recorded=True)).resume
    assert not decide_resume(ours, rma_open=[4]).resume
    assert not decide_resume(ours, open_episode=3, resolving=2).resume
    assert decide_resume(ours, open_episode=3, resolving=3).resume
    assert not decide_resume(IN_SERVICE).resume
    assert not decide_resume(MEDIC_DRAINED).resume  # the text alone: no record


# --- hostile or odd input, failing dependencies ----------------------------------------------


@given(st.text())
def test_a_ledger_is_read_from_any_admin_comment_without_raising(comment: str) -> None:
    ledger = Ledger.parse(comment)
    assert 0 <= ledger.restarts <= 10_000
    assert Ledger.parse(f"{comment} {ledger.text()}") == ledger


@given(st.integers(0, 3), st.lists(st.text(min_size=1).filter(lambda k: "," not in k)))
def test_a_ledger_survives_its_own_text(restarts: int, keys: list[str]) -> None:
    keys = [k for k in keys if not any(c.isspace() or c == ";" for c in k)]
    ledger = Ledger(restarts, tuple(keys[-8:]))
    assert Ledger.parse(f"medic: requeued off n1; {ledger.text()}") == ledger


def test_slurm_unreadable_means_no_drain_and_no_requeue_the_episode_waits() -> None:
    """Slurm down at admission: Ladder.fault_facts gives an unknown node and a cap reason
    ("cannot read Slurm to apply the drain cap"); nothing is drained or requeued and the
    episode waits for the cap, which the ladder re-reads every tick."""
    cap = "cannot read Slurm to apply the drain cap: scontrol timed out after 15s"
    facts = FaultFacts("n1", NodeFacts(known=False), (resilient(),), Rails(cap=cap))
    d = decide_fault([XID79], facts)
    assert not d.drain
    assert d.requeued == ()
    assert d.state == WAITING_CAP and "cannot read Slurm" in d.why


# --- the gate: an RMA node never starts a job; the cap's fault is left in service ------------


def verdict_of(*findings: Finding) -> Verdict:
    return Verdict(worst(f.status for f in findings), tuple(findings), "healthd", 0.01)


def test_an_open_rma_ticket_refuses_a_job_even_with_every_check_clean() -> None:
    clean = verdict_of(Finding("gpu_count", Status.OK, "", "", "8 GPUs"))
    d = decide_launch(clean, HookSettings(), rma_open=[12])
    assert not d.allow and d.why == "RMA ticket 12 is open"
    assert decide_launch(clean, HookSettings()).allow


def test_a_fault_the_cap_keeps_in_service_lets_the_job_start() -> None:
    """Refusing would have Slurm drain the node ("Prolog error") past the cap."""
    sick = verdict_of(XID79)
    assert not decide_launch(sick, HookSettings()).allow
    d = decide_launch(sick, HookSettings(), cap_held="episode 3 waits for the drain cap")
    assert d.allow and d.status is Status.CRITICAL
    assert d.why == "fault left in service by the drain cap: episode 3 waits for the drain cap"
    assert not decide_launch(sick, HookSettings(), rma_open=[1], cap_held="x").allow


def test_a_spares_refusal_refuses_even_while_the_cap_keeps_a_fault_in_service() -> None:
    """CI once: the spare's open episode waited for the drain cap, and the cap's hold let
    the other job of the handed spare's reservation start. The refusal is about the
    allocation (the spare already drained by Medic for it), never the node's health."""
    refusal = Finding("spares", Status.CRITICAL, SPARE_REFUSAL, "job:9", "spare n5 is handed")
    for found in ((refusal,), (XID79, refusal)):
        d = decide_launch(verdict_of(*found), HookSettings(), cap_held="episode 3 waits")
        assert not d.allow and d.blocking == (refusal,), found
        assert d.why == "spare n5 is handed"
    assert decide_launch(verdict_of(XID79), HookSettings(), cap_held="episode 3 waits").allow


# --- an answer Slurm could not complete, given again -------------------------------------------


def test_a_handed_over_fault_keeps_the_first_answers_job_actions() -> None:
    """A sweep and the node's daemon report one fault: the first report's actions stand."""
    facts = FaultFacts("n1", MEDIC_DRAINED, (resilient(),), handed_over=4)
    d = decide_fault([XID79], facts)
    assert (d.episode, d.episode_id, d.requeued) == (EpisodeMove.JOIN, 4, ())


def test_answered_again_after_slurm_failed_the_job_leaves_a_handed_over_node() -> None:
    """slurmctld was down at the first answer (the jobs unreadable): the daemon's second
    answer requeues the job even though the episode was handed to a human meanwhile."""
    facts = FaultFacts("n1", MEDIC_DRAINED, (resilient(),), handed_over=4, answer_again=True)
    d = decide_fault([XID79], facts)
    assert (d.episode, d.episode_id, d.requeued) == (EpisodeMove.JOIN, 4, ("7",))


def test_findings_on_an_isolated_gpu_do_not_refuse_a_job() -> None:
    """The GPU left the node's GRES: no job can be given it, so its fault refuses none."""
    on5 = Finding("gpu_xid", Status.CRITICAL, "gpu.xid.95", "5", "XID 95 on GPU 5")
    unknown5 = Finding("gpu_ecc", Status.UNKNOWN, "gpu.ecc.unknown", "5", "no answer")
    sick = verdict_of(on5, unknown5)
    closed = HookSettings(on_unknown="closed")
    assert not decide_launch(sick, closed).allow
    d = decide_launch(sick, closed, isolated_gpus=(5,))
    assert d.allow and d.status is Status.OK and d.blocking == ()
    # another GPU's fault, a node-wide one, and an RMA ticket still refuse
    on3 = Finding("gpu_xid", Status.CRITICAL, "gpu.xid.95", "3", "XID 95 on GPU 3")
    node = Finding("gpu_count", Status.CRITICAL, "gpu.count.missing", "", "7 of 8 GPUs")
    for other in (on3, node):
        d = decide_launch(verdict_of(on5, other), closed, isolated_gpus=(5,))
        assert not d.allow and d.blocking == (other,)
    assert not decide_launch(verdict_of(on5), closed, isolated_gpus=(5,), rma_open=[7]).allow
    # a target that only looks like an index does not match
    odd = Finding("gpu_xid", Status.CRITICAL, "gpu.xid.95", "pci:05", "XID 95")
    assert not decide_launch(verdict_of(odd), closed, isolated_gpus=(5,)).allow
    # an UNKNOWN left over on another GPU with on_unknown = closed still refuses
    unknown3 = Finding("gpu_ecc", Status.UNKNOWN, "gpu.ecc.unknown", "3", "no answer")
    d = decide_launch(verdict_of(on5, unknown3), closed, isolated_gpus=(5,))
    assert not d.allow and d.status is Status.UNKNOWN

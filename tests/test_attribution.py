"""Attribution (issue 22): a fault belongs to a component, a job to the GPUs it holds.

Pure tests of the component model (medic_core.vocabulary.component_of), of reading a job's
GPUs from Slurm's `gres_detail` (medic_core.slurm.gpu_indices, in the exact format squeue
prints, and fuzzed), of the decision core's `jobs_hit` and `[remediation] max_restarts`,
and a hypothesis state machine: one 8-GPU node shared by several users' jobs on different
GPUs, random faults on random components carried out with the real `carry_out` against a
fake Slurm, with the invariants checked after every step.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cli.xid_table import DOC_PATH as ACTIONS_DOC
from cli.xid_table import generated_block, render_xid_actions
from medic_core.slurm import NodeInfo, gpu_indices, parse_jobs
from medic_core.status import Status
from medic_core.vocabulary import Component, ComponentKind, Finding, Recommendation
from remediation.actions import carry_out, job_fact
from remediation.decide import (
    FaultFacts,
    JobFacts,
    Ledger,
    NodeFacts,
    decide_fault,
    decide_reset_beside_jobs,
    jobs_hit,
)
from remediation.policy import Rung, first_rung
from tests.fakes import FakeSlurm

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def xid(n: int, gpu: str, status: Status, rec: Recommendation) -> Finding:
    return Finding("gpu_xid", status, f"gpu.xid.{n}", gpu, f"XID {n}", rec)


XID13 = xid(13, "5", Status.WARN, Recommendation.RESTART_APP)
XID94 = xid(94, "1", Status.WARN, Recommendation.RESTART_APP)
XID95 = xid(95, "1", Status.CRITICAL, Recommendation.GPU_RESET)
XID79 = xid(79, "1", Status.CRITICAL, Recommendation.REBOOT)
IB_DOWN = Finding("ib", Status.CRITICAL, "ib.port.down", "mlx5_0/1", "down", Recommendation.RECHECK)
MUNGE = Finding("services", Status.CRITICAL, "service.down", "munge", "down",
                Recommendation.RESTART_SERVICE)  # fmt: skip
LOW, HIGH = frozenset(range(4)), frozenset(range(4, 8))


def job(job_id: str, gpus: frozenset[int] | None, budget: int | None = 3, **kw: object) -> JobFacts:
    return JobFacts(job_id, "RUNNING", budget, True, False, gpus=gpus, **kw)  # type: ignore[arg-type]


TWO_USERS = (job("A", LOW), job("B", HIGH))


# --- the component a finding belongs to -------------------------------------------------------


def test_a_gpu_finding_names_its_gpu_with_uuid_serial_and_slot() -> None:
    ids = {"uuid": "GPU-8e1", "serial": "1650923", "pci_bus_id": "0000:18:00.0"}
    f = Finding(
        "gpu_ecc", Status.CRITICAL, "gpu.ecc.dbe", "3", "DBE", Recommendation.GPU_RESET, ids
    )
    c = f.component
    assert (c.kind, c.gpu_index, str(c)) == (ComponentKind.GPU, 3, "gpu:3")
    assert c.describe() == "GPU 3 (serial 1650923, GPU-8e1, slot 0000:18:00.0)"


@pytest.mark.parametrize(
    ("fault_class", "target", "kind", "text"),
    [
        ("ib.port.down", "mlx5_0/1", ComponentKind.HCA, "hca:mlx5_0/1"),
        ("job.hang", "job:42", ComponentKind.JOB, "job:42"),
        ("service.down", "munge", ComponentKind.HOST, "host"),
        ("gpu.xid.79", "pci:0000:18:00.0", ComponentKind.HOST, "host"),  # no index: every job
        ("gpu.xid.79", "８", ComponentKind.HOST, "host"),  # a full-width digit is no index
        ("nvswitch.fatal", "nvswitch:2", ComponentKind.NVSWITCH, "nvswitch:2"),
    ],
)
def test_every_finding_has_a_component(
    fault_class: str, target: str, kind: ComponentKind, text: str
) -> None:
    c = Finding("x", Status.CRITICAL, fault_class, target, "m").component
    assert (c.kind, str(c), c.gpu_index) == (kind, text, None)


# --- a job's GPUs, as Slurm prints them -------------------------------------------------------


@pytest.mark.parametrize(
    ("detail", "gpus"),
    [
        ("gpu:4(IDX:0-3)", {0, 1, 2, 3}),
        ("gpu:a100:2(IDX:1,3)", {1, 3}),
        ("gpu:h100:3(IDX:0-1,6)", {0, 1, 6}),
        ("gpu:2(IDX:4-5),mps:100(0/100,0/100)", {4, 5}),
        ("shard:2(0/4),gpu:1(IDX:7)", {7}),
        ("gpu:0(IDX:N/A)", set()),
        ("mps:100(0/100)", set()),
    ],
)
def test_gres_detail_gives_the_gpu_indices(detail: str, gpus: set[int]) -> None:
    assert gpu_indices(detail) == frozenset(gpus)


@pytest.mark.parametrize("detail", ["gpu:4", "gpu:4(IDX:x-3)", "gpu:4(IDX:3-1)", "gpu:1(IDX:5000)"])
def test_an_unreadable_gres_entry_is_not_known(detail: str) -> None:
    assert gpu_indices(detail) is None


@given(st.text(max_size=80))
def test_gres_detail_parsing_never_raises_and_stays_small(detail: str) -> None:
    gpus = gpu_indices(detail)
    assert gpus is None or all(0 <= i < 1024 for i in gpus)


def test_squeue_22_05_pairs_each_node_with_its_gres_entry() -> None:
    jobs = {j.job_id: j for j in parse_jobs((FIXTURES / "22.05" / "squeue.json").read_text())}
    assert jobs["2"].gpus_by_node == {"n3": frozenset({0, 1, 2, 3})}
    assert job_fact(jobs["2"], "n3").gpus == frozenset({0, 1, 2, 3})
    no_gres = [j for j in jobs.values() if not j.gpus_by_node]
    assert no_gres and all(job_fact(j, "n3").gpus is None for j in no_gres)


def test_a_multi_node_job_has_its_gpus_per_node() -> None:
    doc = json.loads((FIXTURES / "22.05" / "squeue.json").read_text())
    raw = next(j for j in doc["jobs"] if j["job_id"] == 2)
    raw["nodes"], raw["gres_detail"] = "n[3-4]", ["gpu:4(IDX:0-3)", "gpu:2(IDX:6-7)"]
    doc["jobs"] = [raw]
    [info] = parse_jobs(json.dumps(doc))
    assert info.gpus_by_node == {"n3": LOW, "n4": frozenset({6, 7})}
    raw["gres_detail"] = ["gpu:4(IDX:0-3)"]  # one entry for two nodes: cannot pair them
    [info] = parse_jobs(json.dumps(doc))
    assert info.gpus_by_node == {}


# --- which jobs a fault touches ----------------------------------------------------------------


def test_xid_13_on_gpu_5_requeues_only_the_job_on_gpus_4_to_7_and_drains_nothing() -> None:
    d = decide_fault([XID13], FaultFacts("n1", NodeFacts(), TWO_USERS))
    assert d.requeued == ("B",) and [j.job_id for j in d.jobs] == ["B"]
    assert not d.drain


def test_an_application_restart_reported_with_another_gpus_warning_restarts_only_its_job() -> None:
    """XID 13 on GPU 5 (the second job's) reported in one answer with a WARN on GPU 1 that
    asks for nothing (a thermal slowdown on the first job's GPU): only the job whose
    application must restart is requeued."""
    warm = Finding(
        "gpu_thermal", Status.WARN, "gpu.thermal.slowdown", "1", "hot", Recommendation.NONE
    )
    d = decide_fault([XID13, warm], FaultFacts("n1", NodeFacts(), TWO_USERS))
    assert d.requeued == ("B",) and not d.drain


def test_xid_94_on_gpu_1_requeues_only_the_job_on_gpus_0_to_3_and_keeps_the_node() -> None:
    d = decide_fault([XID94], FaultFacts("n1", NodeFacts(), TWO_USERS))
    assert d.requeued == ("A",) and not d.drain


def test_a_gpu_reset_fault_drains_and_requeues_only_that_gpus_jobs() -> None:
    """The others run to their end (DRAINING), unless isolation takes the GPU alone."""
    d = decide_fault([XID95], FaultFacts("n1", NodeFacts(), TWO_USERS))
    assert d.drain and d.requeued == ("A",) and d.rung is Rung.GPU_RESET


@pytest.mark.parametrize("fault", [XID79, IB_DOWN], ids=["xid79-reboot", "ib-fabric"])
def test_a_node_wide_repair_or_a_fabric_fault_requeues_every_job(fault: Finding) -> None:
    d = decide_fault([fault], FaultFacts("n1", NodeFacts(), TWO_USERS))
    assert d.drain and sorted(d.requeued) == ["A", "B"]


def test_a_job_whose_gpus_slurm_does_not_list_counts_as_holding_every_gpu() -> None:
    d = decide_fault([XID13], FaultFacts("n1", NodeFacts(), (*TWO_USERS, job("C", None))))
    assert d.requeued == ("B", "C")


def test_a_hang_touches_only_its_own_job() -> None:
    hang = Finding("job_progress", Status.WARN, "job.hang", "job:B", "stalled",
                   Recommendation.RESTART_APP)  # fmt: skip
    d = decide_fault([hang], FaultFacts("n1", NodeFacts(), (*TWO_USERS, job("C", None))))
    assert d.requeued == ("B",)


def test_two_findings_of_one_fault_touch_the_union_of_their_gpus() -> None:
    dbe = Finding("gpu_ecc", Status.CRITICAL, "gpu.ecc.dbe", "6", "DBE", Recommendation.GPU_RESET)
    d = decide_fault([XID95, dbe], FaultFacts("n1", NodeFacts(), TWO_USERS))
    assert sorted(d.requeued) == ["A", "B"]


# --- [remediation] max_restarts ----------------------------------------------------------------


def test_a_job_asking_more_than_max_restarts_gets_the_cap_and_is_told() -> None:
    greedy = job("A", LOW, budget=99, ledger=Ledger(2, ("run0", "run1")), slurm_restarts=2)
    d = decide_fault([XID94], FaultFacts("n1", NodeFacts(), (greedy,), max_restarts=2))
    [decision] = d.jobs
    assert decision.action == "budget_spent"
    assert "(2/2 (asked 99, capped by [remediation] max_restarts))" in decision.note
    fresh = job("A", LOW, budget=99)
    d = decide_fault([XID94], FaultFacts("n1", NodeFacts(), (fresh,), max_restarts=2))
    assert d.requeued == ("A",) and "restart 1/2 (asked 99" in d.jobs[0].note


def test_a_requeue_is_dated_when_slurm_took_it_before_the_job_is_made_eligible() -> None:
    """medic report's isolated_at is the requeue's record: the job's next prolog (its
    running_at) can come only after the job is made eligible, so the record's time must be
    taken before that, not once the whole answer is done (a restart in 0.9 s was missed)."""
    slurm = shared_node()
    slurm.start_job("j1", "n1", "medic:resilient=3", gpus=frozenset({5}))
    decision = decide_fault([XID13], FaultFacts("n1", NodeFacts(), (job("j1", HIGH),)))
    eligible_at: list[dt.datetime] = []
    asked = dt.datetime.now(dt.UTC)
    _, [action] = carry_out(
        slurm, "n1", decision, lambda job_id, _: eligible_at.append(dt.datetime.now(dt.UTC))
    )
    assert action.action == "requeued" and action.at is not None
    assert asked <= action.at <= eligible_at[0]
    # No requeue asked (the job is told only): no requeue time.
    told = decide_fault([XID13], FaultFacts("n1", NodeFacts(), (job("j1", HIGH, budget=None),)))
    _, [note] = carry_out(slurm, "n1", told)
    assert note.action != "requeued" and note.at is None


def test_max_restarts_is_a_setting_with_a_default() -> None:
    from medic_core.settings import RemediationSettings

    assert RemediationSettings().max_restarts == 20


# --- the XID table in docs/remediation.md ------------------------------------------------------


def test_the_xid_table_in_the_docs_matches_the_catalog_and_the_decision_core() -> None:
    assert generated_block(ACTIONS_DOC.read_text()) == render_xid_actions(), (
        "run `medic checks docs --write`"
    )


def test_the_xid_table_says_what_the_issue_asked() -> None:
    rows = {int(line.split("|")[1]): line for line in render_xid_actions().splitlines()[2:]}
    assert "requeues the jobs on that GPU, the others run on; the node stays in service" in rows[13]
    assert "the node stays in service" in rows[94]
    assert "requeues every job on the node" in rows[79] and "reboot" in rows[79]
    assert "event only" in rows[63]


# --- a model: one node, several users' jobs on different GPUs ---------------------------------


def shared_node() -> FakeSlurm:
    """n1 in Slurm, shared by jobs (tests.fakes.FakeSlurm keeps them, their GPUs, their admin
    comments and restart counts; every requeue and comment is recorded in `calls`)."""
    return FakeSlurm([NodeInfo("n1", "MIXED", frozenset(), partitions=("gpu",))])


COMPONENTS = [str(i) for i in range(8)] + ["pci:0000:18:00.0", "job:j1", "job:j3"]
FAULTS = [
    ("gpu.xid.13", Status.WARN, Recommendation.RESTART_APP),
    ("gpu.xid.94", Status.WARN, Recommendation.RESTART_APP),
    ("gpu.xid.95", Status.CRITICAL, Recommendation.GPU_RESET),
    ("gpu.xid.79", Status.CRITICAL, Recommendation.REBOOT),
    ("gpu.ecc.dbe", Status.CRITICAL, Recommendation.GPU_RESET),
    ("gpu.remap.failure", Status.CRITICAL, Recommendation.RMA),
    ("ib.port.down", Status.CRITICAL, Recommendation.RECHECK),
    ("service.down", Status.CRITICAL, Recommendation.RESTART_SERVICE),
]


class SharedNode(RuleBasedStateMachine):
    """Jobs of several users on one 8-GPU node; faults on GPUs, ports, jobs and the host."""

    @initialize(cap=st.none() | st.integers(0, 4))
    def start(self, cap: int | None) -> None:
        self.slurm = shared_node()
        self.budgets: dict[str, int | None] = {}  # the jobs' resilience tags
        self.cap = cap
        self.next_id = 1
        self.free = set(range(8))

    @rule(
        want=st.integers(0, 4),
        user=st.sampled_from(["alice", "bob", "carol"]),
        budget=st.none() | st.integers(0, 50),
        listed=st.booleans(),
    )
    def job_starts(self, want: int, user: str, budget: int | None, listed: bool) -> None:
        """A job takes `want` free GPUs (Slurm lists them, or not: then it may hold any)."""
        take = frozenset(sorted(self.free)[:want])
        self.free -= take
        job_id = f"j{self.next_id}"
        self.next_id += 1
        self.slurm.start_job(job_id, "n1", gpus=take if listed else None, user=user)
        self.budgets[job_id] = budget

    @rule(pick=st.integers(0, 50))
    def job_ends(self, pick: int) -> None:
        running = [j for j in self.slurm.jobs_.values() if j.state == "RUNNING"]
        if running:
            gone = running[pick % len(running)]
            self.slurm.end_job(gone.job_id)
            self.free |= gone.gpus or frozenset()

    @rule(pick=st.integers(0, 50))
    def requeued_job_runs_again(self, pick: int) -> None:
        """A requeued job starts again elsewhere: it leaves this node's model."""
        waiting = [j for j in self.slurm.jobs_.values() if j.state == "PENDING"]
        if waiting:
            back = waiting[pick % len(waiting)]
            back.state, back.node = "RUNNING", "n2"
            self.free |= back.gpus or frozenset()

    @rule(fault=st.sampled_from(FAULTS), where=st.sampled_from(COMPONENTS))
    def fault(self, fault: tuple[str, Status, Recommendation], where: str) -> None:
        target = where
        fault_class, status, rec = fault
        if not fault_class.startswith("gpu.") and target[0].isdigit():
            target = "mlx5_0/1" if fault_class.startswith("ib.") else "munge"
        finding = Finding("check", status, fault_class, target, "fault", rec)
        jobs = tuple(
            JobFacts(
                j.job_id,
                j.state,
                self.budgets[j.job_id],
                True,
                False,
                Ledger.parse(j.admin_comment),
                j.restart_count,
                gpus=j.gpus,
            )
            for j in self.slurm.jobs_.values()
            if j.state == "RUNNING" and j.node == "n1"
        )
        before = {
            j.job_id: (self.slurm.jobs_[j.job_id].admin_comment, self.requeues(j.job_id))
            for j in jobs
        }
        node = self.slurm.by_name["n1"]
        slurm = NodeFacts(True, node.drain, False, node.reason)
        facts = FaultFacts("n1", slurm, jobs, max_restarts=self.cap)
        decision = decide_fault([finding], facts)
        mark = len(self.slurm.calls)
        carry_out(self.slurm, "n1", decision)
        made = self.slurm.calls[mark:]

        component = finding.component
        rung = first_rung(fault_class, rec.value)
        node_wide = rung in (Rung.DRIVER_RELOAD, Rung.REBOOT)
        touched = {j.job_id for j in jobs_hit(component, jobs, node_wide)}
        # Only the jobs the fault touches are requeued or told anything.
        assert {c[1] for c in made if c[0] in ("requeue", "set_admin_comment")} <= touched
        for j in jobs:
            if j.job_id not in touched:
                assert (
                    self.slurm.jobs_[j.job_id].admin_comment,
                    self.requeues(j.job_id),
                ) == before[j.job_id]
        # A GPU's fault never touches a job Slurm says holds other GPUs; a job's fault, only it.
        for job_id in touched:
            held = self.slurm.jobs_[job_id].gpus
            if component.kind is ComponentKind.JOB:
                assert job_id == component.name
            elif component.gpu_index is not None and held is not None and not node_wide:
                assert component.gpu_index in held
        # Restarting the application never takes the node out of service.
        if rec is Recommendation.RESTART_APP and status is not Status.CRITICAL:
            assert not decision.drain

    def requeues(self, job_id: str) -> int:
        return len(self.slurm.called("requeue", job_id))

    @invariant()
    def budgets_hold(self) -> None:
        for j in self.slurm.jobs_.values():
            budget, requeues = self.budgets[j.job_id], self.requeues(j.job_id)
            if budget is None:
                assert requeues == 0, "a job that is not resilient was requeued"
                continue
            limit = budget if self.cap is None else min(budget, self.cap)
            assert requeues <= limit, f"{j.job_id}: {requeues} requeues, budget {limit}"
            assert Ledger.parse(j.admin_comment).restarts == requeues


SharedNode.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_shared_node_model = SharedNode.TestCase


def test_component_describes_an_hca_with_its_guid() -> None:
    c = Component(ComponentKind.HCA, "mlx5_0/1", guid="b8ce:f603:00a1:2f3c")
    assert c.describe() == "HCA port mlx5_0/1 (GUID b8ce:f603:00a1:2f3c)"


# --- what a memory XID leaves behind is measured at once ---------------------------------------


@pytest.mark.parametrize(("number", "memory"), [(94, True), (48, True), (13, False), (79, False)])
def test_a_memory_xid_wakes_the_checks_that_measure_its_aftermath(
    number: int, memory: bool
) -> None:
    """XID 94 asks only for an application restart; the row remap it leaves pending is read
    at once by gpu_remapped_rows (whose finding starts the GPU's reset), not 300 s later."""
    from healthd.kmsg_watch import checks_for_line
    from healthd.xid_listener import EventKind, GpuEvent, checks_for

    line = f"3,1201,5021001,-;NVRM: Xid (PCI:0000:18:00): {number}, pid=1234, name=python, x"
    woken = set(checks_for_line(line)) | set(checks_for(GpuEvent(EventKind.XID, 1, 0.0, number)))
    assert "gpu_xid" in woken
    assert ({"gpu_remapped_rows", "gpu_retired_pages"} <= woken) is memory


def test_an_xid_94_answered_with_its_pending_remap_still_restarts_the_application() -> None:
    """One answer holds both findings: the remap's reset waits for idle, the XID's job is
    requeued now (named by its own fault), the other GPU's job runs on."""
    remap = Finding("gpu_remapped_rows", Status.WARN, "gpu.remap.pending", "1", "pending",
                    Recommendation.GPU_RESET_WHEN_IDLE)  # fmt: skip
    d = decide_fault([XID94, remap], FaultFacts("n1", NodeFacts(), TWO_USERS))
    assert d.drain and d.recommendation is Recommendation.GPU_RESET_WHEN_IDLE
    assert d.requeued == ("A",) and "(gpu.xid.94)" in d.jobs[0].note


# --- a GPU's reset beside the jobs on the node's other GPUs --------------------------------------

JOB_STATES = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "PENDING", "COMPLETED")


@settings(max_examples=300, deadline=None)
@given(
    gpu=st.integers(0, 7),
    jobs=st.lists(
        st.tuples(
            st.sampled_from(JOB_STATES),
            st.none() | st.frozensets(st.integers(0, 7), min_size=1, max_size=8),
        ),
        max_size=5,
    ),
)
def test_a_gpu_reset_goes_beside_jobs_only_when_none_may_hold_that_gpu(
    gpu: int, jobs: list[tuple[str, frozenset[int] | None]]
) -> None:
    facts = [
        JobFacts(str(i), state, None, True, False, gpus=gpus)
        for i, (state, gpus) in enumerate(jobs)
    ]
    # A job whose processes may still be on the GPU: running, ending, or stopped on it.
    may_hold = any(
        state not in ("PENDING", "COMPLETED") and (gpus is None or gpu in gpus)
        for state, gpus in jobs
    )
    why = decide_reset_beside_jobs(gpu, facts, enabled=True)
    assert (why == "") == (not may_hold), why
    # Off, not a GPU's fault, Slurm unread, or a whole-node re-qualification: always waits.
    assert decide_reset_beside_jobs(gpu, facts, enabled=False)
    assert decide_reset_beside_jobs(None, facts, enabled=True)
    assert decide_reset_beside_jobs(gpu, None, enabled=True)
    assert decide_reset_beside_jobs(gpu, facts, enabled=True, whole_node_checks=("deep_dcgm",))

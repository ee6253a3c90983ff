"""Burn-in (issue 14.5) as sequences on the ladder's unit world (tests/test_ladder_unit.py):
the real Ladder and BurnInRunner on a real SQLite store, a fake Slurm, fake nodes whose deep
checks pass or fail, a fake clock and named crash points. Each test is one sequence: a new
node, a daemon crash mid-run, an admin's drain, a failure handed to the ladder, a reboot rung,
an RMA closed, burn-in switched off, a whole fleet new at once against the drain cap."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from medic_core.drain_reason import is_burn_in_reason
from medic_core.settings import BurnInSettings
from medic_core.status import Status
from medic_core.vocabulary import Finding, Recommendation
from remediation import burn_in as bi
from remediation import burn_in_runner
from remediation import episodes as ep
from remediation.burn_in_runner import SLURM_RETRY, BurnInRunner, read_record
from remediation.decide import NodeFacts
from remediation.ladder import REQUALIFY_RETRY, Ladder
from remediation.policy import Rung
from tests.test_ladder_unit import (
    NODES,
    XID_79,
    Crash,
    FakeNode,
    World,
    in_service,
    template_db,  # noqa: F401  (the fixture the world copies)
    world,  # noqa: F401
)

DEEP = "deep_dcgm"
DIAG = Finding("deep_dcgm", Status.CRITICAL, "gpu.dcgm.diag", "0", "memory: 4 faulty elements")


class BurnNode(FakeNode):
    """A node whose deep checks (asked by name) find `deep` when `deep_bad`."""

    deep_bad = False
    asked: list[tuple[str, ...]]

    def verify(self, extra_checks: Sequence[str]) -> list[Finding]:
        self.asked.append(tuple(extra_checks))
        found = super().verify(extra_checks)
        if DEEP in extra_checks and self.deep_bad:
            found.append(DIAG)
        return found


class BurnWorld:
    """The ladder world with each daemon's burn-in runner beside its ladder."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.settings = BurnInSettings()
        for name in NODES:
            node = BurnNode(name, w)
            node.asked = []
            w.nodes[name] = node
        self.runners: dict[str, BurnInRunner] = {}
        original = w.restart

        def restart(node: str) -> Ladder:
            ladder = original(node)
            ladder.burn_in = lambda: self.settings
            self.runners[node] = BurnInRunner(
                ladder, lambda: self.settings, clock=w.clock.monotonic, now=w.clock.now
            )
            return ladder

        w.restart = restart  # type: ignore[method-assign]

    def node(self, name: str) -> BurnNode:
        node = self.w.nodes[name]
        assert isinstance(node, BurnNode)
        return node

    def configure(self, **values: Any) -> None:
        self.settings = dataclasses.replace(self.settings, **values)

    def burn(self, node: str) -> bi.BurnInDecision | None:
        """One tick of the daemon's burn-in; a crash restarts the daemon."""
        self.w.daemon(node)
        try:
            return self.runners[node].tick()
        except Crash:
            self.w.restart(node)
            return None

    def record(self, node: str) -> bi.Record | None:
        return read_record(self.w.store, node)


@pytest.fixture
def bw(world: World) -> Iterator[BurnWorld]:  # noqa: F811
    yield BurnWorld(world)


def deep_runs(node: BurnNode) -> int:
    return sum(1 for asked in node.asked if DEEP in asked)


# --- the pure decision --------------------------------------------------------------------------

IN_SERVICE = NodeFacts()
BURN_DRAINED = NodeFacts(drained=True, reason=bi.drain_reason(bi.NEW_NODE, (DEEP,)), recorded=True)
ADMIN = NodeFacts(drained=True, reason="admin: cabling")


@pytest.mark.parametrize(
    ("record", "slurm", "extra", "step"),
    [
        (None, IN_SERVICE, {}, bi.Step.DRAIN),
        (None, IN_SERVICE, {"checks": ()}, bi.Step.NOTHING),
        (None, BURN_DRAINED, {"checks": ()}, bi.Step.WAIVE),  # switched off while it waited
        (None, ADMIN, {"checks": ()}, bi.Step.NOTHING),
        (None, IN_SERVICE, {"passed_before": True}, bi.Step.ADOPT),
        (None, NodeFacts(known=False), {}, bi.Step.WAIT),
        (None, BURN_DRAINED, {"jobs_running": True}, bi.Step.WAIT),
        (None, BURN_DRAINED, {"open_episode": 4}, bi.Step.WAIT),
        (None, BURN_DRAINED, {}, bi.Step.RUN),
        (None, ADMIN, {}, bi.Step.RUN),  # someone else's drain: burnt in, never resumed
        (bi.Record(bi.Phase.RUNNING, attempts=2), BURN_DRAINED, {}, bi.Step.RUN),
        (bi.Record(bi.Phase.RUNNING, attempts=3), BURN_DRAINED, {}, bi.Step.FAIL),
        (bi.Record(bi.Phase.RUNNING), IN_SERVICE, {}, bi.Step.DRAIN),  # resumed by hand
        (bi.Record(bi.Phase.RUNNING), BURN_DRAINED, {"checks": ()}, bi.Step.WAIVE),
        (bi.Record(bi.Phase.PASSED), BURN_DRAINED, {}, bi.Step.RESUME),
        (bi.Record(bi.Phase.PASSED), BURN_DRAINED, {"rma_open": (3,)}, bi.Step.NOTHING),
        (bi.Record(bi.Phase.PASSED), BURN_DRAINED, {"open_episode": 4}, bi.Step.NOTHING),
        (bi.Record(bi.Phase.PASSED), ADMIN, {}, bi.Step.NOTHING),
        (bi.Record(bi.Phase.PASSED), IN_SERVICE, {}, bi.Step.NOTHING),
        (bi.Record(bi.Phase.WAIVED), BURN_DRAINED, {}, bi.Step.RESUME),
        (bi.Record(bi.Phase.FAILED), BURN_DRAINED, {}, bi.Step.HAND),
        (bi.Record(bi.Phase.FAILED, episode=7), BURN_DRAINED, {}, bi.Step.NOTHING),
    ],
)
def test_decide_burn_in(
    record: bi.Record | None, slurm: NodeFacts, extra: dict[str, Any], step: bi.Step
) -> None:
    facts = bi.BurnInFacts(record=record, checks=(DEEP,), slurm=slurm)
    assert bi.decide_burn_in(dataclasses.replace(facts, **extra)).step is step


@pytest.mark.parametrize(
    "evidence",
    [{}, {"phase": "bogus"}, {"phase": None}, {"phase": ["passed"]}, {"phase": 1}],
)
def test_a_record_that_does_not_read_is_never_checked(evidence: dict[str, Any]) -> None:
    assert bi.Record.from_evidence(evidence) is None


def test_a_hostile_record_reads_safely() -> None:
    record = bi.Record.from_evidence(
        {"phase": "failed", "checks": "deep_dcgm", "attempts": -3, "episode": True}
    )
    assert record == bi.Record(bi.Phase.FAILED, bi.NEW_NODE, (), 0, None)


def test_a_deep_failure_starts_at_the_failure_rung_not_a_human() -> None:
    ok = Finding("gpu_count", Status.OK, "", "", "8 GPUs")
    xid = Finding("gpu_xid", Status.CRITICAL, "gpu.xid.48", "1", "DBE", Recommendation.GPU_RESET)
    out = bi.for_ladder([ok, DIAG, xid], "reboot")
    assert [f.recommendation for f in out] == [Recommendation.REBOOT, Recommendation.GPU_RESET]
    assert bi.for_ladder([DIAG], "none")[0].recommendation is Recommendation.DRAIN


def test_the_drain_reason_is_medics_burn_in() -> None:
    reason = bi.drain_reason(bi.NEW_NODE, (DEEP,))
    assert reason == "medic: burn-in node new_node: deep_dcgm"
    assert is_burn_in_reason(reason)
    assert not is_burn_in_reason("medic: gpu.xid.79 gpu2 off the bus")
    assert not is_burn_in_reason("admin: burn-in node")


# --- sequences ----------------------------------------------------------------------------------


def test_a_new_node_is_drained_burnt_in_and_resumed(bw: BurnWorld) -> None:
    w, n1 = bw.w, bw.node("n1")
    decision = bw.burn("n1")
    assert decision is not None and decision.step is bi.Step.RUN
    drains = w.slurm.called("drain", "n1")
    assert len(drains) == 1 and drains[0][2] == "medic: burn-in node new_node: deep_dcgm"
    assert deep_runs(n1) == 1 and in_service(w, "n1")
    assert len(w.slurm.called("resume", "n1")) == 1
    record = bw.record("n1")
    assert record is not None and record.phase is bi.Phase.PASSED and record.checks == (DEEP,)
    for _ in range(5):  # passed: never again, whatever the daemon does
        w.restart("n1")
        bw.burn("n1")
    assert deep_runs(n1) == 1 and len(w.slurm.called("drain", "n1")) == 1


def test_a_job_running_on_a_new_node_finishes_first(bw: BurnWorld) -> None:
    w, n1 = bw.w, bw.node("n1")
    w.slurm.start_job("101", "n1")
    decision = bw.burn("n1")
    assert decision is not None and decision.step is bi.Step.WAIT
    assert w.slurm.by_name["n1"].drain and deep_runs(n1) == 0  # DRAINING: nothing new starts
    w.slurm.end_job("101")
    bw.burn("n1")
    assert deep_runs(n1) == 1 and in_service(w, "n1")


def test_a_crash_mid_run_runs_it_again_then_never_after_the_pass(bw: BurnWorld) -> None:
    w, n1 = bw.w, bw.node("n1")
    w.crasher.armed = "verifying"
    assert bw.burn("n1") is None and w.crasher.fired == ["verifying"]
    record = bw.record("n1")
    assert record is not None and record.phase is bi.Phase.RUNNING and record.attempts == 1
    assert not in_service(w, "n1")
    bw.burn("n1")  # the restarted daemon runs it again
    record = bw.record("n1")
    assert record is not None and record.phase is bi.Phase.PASSED and record.attempts == 2
    assert in_service(w, "n1") and len(w.slurm.called("resume", "n1")) == 1
    w.restart("n1")
    bw.burn("n1")
    assert len(n1.asked) == 2  # the crashed run and the passing one


def test_a_crash_between_the_pass_and_the_resume_only_resumes(bw: BurnWorld) -> None:
    w, n1 = bw.w, bw.node("n1")
    w.slurm.fail("resume")  # Slurm refuses the resume once: the pass is already recorded
    bw.burn("n1")
    assert not in_service(w, "n1") and bw.record("n1").phase is bi.Phase.PASSED  # type: ignore[union-attr]
    w.clock.advance(SLURM_RETRY)
    w.restart("n1")
    bw.burn("n1")
    assert in_service(w, "n1") and deep_runs(n1) == 1


def test_a_daemon_that_dies_in_every_run_counts_it_failed(bw: BurnWorld) -> None:
    w = bw.w
    for attempt in range(3):
        w.crasher.armed = "verifying"
        bw.burn("n1")
        assert w.crasher.fired == ["verifying"] * (attempt + 1)
    bw.burn("n1")
    record = bw.record("n1")
    assert record is not None and record.phase is bi.Phase.FAILED and record.episode is not None
    episode = w.last("n1")
    assert episode.fault_class == "burn_in.interrupted" and episode.rung == int(Rung.REBOOT)
    assert not in_service(w, "n1")


def test_an_admin_drain_after_the_pass_is_never_resumed(bw: BurnWorld) -> None:
    w = bw.w
    bw.burn("n1")
    assert in_service(w, "n1")
    w.slurm.admin_drain("n1", "admin: cabling")
    for _ in range(5):
        w.restart("n1")
        bw.burn("n1")
        w.tick("n1")
    assert w.slurm.by_name["n1"].reason == "admin: cabling"
    assert len(w.slurm.called("resume", "n1")) == 1


def test_an_admin_drain_during_the_wait_is_kept_after_the_pass(bw: BurnWorld) -> None:
    w, n1 = bw.w, bw.node("n1")
    w.slurm.start_job("101", "n1")
    bw.burn("n1")  # drained by Medic, waits for the job
    w.slurm.admin_drain("n1", "admin: firmware update")
    w.slurm.end_job("101")
    bw.burn("n1")
    assert deep_runs(n1) == 1 and bw.record("n1").phase is bi.Phase.PASSED  # type: ignore[union-attr]
    assert w.slurm.by_name["n1"].reason == "admin: firmware update"
    assert not w.slurm.called("resume")


def test_a_failure_goes_to_the_ladder_and_a_reboot_that_cures_it_returns_the_node(
    bw: BurnWorld,
) -> None:
    w, n1 = bw.w, bw.node("n1")
    n1.deep_bad = True
    bw.burn("n1")
    record = bw.record("n1")
    assert record is not None and record.phase is bi.Phase.FAILED and record.episode is not None
    episode = w.last("n1")
    assert episode.id == record.episode and episode.rung == int(Rung.REBOOT)
    assert is_burn_in_reason(w.slurm.by_name["n1"].reason) and not in_service(w, "n1")
    n1.deep_bad = False  # the reboot cures it
    episode = w.run("n1")
    assert episode.state == ep.RESOLVED and n1.reboots == 1
    assert DEEP in n1.asked[-1]  # the ladder's verification ran the burn-in's checks
    record = bw.record("n1")
    assert record is not None and record.phase is bi.Phase.PASSED
    assert in_service(w, "n1") and len(w.slurm.called("resume", "n1")) == 1
    bw.burn("n1")
    assert deep_runs(n1) == 2  # the failed run and the ladder's verification


def test_a_failure_no_rung_cures_ends_in_an_rma_and_the_node_stays_out(bw: BurnWorld) -> None:
    w, n1 = bw.w, bw.node("n1")
    n1.deep_bad = True
    bw.burn("n1")
    episode = w.run("n1")
    assert episode.state == ep.RMA and not in_service(w, "n1")
    bw.burn("n1")
    assert not in_service(w, "n1") and not w.slurm.called("resume")


def test_failure_rung_none_stops_at_a_human(bw: BurnWorld) -> None:
    w = bw.w
    bw.configure(failure_rung="none")
    bw.node("n1").deep_bad = True
    bw.burn("n1")
    assert w.last("n1").state == ep.NEEDS_HUMAN and not in_service(w, "n1")


def test_a_reboot_rung_runs_the_after_reboot_checks(bw: BurnWorld) -> None:
    w, n2 = bw.w, bw.node("n2")
    bw.burn("n2")  # burnt in, in service
    w.fault("n2", XID_79)
    n2.deep_bad = True  # the reboot leaves a bad memory element the deep tier finds
    w.crasher.armed = ""
    episode = w.run("n2")
    assert episode.state == ep.RMA and not in_service(w, "n2")
    assert n2.reboots == 1 and all(DEEP in asked for asked in n2.asked[1:])


def test_a_reboot_rung_that_passes_records_after_reboot(bw: BurnWorld) -> None:
    w, n2 = bw.w, bw.node("n2")
    bw.burn("n2")
    w.fault("n2", XID_79)
    episode = w.run("n2")
    assert episode.state == ep.RESOLVED and DEEP in n2.asked[-1]
    record = bw.record("n2")
    assert record is not None and record.phase is bi.Phase.PASSED
    assert record.reason == bi.AFTER_REBOOT


def test_no_reboot_no_after_reboot_checks(bw: BurnWorld) -> None:
    w, n2 = bw.w, bw.node("n2")
    bw.burn("n2")
    xid = Finding("gpu_xid", Status.CRITICAL, "gpu.xid.95", "3", "XID 95", Recommendation.GPU_RESET)
    w.fault("n2", xid)
    assert w.run("n2").state == ep.RESOLVED
    assert all(DEEP not in asked for asked in n2.asked[1:])


def test_an_rma_closed_requalifies_with_the_after_rma_checks(bw: BurnWorld) -> None:
    w, n3 = bw.w, bw.node("n3")
    bw.burn("n3")
    remap = Finding("gpu_remap", Status.CRITICAL, "gpu.remap.failure", "1", "r", Recommendation.RMA)
    w.fault("n3", remap)
    episode = w.tick("n3")
    assert episode is not None and episode.state == ep.RMA and episode.ticket_id is not None
    w.close_ticket(episode.ticket_id)
    n3.findings = []  # the part is replaced: the launch and periodic tiers are clean
    n3.deep_bad = True  # ...but the new board fails its burn-in: the node stays out
    w.tick("n3")
    assert DEEP in n3.asked[-1] and not in_service(w, "n3")
    n3.deep_bad = False
    w.clock.advance(REQUALIFY_RETRY)
    w.tick("n3")
    assert in_service(w, "n3")
    record = bw.record("n3")
    assert record is not None and record.phase is bi.Phase.PASSED
    assert record.reason == bi.AFTER_RMA


def test_config_off_drains_nothing_and_asks_for_nothing(bw: BurnWorld) -> None:
    w, n1 = bw.w, bw.node("n1")
    bw.configure(new_node=(), after_reboot=(), after_rma=())
    assert bw.burn("n1").step is bi.Step.NOTHING  # type: ignore[union-attr]
    assert in_service(w, "n1") and not w.slurm.called("drain") and bw.record("n1") is None
    assert not w.slurm.calls  # off: Slurm is not even asked
    w.fault("n1", XID_79)
    assert w.run("n1").state == ep.RESOLVED and all(DEEP not in a for a in n1.asked)


def test_switching_new_node_off_while_a_node_waits_waives_and_resumes_it(bw: BurnWorld) -> None:
    w, n1 = bw.w, bw.node("n1")
    w.slurm.start_job("101", "n1")
    bw.burn("n1")
    assert not in_service(w, "n1")
    bw.configure(new_node=())
    bw.burn("n1")
    record = bw.record("n1")
    assert record is not None and record.phase is bi.Phase.WAIVED
    assert in_service(w, "n1") and deep_runs(n1) == 0


def test_a_node_with_every_check_passed_before_is_adopted_not_drained(bw: BurnWorld) -> None:
    from medic_core.store.models import ConditionUpdate

    w = bw.w
    w.store.set_condition("n1", ConditionUpdate(DEEP, Status.OK, "0"), w.clock.now())
    assert bw.burn("n1").step is bi.Step.ADOPT  # type: ignore[union-attr]
    assert not w.slurm.called("drain") and bw.record("n1").phase is bi.Phase.PASSED  # type: ignore[union-attr]


def test_slurm_unreachable_waits_without_writing(bw: BurnWorld) -> None:
    w = bw.w
    w.slurm.unreachable = True
    assert bw.burn("n1") is None and bw.record("n1") is None
    w.slurm.unreachable = False
    assert bw.burn("n1") is None  # waits SLURM_RETRY before asking again
    w.clock.advance(SLURM_RETRY)
    bw.burn("n1")
    assert in_service(w, "n1") and bw.record("n1").phase is bi.Phase.PASSED  # type: ignore[union-attr]


def test_a_whole_fleet_new_at_once_is_drained_past_the_cap_and_faults_still_drain(
    bw: BurnWorld,
) -> None:
    """Five new nodes, a cap of one: burn-in drains are not held back by the cap and do not
    count in it, so a fault on a node that passed still drains while the rest wait."""
    w = bw.w
    for name in NODES:
        w.slurm.start_job(f"j{name}", name)  # busy: each waits, drained, for its job
        bw.burn(name)
    assert all(w.slurm.by_name[n].drain for n in NODES)
    w.slurm.end_job("jn1")
    bw.burn("n1")
    assert in_service(w, "n1")
    admission = w.fault("n1", XID_79)
    assert admission.drain, admission.why
    assert not in_service(w, "n1")


def test_a_node_that_fails_burn_in_in_a_fleet_of_new_nodes_is_handed_over(
    bw: BurnWorld,
) -> None:
    w = bw.w
    for name in NODES:
        bw.node(name).deep_bad = name in ("n1", "n2")
        bw.burn(name)
    for name in ("n1", "n2"):
        record = bw.record(name)
        assert record is not None and record.episode is not None, name
        assert w.last(name).state == ep.WAITING_IDLE and not in_service(w, name)
    assert all(in_service(w, n) for n in ("n3", "n4", "n5"))


def test_the_lab_config_and_defaults(tmp_path: Path) -> None:
    from medic_core.config import ConfigError, load_config

    assert BurnInSettings().new_node == (DEEP,) and BurnInSettings().failure_rung == "reboot"
    conf = tmp_path / "medic.toml"
    conf.write_text('[remediation.burn_in]\nnew_node = []\nfailure_rung = "rma"\n')
    settings = BurnInSettings.from_config(load_config(conf))
    assert settings.new_node == () and settings.failure_rung == "rma"
    conf.write_text('[remediation.burn_in]\nfailure_rung = "driver"\n')
    with pytest.raises(ConfigError, match="failure_rung"):
        BurnInSettings.from_config(load_config(conf))
    conf.write_text('[remediation.burn_in]\nnew_node = [" deep_dcgm"]\n')
    with pytest.raises(ConfigError, match="new_node"):
        BurnInSettings.from_config(load_config(conf))
    assert burn_in_runner.bi is bi


def test_a_failure_whose_hand_over_was_lost_is_handed_again_and_drained(bw: BurnWorld) -> None:
    """The store refused the episode when the burn-in failed (the record has no episode) and a
    human put the node back meanwhile: the next tick hands it over again and drains it."""
    w = bw.w
    record = bi.Record(bi.Phase.FAILED, bi.NEW_NODE, (DEEP,), 1)
    burn_in_runner.write_record(w.store, "n1", record, "failed", w.clock.now())
    assert bw.burn("n1").step is bi.Step.HAND  # type: ignore[union-attr]
    after = bw.record("n1")
    assert after is not None and after.episode == w.last("n1").id
    assert w.slurm.by_name["n1"].drain and not in_service(w, "n1")
    assert w.slurm.by_name["n1"].reason.startswith("medic: burn_in.new_node")
    assert bw.burn("n1").step is bi.Step.NOTHING  # type: ignore[union-attr]


def test_settled_it_asks_slurm_nothing_more_until_a_reload(bw: BurnWorld) -> None:
    """Ticked every 2 s on every node: once there is nothing to do, no Slurm call per tick
    (a fleet's daemons would load slurmctld); a reload (new settings) looks again."""
    w = bw.w
    bw.burn("n1")
    assert bw.burn("n1").step is bi.Step.NOTHING  # type: ignore[union-attr]
    calls = len(w.slurm.calls)
    for _ in range(5):
        assert bw.burn("n1") is None
    assert len(w.slurm.calls) == calls
    bw.configure(max_attempts=4)  # a reload
    assert bw.burn("n1").step is bi.Step.NOTHING  # type: ignore[union-attr]
    assert len(w.slurm.calls) == calls + 1


def test_the_start_up_drain_drains_only(bw: BurnWorld) -> None:
    """Before READY (and so before slurmd starts): drained, no check run; the first tick runs
    the checks. Nothing to drain (passed, off, or Slurm down): nothing happens."""
    w, n1 = bw.w, bw.node("n1")
    w.daemon("n1")
    assert bw.runners["n1"].drain_first()
    assert w.slurm.by_name["n1"].drain and deep_runs(n1) == 0
    assert bw.record("n1") == bi.Record(bi.Phase.RUNNING, bi.NEW_NODE, (DEEP,), 0)
    assert not bw.runners["n1"].drain_first()  # already Medic's drain
    bw.burn("n1")
    assert in_service(w, "n1") and deep_runs(n1) == 1
    w.restart("n1")
    assert not bw.runners["n1"].drain_first() and in_service(w, "n1")
    w.daemon("n2")
    w.slurm.unreachable = True
    assert not bw.runners["n2"].drain_first()

"""The ladder's state changes (remediation.step.decide_step): an example for each transition,
hypothesis for the invariants over any episode and facts, a run of failures climbed rung by
rung to RMA, the module's purity, and the real ladder (tests/test_ladder_unit.World) on the
one path the decision core changed: a re-check held by a pause or the cap goes on verifying
instead of failing every tick."""

from __future__ import annotations

import ast
import datetime as dt
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medic_core.status import Status
from medic_core.vocabulary import Finding, Recommendation
from remediation import episode_types as ep
from remediation.policy import Rung
from remediation.step import (
    REBOOT_REFUSED_RETRY,
    REFUSED,
    CapDrain,
    LastStep,
    Move,
    StepDecision,
    StepFacts,
    StepRules,
    blocking_findings,
    decide_step,
    keeps_rma_out,
    rma_redrain_reason,
)
from tests.test_ladder_unit import World, in_service

OPENED = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
RULES = StepRules(
    attempts={"gpu_reset": 1, "driver_reload": 1, "reboot": 1},
    cooldown={"gpu_reset": 30.0, "driver_reload": 60.0, "reboot": 0.0},
    recheck_window=600.0,
    reboot_timeout=1800.0,
)


def episode(
    state: str = ep.VERIFYING,
    rung: int = Rung.GPU_RESET,
    *,
    fault_class: str = "gpu.xid.48",
    target: str = "1",
    recommendation: str = "gpu_reset",
    attempts: dict[str, int] | None = None,
    failed: int = 0,
) -> ep.Episode:
    return ep.Episode(
        id=7, node="n1", state=state, fault_class=fault_class, target=target, check="gpu_xid",
        recommendation=recommendation, first_rung=int(rung), rung=int(rung),
        attempts=attempts if attempts is not None else {str(int(rung)): 1} if rung else {},
        message="XID 48", evidence={}, failed_requalifications=failed, ticket_id=None,
        opened_at=OPENED, updated_at=OPENED, closed_at=None,
    )  # fmt: skip


def at(seconds: float, **facts: Any) -> StepFacts:
    return StepFacts(OPENED + dt.timedelta(seconds=seconds), RULES, **facts)


def found(status: Status, fault_class: str = "gpu.xid.48", target: str = "1") -> Finding:
    return Finding("gpu_xid", status, fault_class, target, f"{fault_class} {status.value}")


# --- verification ------------------------------------------------------------------------------


def test_a_clean_verification_resolves_at_the_same_rung() -> None:
    d = decide_step(episode(), at(10, findings=()))
    assert d.resolve and d.state == ep.RESOLVED and d.rung == Rung.GPU_RESET
    assert not d.escalate and not d.rma and d.failed_requalifications == 0


def test_ok_and_another_faults_warn_do_not_block() -> None:
    findings = (found(Status.OK), found(Status.WARN, "gpu.thermal", "2"))
    assert decide_step(episode(), at(10, findings=findings)).resolve


@pytest.mark.parametrize(
    ("recommendation", "fault_class", "target", "blocks"),
    [
        ("gpu_reset_when_idle", "gpu.remap.pending", "1", True),  # the WARN fault repaired
        ("gpu_reset_when_idle", "gpu.remap.pending", "2", False),  # another GPU's
        ("gpu_reset_when_idle", "gpu.thermal", "1", False),  # another fault of the GPU
        ("gpu_reset", "gpu.remap.pending", "1", False),  # a CRITICAL fault's record aging
    ],
)
def test_a_warn_blocks_only_the_own_fault_of_a_reset_when_idle_episode(
    recommendation: str, fault_class: str, target: str, blocks: bool
) -> None:
    e = episode(fault_class="gpu.remap.pending", recommendation=recommendation)
    d = decide_step(e, at(10, findings=(found(Status.WARN, fault_class, target),)))
    assert d.escalate is blocks and d.resolve is not blocks


@pytest.mark.parametrize("status", [Status.CRITICAL, Status.UNKNOWN])
def test_a_failed_verification_escalates_and_counts_the_failed_requalification(
    status: Status,
) -> None:
    d = decide_step(episode(failed=2), at(10, findings=(found(Status.OK), found(status))))
    assert d.move is Move.ESCALATE and d.state == ep.WAITING_IDLE
    assert d.rung == Rung.DRIVER_RELOAD and not d.rma
    assert d.failed_requalifications == 3
    assert d.why == f"still {status.value}: gpu.xid.48 {status.value}"
    assert d.event == f"gpu_reset did not repair it ({d.why}); next: driver_reload"
    assert d.blocking == (found(status),)


def test_a_rung_with_attempts_left_is_tried_again() -> None:
    rules = replace(RULES, attempts={"gpu_reset": 2})
    facts = StepFacts(OPENED, rules, findings=(found(Status.CRITICAL),))
    assert decide_step(episode(), facts).rung == Rung.GPU_RESET
    twice = episode(attempts={"1": 2})
    assert decide_step(twice, facts).rung == Rung.DRIVER_RELOAD


@pytest.mark.parametrize(
    ("off", "starts"), [("gpu_reset", Rung.DRIVER_RELOAD), ("driver_reload", Rung.REBOOT)]
)
def test_a_rung_with_no_attempts_is_skipped_not_run_once(off: str, starts: Rung) -> None:
    rules = replace(RULES, attempts={off: 0})
    first = Rung.from_word(off)
    d = decide_step(episode(ep.WAITING_IDLE, first, attempts={}), StepFacts(OPENED, rules))
    assert d.escalate and d.rung == starts and d.move is not Move.ACT
    assert d.why == f"[remediation] attempts gives {off} none"


def test_the_reboot_failing_opens_the_rma() -> None:
    d = decide_step(episode(rung=Rung.REBOOT), at(10, findings=(found(Status.CRITICAL),)))
    assert d.escalate and d.rma and d.rung == Rung.RMA


def test_a_recheck_stays_in_its_window_then_asks_a_human() -> None:
    link = episode(rung=0, fault_class="ib.port.down", target="mlx5_0/1",
                   recommendation="recheck")  # fmt: skip
    down = (found(Status.CRITICAL, "ib.port.down", "mlx5_0/1"),)
    inside = decide_step(link, at(599, findings=down))
    assert inside.move is Move.WAIT and inside.state == ep.VERIFYING and inside.rung == 0
    after = decide_step(link, at(600, findings=down))
    assert after.move is Move.NEEDS_HUMAN and after.state == ep.NEEDS_HUMAN and after.rung == 0
    assert after.message == "XID 48; still CRITICAL after 600s: ib.port.down CRITICAL"
    assert after.failed_requalifications == 0  # a re-check is no re-qualification
    assert decide_step(link, at(900, findings=())).resolve  # the link came back


def test_verifying_before_the_verification_ran_waits() -> None:
    assert decide_step(episode(), at(10)).move is Move.WAIT


# --- waiting for the node: cool-down, the rung --------------------------------------------------


def test_a_failed_step_cools_down_by_its_rungs_setting() -> None:
    e = episode(ep.WAITING_IDLE, Rung.DRIVER_RELOAD)
    last = LastStep("gpu_reset", OPENED)
    cooling = decide_step(e, at(29, last_step=last))
    assert cooling.move is Move.WAIT and "cooling down after gpu_reset" in cooling.why
    acted = decide_step(e, at(30, last_step=last))
    assert acted.move is Move.ACT and acted.state == ep.ACTING
    assert acted.rung == Rung.DRIVER_RELOAD


def test_a_refused_reboot_is_asked_again_after_its_own_retry_not_the_cooldown() -> None:
    e = episode(ep.WAITING_IDLE, Rung.REBOOT)
    refused = LastStep("reboot", OPENED, f"{REFUSED}slurmctld down")
    assert decide_step(e, at(REBOOT_REFUSED_RETRY - 1, last_step=refused)).move is Move.WAIT
    acted = decide_step(e, at(REBOOT_REFUSED_RETRY, last_step=refused))
    assert acted.move is Move.ACT and acted.state == ep.REBOOTING


def test_the_last_step_is_read_from_the_episodes_steps() -> None:
    def step(action: str, output: str) -> ep.Step:
        return ep.Step(1, 7, 1, action, 1, "failed", (), 3, output, "boot", OPENED, OPENED)

    assert LastStep.of([]) is None
    last = LastStep.of([step("gpu_reset", ""), step("reboot", f"{REFUSED}busy")])
    assert last == LastStep("reboot", OPENED, f"{REFUSED}busy") and last.refused


def test_a_step_still_running_or_none_has_no_cooldown() -> None:
    e = episode(ep.WAITING_IDLE)
    assert decide_step(e, at(0, last_step=LastStep("gpu_reset", None))).move is Move.ACT
    assert decide_step(e, at(0)).move is Move.ACT


def test_the_rma_rung_opens_the_ticket() -> None:
    d = decide_step(episode(ep.WAITING_IDLE, Rung.RMA, attempts={}), at(0))
    assert d.move is Move.RMA and d.rma and d.state == ep.RMA and d.why == ""


def test_a_dry_run_stops_for_a_human_before_any_rung() -> None:
    d = decide_step(episode(ep.WAITING_IDLE), StepFacts(OPENED, replace(RULES, dry_run=True)))
    assert d.move is Move.NEEDS_HUMAN and d.message == "dry run"
    assert d.event == "dry run: would start gpu_reset for gpu.xid.48"


@pytest.mark.parametrize("target", ["", "mlx5_0/1", "\u0663"])  # the last: an Arabic-Indic 3
def test_a_gpu_reset_with_no_single_gpu_is_skipped_whatever_its_attempts(target: str) -> None:
    rules = replace(RULES, attempts={"gpu_reset": 3})
    d = decide_step(episode(ep.WAITING_IDLE, target=target, attempts={}), StepFacts(OPENED, rules))
    assert d.escalate and d.rung == Rung.DRIVER_RELOAD and d.why == "no single GPU to reset"


def test_a_recheck_held_up_verifies_again_never_runs_a_rung() -> None:
    d = decide_step(episode(ep.WAITING_IDLE, 0), at(0))
    assert d.move is Move.SET_STATE and d.state == ep.VERIFYING and d.rung == 0


# --- the drain cap --------------------------------------------------------------------------------


def test_the_cap_waits_while_it_holds_or_is_unread_then_drains() -> None:
    e = episode(ep.WAITING_CAP)
    assert decide_step(e, at(0, cap="2 of 5 drained")).move is Move.WAIT
    assert decide_step(e, at(0)).move is Move.WAIT
    assert decide_step(e, at(0, cap="")).move is Move.DRAIN


@pytest.mark.parametrize(
    ("rung", "not_ours", "paused", "state"),
    [
        (1, False, False, ep.WAITING_IDLE),
        (1, False, True, ep.PAUSED),
        (1, True, True, ep.NEEDS_HUMAN),
        (0, False, False, ep.VERIFYING),  # a re-check held by the cap
    ],
)
def test_after_the_caps_drain(rung: int, not_ours: bool, paused: bool, state: str) -> None:
    facts = at(0, cap="", cap_drain=CapDrain(not_ours, paused))
    d = decide_step(episode(ep.WAITING_CAP, rung), facts)
    assert d.move is Move.SET_STATE and d.state == state and d.rung == rung


# --- the reboot --------------------------------------------------------------------------------


def test_no_new_boot_within_the_timeout_escalates() -> None:
    e = episode(ep.REBOOTING, Rung.REBOOT)
    assert decide_step(e, at(0, reboot_waited=1800.0)).move is Move.WAIT
    assert decide_step(e, at(0)).move is Move.WAIT
    late = decide_step(e, at(0, reboot_waited=1801.0))
    assert late.rma and late.why == "no new boot within 1801s"
    again = decide_step(e, StepFacts(OPENED, replace(RULES, attempts={"reboot": 2}),
                                     reboot_waited=1801.0))  # fmt: skip
    assert again.escalate and again.rung == Rung.REBOOT and not again.rma


@pytest.mark.parametrize("state", [ep.ACTING, ep.PAUSED, *ep.CLOSED_STATES])
def test_any_other_state_waits(state: str) -> None:
    d = decide_step(episode(state), at(0, findings=(), cap="", reboot_waited=1e9))
    assert d.move is Move.WAIT and d.state == state


# --- an RMA ticket keeps the node out ------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "rma_open", "keeps"),
    [(None, True, True), (ep.WAITING_CAP, True, True), (ep.NEEDS_HUMAN, True, True),
     (ep.ACTING, True, False), (ep.REBOOTING, True, False), (None, False, False),
     (ep.WAITING_IDLE, False, False)],
)  # fmt: skip
def test_an_rma_ticket_keeps_the_node_out_unless_a_repair_is_under_way(
    state: str | None, rma_open: bool, keeps: bool
) -> None:
    assert keeps_rma_out(state, rma_open) is keeps


@pytest.mark.parametrize(
    ("reason", "recorded", "medic_form", "again"),
    [("", None, False, "medic: rma.open"),  # no reason: Medic's own
     ("medic: gpu.xid.79 ladder: reboot", True, True, "medic: gpu.xid.79 ladder: reboot"),
     ("medic: x", False, True, None),  # an admin's reason in Medic's form, no record
     ("maintenance", None, False, None),  # records unreadable, not Medic's form
     ("medic: gpu.xid.79 ladder: reboot", None, True, "medic: gpu.xid.79 ladder: reboot")],
)  # fmt: skip
def test_an_rma_node_is_drained_again_only_with_a_reason_medic_owns(
    reason: str, recorded: bool | None, medic_form: bool, again: str | None
) -> None:
    assert rma_redrain_reason(reason, recorded, medic_form, "medic: rma.open") == again


# --- invariants -----------------------------------------------------------------------------------

FAULTS = ("gpu.xid.48", "gpu.remap.pending", "ib.port.down", "gpu.missing")
TARGETS = ("", "0", "1", "mlx5_0/1", "\u0663")
RUNG_WORDS = ("gpu_reset", "driver_reload", "reboot")

findings_st = st.builds(
    Finding,
    st.just("check"),
    st.sampled_from(list(Status)),
    st.sampled_from(FAULTS),
    st.sampled_from(TARGETS),
    st.text(max_size=5),
)
episodes_st = st.builds(
    episode,
    st.sampled_from([*ep.OPEN_STATES, *ep.CLOSED_STATES]),
    st.integers(0, 4),
    fault_class=st.sampled_from(FAULTS),
    target=st.sampled_from(TARGETS),
    recommendation=st.sampled_from([r.value for r in Recommendation]),
    attempts=st.dictionaries(st.sampled_from(["1", "2", "3"]), st.integers(0, 4)),
    failed=st.integers(0, 5),
)
rules_st = st.builds(
    StepRules,
    attempts=st.dictionaries(st.sampled_from(RUNG_WORDS), st.integers(0, 3)),
    cooldown=st.dictionaries(st.sampled_from(RUNG_WORDS), st.floats(0, 600)),
    recheck_window=st.floats(0, 1200),
    reboot_timeout=st.floats(60, 3600),
    dry_run=st.booleans(),
)
facts_st = st.builds(
    StepFacts,
    st.integers(0, 3600).map(lambda s: OPENED + dt.timedelta(seconds=s)),
    rules_st,
    last_step=st.none()
    | st.builds(
        LastStep,
        st.sampled_from(RUNG_WORDS),
        st.none() | st.integers(0, 3600).map(lambda s: OPENED + dt.timedelta(seconds=s)),
        st.sampled_from(["done", f"{REFUSED}busy"]),
    ),
    cap=st.none() | st.sampled_from(["", "2 of 5 drained"]),
    cap_drain=st.none() | st.builds(CapDrain, st.booleans(), st.booleans()),
    reboot_waited=st.none() | st.floats(0, 7200),
    findings=st.none() | st.lists(findings_st, max_size=4).map(tuple),
)


def spent(e: ep.Episode, rung: int, rules: StepRules) -> bool:
    """Every allowed attempt of `rung` was made."""
    return e.attempts_at(rung) >= rules.allowed(Rung(rung))


@settings(max_examples=1500, deadline=None)
@given(episodes_st, facts_st)
def test_invariants_of_any_step(e: ep.Episode, facts: StepFacts) -> None:
    d = decide_step(e, facts)
    assert d == decide_step(e, facts)  # a pure function of its arguments
    assert isinstance(d, StepDecision)
    assert d.rung >= e.rung, "the rung never goes down"
    assert d.state in (*ep.OPEN_STATES, *ep.CLOSED_STATES)
    if d.move is Move.WAIT:
        assert (d.state, d.rung, d.message) == (e.state, e.rung, "")
    if e.rung == 0:  # a re-check never escalates to a repair
        assert d.rung == 0 and d.move not in (Move.ESCALATE, Move.ACT, Move.RMA)
    if d.rma:
        assert e.rung == Rung.RMA or (e.rung == Rung.REBOOT and spent(e, Rung.REBOOT, facts.rules))
    if d.escalate and d.rung > e.rung:  # the next rung: this one's attempts spent, or no GPU
        assert d.rung == e.rung + 1
        assert spent(e, e.rung, facts.rules) or (
            e.rung == Rung.GPU_RESET and not (e.target.isascii() and e.target.isdigit())
        )
    if d.resolve:
        assert e.state == ep.VERIFYING and facts.findings is not None
        assert not blocking_findings(e, facts.findings)
    warn_fault = e.recommendation == Recommendation.GPU_RESET_WHEN_IDLE.value
    for f in d.blocking:  # a WARN blocks only the episode's own fault, reset when idle
        if f.status is Status.WARN:
            assert warn_fault and (f.fault_class, f.target) == (e.fault_class, e.target)
        else:
            assert f.status in (Status.CRITICAL, Status.UNKNOWN)
    counted = d.failed_requalifications - e.failed_requalifications
    assert counted == (1 if d.escalate and e.state == ep.VERIFYING else 0)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([Rung.GPU_RESET, Rung.DRIVER_RELOAD, Rung.REBOOT]),
    st.sampled_from(TARGETS),
    st.dictionaries(st.sampled_from(RUNG_WORDS), st.integers(0, 3)),
)
def test_a_fault_no_rung_cures_reaches_rma_only_after_every_rungs_allowed_attempts(
    first: Rung, target: str, attempts: dict[str, int]
) -> None:
    """The ladder's loop over decide_step alone: act (an attempt counted), verify (still
    CRITICAL), escalate; until the RMA."""
    rules = StepRules(attempts=attempts)
    e = episode(ep.WAITING_IDLE, first, target=target, attempts={})
    bad = (found(Status.CRITICAL, target=target),)
    for _ in range(20):
        d = decide_step(e, StepFacts(OPENED, rules))
        if d.move is Move.ACT:
            tried = {**e.attempts, str(e.rung): e.attempts_at(e.rung) + 1}
            e = replace(e, state=ep.VERIFYING, attempts=tried)
            d = decide_step(e, StepFacts(OPENED, rules, findings=bad))
        assert d.escalate or d.move is Move.RMA, d
        e = replace(e, state=d.state, rung=d.rung)
        if d.rma:
            break
    else:
        raise AssertionError("never reached RMA")
    gpu = target.isascii() and target.isdigit()
    for rung in range(first, Rung.RMA):
        # Each rung is tried as often as allowed: 0 skips it (noticed in stop 31: it ran
        # once); a GPU reset with no GPU is skipped.
        allowed = rules.allowed(Rung(rung)) if rung != Rung.GPU_RESET or gpu else 0
        assert e.attempts_at(rung) == allowed, (Rung(rung).word, dict(e.attempts))


# --- purity: the decision core reads no clock, store or Slurm -------------------------------------


def test_the_step_module_imports_only_the_standard_library_and_the_core_vocabulary() -> None:
    allowed = {"medic_core.status", "medic_core.vocabulary", "remediation", "remediation.policy",
               "remediation.episode_types", "__future__"}  # fmt: skip
    source = Path(__file__).parent.parent / "remediation" / "step.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    foreign = {
        n for n in names if n not in allowed and n.split(".")[0] not in sys.stdlib_module_names
    }
    assert not foreign
    assert "time" not in names and "datetime.datetime.now" not in source.read_text()


# --- the real ladder: a re-check held up by a pause goes on verifying -----------------------------

IB_DOWN = Finding(
    "ib", Status.CRITICAL, "ib.port.down", "mlx5_0/1", "port down", Recommendation.RECHECK
)


def test_a_recheck_paused_then_resumed_verifies_and_comes_back(tmp_path: Path) -> None:
    """Before decide_step, the lifted pause put a re-check (rung 0) into waiting_idle, whose
    tick then failed on `Rung(0)` every time: the node stayed drained with no word why."""
    world = World(tmp_path / "medic.db")
    try:
        world.episodes.set_paused(True, "maintenance", "alice")
        admitted = world.fault("n1", IB_DOWN).episode
        assert admitted is not None and admitted.state == ep.PAUSED and admitted.rung == 0
        world.episodes.set_paused(False, "", "alice")
        assert world.tick("n1") is not None and world.last("n1").state == ep.VERIFYING
        world.tick("n1")  # still down: re-checked within the window
        assert world.last("n1").state == ep.VERIFYING and not in_service(world, "n1")
        world.nodes["n1"].findings.clear()  # the link came back
        episode = world.run("n1")
        assert episode.state == ep.RESOLVED and in_service(world, "n1")
        assert not world.steps("n1"), "a re-check runs no rung"
    finally:
        world.close()

"""Burn-in, pure: no node runs a job before it passed the deep tier.

Three reasons put a node through the deep checks before its first job (`[remediation.burn_in]`,
each a list of check names, [] switches it off):

* `new_node`: the store holds no burn-in record for the node (and no passing run of every
  listed check, which is adopted instead: a fleet already swept is not drained again). The
  node's daemon drains it (`medic: burn-in node new_node ...`), waits for running jobs to
  leave, runs the checks, then resumes it through `decide_resume`; a failure is handed to
  the ladder (remediation/burn_in_runner.py).
* `after_reboot`: the ladder's verification after a reboot rung adds these checks.
* `after_rma`: the re-qualification of a node whose RMA ticket was closed adds these.

The record is one condition of the node (type `burn_in`, node-wide): OK when passed (or
waived by switching `new_node` off), WARN while it runs, CRITICAL when it failed. Its
evidence holds the phase, the reason, the checks, the runs started (a daemon crash mid-run
starts it again, at most `max_attempts` times) and the episode a failure was handed to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from medic_core.drain_reason import BURN_IN, format_reason, is_burn_in_reason
from medic_core.settings import BurnInSettings
from medic_core.status import Status
from medic_core.vocabulary import Finding, Recommendation
from remediation.decide import NodeFacts
from remediation.decide_resume import decide_resume
from remediation.policy import first_rung

CONDITION = "burn_in"  # the condition type holding a node's record
NEW_NODE, AFTER_RMA, AFTER_REBOOT = "new_node", "after_rma", "after_reboot"


class Phase(StrEnum):
    RUNNING = "running"  # drained, checks started (or about to start)
    PASSED = "passed"
    WAIVED = "waived"  # new_node switched off while the node waited
    FAILED = "failed"  # handed to the ladder (episode)


STATUS_OF = {
    Phase.RUNNING: Status.WARN,
    Phase.PASSED: Status.OK,
    Phase.WAIVED: Status.OK,
    Phase.FAILED: Status.CRITICAL,
}


@dataclass(frozen=True)
class Record:
    """A node's burn-in, as its `burn_in` condition holds it."""

    phase: Phase
    reason: str = NEW_NODE
    checks: tuple[str, ...] = ()
    attempts: int = 0  # runs started
    episode: int | None = None  # the ladder's episode a failure was handed to
    note: str = ""

    @property
    def qualified(self) -> bool:
        return self.phase in (Phase.PASSED, Phase.WAIVED)

    def evidence(self) -> dict[str, Any]:
        return {
            "phase": self.phase.value,
            "reason": self.reason,
            "checks": list(self.checks),
            "attempts": self.attempts,
            "episode": self.episode,
            "note": self.note,
        }

    @classmethod
    def from_evidence(cls, evidence: Mapping[str, Any]) -> Record | None:
        """None for a record that does not read (hand-edited, another version): the node is
        then treated as never checked, the safe reading."""
        try:
            phase = Phase(str(evidence.get("phase", "")))
        except ValueError:
            return None
        checks = evidence.get("checks") or []
        attempts = evidence.get("attempts", 0)
        episode = evidence.get("episode")
        return cls(
            phase=phase,
            reason=str(evidence.get("reason") or NEW_NODE),
            checks=tuple(str(c) for c in checks) if isinstance(checks, list) else (),
            attempts=attempts if isinstance(attempts, int) and attempts >= 0 else 0,
            episode=episode if isinstance(episode, int) and not isinstance(episode, bool) else None,
            note=str(evidence.get("note") or ""),
        )


def drain_reason(reason: str, checks: Sequence[str]) -> str:
    """`medic: burn-in node new_node: deep_dcgm`: Medic's, so only Medic resumes it."""
    return format_reason(BURN_IN, "", f"{reason}: {' '.join(checks) or 'no checks'}")


class Step(StrEnum):
    NOTHING = "nothing"
    ADOPT = "adopt"  # every listed check passed before: recorded passed, never drained
    DRAIN = "drain"  # never checked and in service: take it out first
    WAIT = "wait"  # out of service, but jobs still run or an episode owns it
    RUN = "run"  # run the checks now
    FAIL = "fail"  # interrupted max_attempts times: counts as a failure
    HAND = "hand"  # failed, but no episode recorded: hand it to the ladder (again)
    WAIVE = "waive"  # new_node switched off while it waited: qualified, resume
    RESUME = "resume"  # qualified and still in Medic's burn-in drain


@dataclass(frozen=True)
class BurnInFacts:
    record: Record | None
    checks: tuple[str, ...]  # [remediation.burn_in] new_node
    slurm: NodeFacts
    jobs_running: bool = False
    open_episode: int | None = None
    rma_open: tuple[int, ...] = ()
    passed_before: bool = False  # every listed check has an OK condition already
    max_attempts: int = 3


@dataclass(frozen=True)
class BurnInDecision:
    step: Step
    why: str


def decide_burn_in(facts: BurnInFacts) -> BurnInDecision:
    """What a node's daemon does about its own burn-in now."""
    record = facts.record
    if record is not None and record.qualified:
        if not is_burn_in_reason(facts.slurm.reason) or facts.slurm.owner != "medic":
            return BurnInDecision(Step.NOTHING, f"burn-in {record.phase.value}")
        resume = decide_resume(
            facts.slurm, open_episode=facts.open_episode, rma_open=facts.rma_open
        )
        step = Step.RESUME if resume.resume else Step.NOTHING
        return BurnInDecision(step, f"burn-in {record.phase.value}; {resume.why}")
    if record is not None and record.phase is Phase.FAILED:
        if record.episode is None:
            return BurnInDecision(Step.HAND, "burn-in failed; no episode recorded yet")
        return BurnInDecision(Step.NOTHING, f"burn-in failed: episode {record.episode} owns it")
    # Never checked, or a run under way (a crash interrupted it: run it again).
    if not facts.checks:
        # A node drained for a burn-in that is switched off meanwhile is given back.
        if record is None and not is_burn_in_reason(facts.slurm.reason):
            return BurnInDecision(Step.NOTHING, "new_node burn-in is off")
        return BurnInDecision(Step.WAIVE, "new_node burn-in switched off while it waited")
    if record is None and facts.passed_before:
        return BurnInDecision(Step.ADOPT, "every burn-in check passed here before")
    if not facts.slurm.known:
        return BurnInDecision(Step.WAIT, "Slurm does not know the node (yet)")
    if facts.slurm.owner == "":
        return BurnInDecision(Step.DRAIN, "never qualified: out of service until burnt in")
    if facts.open_episode is not None:
        return BurnInDecision(Step.WAIT, f"episode {facts.open_episode} first")
    if facts.jobs_running:
        return BurnInDecision(Step.WAIT, "jobs still running: burn-in once they leave")
    if record is not None and record.attempts >= facts.max_attempts:
        return BurnInDecision(
            Step.FAIL, f"{record.attempts} burn-in runs interrupted (the daemon restarted)"
        )
    return BurnInDecision(Step.RUN, "out of service and idle: burn in")


def blocking(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.status in (Status.CRITICAL, Status.UNKNOWN)]


def for_ladder(findings: Sequence[Finding], failure_rung: str) -> list[Finding]:
    """A failed burn-in's findings as the ladder takes them: a finding whose recommendation
    starts no rung (a deep check's DRAIN) starts at `failure_rung` instead of at a human."""
    out = []
    for f in blocking(findings):
        if failure_rung != "none" and first_rung(f.fault_class, f.recommendation.value) is None:
            f = dataclasses.replace(f, recommendation=Recommendation(failure_rung))
        out.append(f)
    return out


def verify_checks(
    settings: BurnInSettings, record: Record | None, episode_id: int, rebooted: bool
) -> tuple[str, ...]:
    """The checks the ladder adds to its verification of `episode_id`: the failed burn-in's
    own when the episode is its hand-over, `after_reboot` when a reboot rung ran."""
    extra: list[str] = []
    if record is not None and record.phase is Phase.FAILED and record.episode == episode_id:
        extra += record.checks
    if rebooted:
        extra += settings.after_reboot
    return tuple(dict.fromkeys(extra))


def after_verify(
    record: Record | None, reason: str, checks: Sequence[str], passed: bool
) -> Record | None:
    """The record to write after the ladder's verification ran burn-in `checks` (None: no
    change). A pass qualifies the node; a failure is the ladder's to escalate, the record
    keeps its own state."""
    if not checks or not passed:
        return None
    attempts = record.attempts if record is not None else 0
    return Record(Phase.PASSED, reason, tuple(checks), attempts)

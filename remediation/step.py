"""The ladder's state changes, pure: an open episode and the facts the ladder gathered in, the
next move out. The ladder (remediation.ladder) reads the store, Slurm and the node, asks
`decide_step`, and carries the decision out; nothing here reads a clock (`StepFacts.now`),
the store or Slurm.

What is decided here, by the episode's state:

* waiting_cap: the drain cap still holds (wait), or it freed (drain), and after the drain
  where the episode goes (on, paused, or to a human when the drain is someone else's);
* waiting_idle, once no job holds the repair up: the cool-down after a failed step, then the
  rung (RMA, a dry run's stop, a GPU reset with no single GPU skipped, or act; in
  observe-only mode the rung or RMA it would start, recorded, then a human);
* rebooting: no new boot within reboot_timeout escalates;
* verifying: the verification's outcome (resolve, stay in a re-check's window, a human after
  it, or escalate: the same rung while it has attempts left, then the next, then RMA).

An RMA ticket keeps the node out (`keeps_rma_out`, `rma_redrain_reason`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from medic_core.status import Status
from medic_core.vocabulary import Finding, Recommendation
from remediation import episode_types as ep
from remediation.policy import Rung, after_failure

# A reboot Slurm refused is recorded as a failed step whose output starts with this; it is
# asked again after REBOOT_REFUSED_RETRY (not the rung's cool-down) and is not a repair.
REFUSED = "slurm refused: "
REBOOT_REFUSED_RETRY = 60.0


class Move(StrEnum):
    WAIT = "wait"  # nothing changes now (the cap, a cool-down, a re-check's window, a reboot)
    DRAIN = "drain"  # the drain cap freed: drain the node, then ask again with the outcome
    SET_STATE = "set_state"  # the episode goes to `state` (after the cap's drain)
    ACT = "act"  # run the episode's rung now
    RESOLVE = "resolve"  # repaired and re-qualified: give the node back
    ESCALATE = "escalate"  # the rung failed: `rung` next (the same while attempts remain)
    RMA = "rma"  # open the RMA ticket (the episode's rung is RMA)
    NEEDS_HUMAN = "needs_human"


@dataclass(frozen=True)
class StepRules:
    """What [remediation] says of the steps (medic_core.settings.RemediationSettings)."""

    attempts: Mapping[str, int] = field(default_factory=dict)  # by rung word; missing: 1
    cooldown: Mapping[str, float] = field(default_factory=dict)  # by step action; missing: 0
    recheck_window: float = 600.0
    reboot_timeout: float = 1800.0
    dry_run: bool = False
    # remediation.observe: the rung (or RMA ticket) is recorded as what Medic would have done
    # and the episode goes to a human, as in a dry run.
    observe_only: bool = False

    def allowed(self, rung: Rung) -> int:
        return self.attempts.get(rung.word, 1)


@dataclass(frozen=True)
class LastStep:
    """The episode's last recorded step (its rung's action word)."""

    action: str
    ended_at: dt.datetime | None
    output: str = ""

    @property
    def refused(self) -> bool:
        return self.output.startswith(REFUSED)

    @classmethod
    def of(cls, steps: Sequence[ep.Step]) -> LastStep | None:
        """The last of an episode's recorded steps (None: none)."""
        return cls(steps[-1].action, steps[-1].ended_at, steps[-1].output) if steps else None


@dataclass(frozen=True)
class CapDrain:
    """The drain made once the cap freed."""

    not_ours_kept: bool  # the node was drained by someone else already: theirs to keep
    paused: bool  # remediation is paused (read after the drain)


@dataclass(frozen=True)
class StepFacts:
    now: dt.datetime
    rules: StepRules = field(default_factory=StepRules)
    # waiting_idle: the last step (None: none yet)
    last_step: LastStep | None = None
    # waiting_cap: why the cap still holds ("" it freed; None not read); the drain made after
    cap: str | None = None
    cap_drain: CapDrain | None = None
    # rebooting: seconds since the reboot was asked (None: not known)
    reboot_waited: float | None = None
    # verifying: what the verification found (None: it has not run)
    findings: tuple[Finding, ...] | None = None


@dataclass(frozen=True)
class StepDecision:
    move: Move
    state: str  # the episode's next state
    rung: int  # its next rung
    why: str = ""  # the reason (a failure's words feed the RMA ticket's reason)
    message: str = ""  # the episode's new message ("": unchanged)
    event: str = ""  # what the ladder tells the operator ("": nothing)
    failed_requalifications: int = 0  # the episode's count after this step
    blocking: tuple[Finding, ...] = ()  # the verification's findings that keep the node out
    observed: str = ""  # observe only: what Medic would have done (a rung's word, or "rma")

    @property
    def resolve(self) -> bool:
        return self.move is Move.RESOLVE

    @property
    def escalate(self) -> bool:
        return self.move is Move.ESCALATE

    @property
    def rma(self) -> bool:
        """An RMA ticket is opened: the rung is RMA, or an escalation reached it."""
        return self.move is Move.RMA or (self.move is Move.ESCALATE and self.rung == Rung.RMA)


def decide_step(episode: ep.Episode, facts: StepFacts) -> StepDecision:
    """The next move of an open episode. The ladder asks in waiting_cap, in waiting_idle once
    no job holds the repair up, in rebooting once the node has not come back, and in
    verifying with the verification's findings; any other ask is a wait."""
    if episode.state == ep.WAITING_CAP:
        return _cap(episode, facts)
    if episode.state == ep.WAITING_IDLE:
        return _idle(episode, facts)
    if episode.state == ep.REBOOTING:
        waited = facts.reboot_waited
        if episode.rung and waited is not None and waited > facts.rules.reboot_timeout:
            return escalation(episode, facts.rules, f"no new boot within {waited:.0f}s")
        return _wait(episode, "waiting for the new boot")
    if episode.state == ep.VERIFYING and facts.findings is not None:
        return _verified(episode, facts)
    return _wait(episode, f"nothing to decide in {episode.state}")


def _wait(episode: ep.Episode, why: str) -> StepDecision:
    return _stay(episode, Move.WAIT, episode.state, why)


def _stay(
    episode: ep.Episode, move: Move, state: str, why: str, *, message: str = "", event: str = ""
) -> StepDecision:
    """A decision that keeps the episode's rung and its count of failed re-qualifications."""
    return StepDecision(
        move, state, episode.rung, why, message, event, episode.failed_requalifications
    )


def _cap(episode: ep.Episode, facts: StepFacts) -> StepDecision:
    if facts.cap is None or facts.cap:
        return _wait(episode, facts.cap or "the drain cap was not read")
    if facts.cap_drain is None:
        return _stay(episode, Move.DRAIN, episode.state, "drain cap freed")
    drain = facts.cap_drain
    state = ep.PAUSED if drain.paused else goes_on_in(episode)
    if drain.not_ours_kept:
        state = ep.NEEDS_HUMAN
    return _stay(episode, Move.SET_STATE, state, "drain cap freed")


def goes_on_in(episode: ep.Episode) -> str:
    """The state an episode held up (by the cap, a pause) goes on in: a re-check (rung 0)
    verifies again, a repair waits for the node to be idle."""
    return ep.WAITING_IDLE if episode.rung else ep.VERIFYING


def cooling_down(last: LastStep | None, rules: StepRules, now: dt.datetime) -> float:
    """Seconds left of the cool-down that follows the last step (0: none): its rung's, or
    REBOOT_REFUSED_RETRY after a reboot Slurm refused."""
    if last is None or last.ended_at is None:
        return 0.0
    wait = REBOOT_REFUSED_RETRY if last.refused else rules.cooldown.get(last.action, 0.0)
    return max(0.0, wait - (now - last.ended_at).total_seconds())


def _idle(episode: ep.Episode, facts: StepFacts) -> StepDecision:
    left = cooling_down(facts.last_step, facts.rules, facts.now)
    if left > 0:
        action = facts.last_step.action if facts.last_step else ""
        return _wait(episode, f"cooling down after {action}: {left:.0f}s left")
    if not episode.rung:  # a re-check runs no rung: it verifies
        return _stay(episode, Move.SET_STATE, ep.VERIFYING, "a re-check: no rung to run")
    if episode.rung == Rung.RMA:
        if facts.rules.observe_only:
            return _observed(episode, "rma", "open an RMA ticket")
        return _stay(episode, Move.RMA, ep.RMA, "")
    rung = Rung(episode.rung)
    if facts.rules.dry_run and not facts.rules.observe_only:
        event = f"dry run: would start {rung.word} for {episode.fault_class}"
        return _stay(
            episode, Move.NEEDS_HUMAN, ep.NEEDS_HUMAN, "dry run", message="dry run", event=event
        )
    if rung is Rung.GPU_RESET and not single_gpu(episode.target):
        # a node-wide fault: a per-GPU reset does not apply
        return escalation(episode, facts.rules, "no single GPU to reset", skip=True)
    if facts.rules.allowed(rung) == 0:  # the site turned this rung off
        why = f"[remediation] attempts gives {rung.word} none"
        return escalation(episode, facts.rules, why, skip=True)
    if facts.rules.observe_only:
        return _observed(episode, rung.word, f"start {rung.word}")
    return _stay(episode, Move.ACT, ep.REBOOTING if rung is Rung.REBOOT else ep.ACTING, rung.word)


OBSERVE_ONLY = "observe only"


def _observed(episode: ep.Episode, action: str, what: str) -> StepDecision:
    """Observe-only mode: the move the episode would make now, recorded, and a human's."""
    would = f"{OBSERVE_ONLY}: would {what} for {episode.fault_class}"
    decision = _stay(
        episode, Move.NEEDS_HUMAN, ep.NEEDS_HUMAN, OBSERVE_ONLY, message=would, event=would
    )
    return replace(decision, observed=action)


def single_gpu(target: str) -> bool:
    """The target names one GPU (its index)."""
    return target.isascii() and target.isdigit()


def escalation(
    episode: ep.Episode,
    rules: StepRules,
    why: str,
    *,
    skip: bool = False,
    failed_requalifications: int | None = None,
) -> StepDecision:
    """The episode's rung did not repair it (`why`): the same rung while it has attempts
    left, else the next; RMA after the reboot's. `skip`: the rung does not apply (no attempt
    of it can help): the next one."""
    rung = Rung(episode.rung)
    allowed = 0 if skip else rules.allowed(rung)
    nxt = after_failure(rung, episode.attempts_at(rung), allowed)
    return StepDecision(
        Move.ESCALATE,
        ep.WAITING_IDLE,
        int(nxt),
        why,
        event=f"{rung.word} did not repair it ({why}); next: {nxt.word}",
        failed_requalifications=episode.failed_requalifications
        if failed_requalifications is None
        else failed_requalifications,
    )


def blocking_findings(episode: ep.Episode, findings: Sequence[Finding]) -> tuple[Finding, ...]:
    """What keeps the node out after a repair: CRITICAL or UNKNOWN, and a WARN only of the WARN
    fault the repair was for (a row remap pending until the GPU's reset: the episode's own
    fault, recommended gpu_reset_when_idle). A CRITICAL fault's own record aging at WARN
    afterwards (an XID the check still lists for a while) is not the fault again."""
    warn_fault = episode.recommendation == Recommendation.GPU_RESET_WHEN_IDLE.value
    return tuple(
        f
        for f in findings
        if f.status in (Status.CRITICAL, Status.UNKNOWN)
        or (
            warn_fault
            and f.status is Status.WARN
            and (f.fault_class, f.target) == (episode.fault_class, episode.target)
        )
    )


def _verified(episode: ep.Episode, facts: StepFacts) -> StepDecision:
    blocking = blocking_findings(episode, facts.findings or ())
    failed = episode.failed_requalifications
    if not blocking:
        return _stay(episode, Move.RESOLVE, ep.RESOLVED, "re-qualified")
    first = blocking[0]
    if episode.rung == 0:  # a re-check (a link that may come back): no repair rung
        age = (facts.now - episode.opened_at).total_seconds()
        if age < facts.rules.recheck_window:
            return replace(_wait(episode, f"re-checking: {age:.0f}s"), blocking=blocking)
        return StepDecision(
            Move.NEEDS_HUMAN,
            ep.NEEDS_HUMAN,
            0,
            f"still {first.status.value} after {age:.0f}s",
            message=f"{episode.message}; still {first.status.value} after {age:.0f}s:"
            f" {first.message}",
            failed_requalifications=failed,
            blocking=blocking,
        )
    decision = escalation(
        episode,
        facts.rules,
        f"still {first.status.value}: {first.message}",
        failed_requalifications=failed + 1,
    )
    return replace(decision, blocking=blocking)


# --- an RMA ticket keeps the node out ----------------------------------------------------------


def keeps_rma_out(state: str | None, rma_open: bool) -> bool:
    """An open RMA ticket keeps the node out whatever its episode (`state`, None: none) waits
    on (the cap, a human); only a repair under way (acting, rebooting) is left to finish."""
    return rma_open and state not in (ep.ACTING, ep.REBOOTING)


def rma_redrain_reason(
    reason: str, recorded: bool | None, medic_reason: bool, default: str
) -> str | None:
    """The reason to drain an RMA node not drained now with again, None to leave it as it
    is: someone else's reason (no record of Medic's holds it: `recorded` False; with the
    records unreadable, None, a reason not in Medic's form) is theirs to keep. A reboot
    rung's DOWN with Medic's reason is drained again with it; a node with none with
    `default`."""
    if reason and recorded is False:
        return None
    if reason and recorded is None and not medic_reason:
        return None
    return reason or default


# --- why an episode goes to RMA ----------------------------------------------------------------


def rung_history(steps: Sequence[ep.Step]) -> str:
    """`gpu_reset x2, reboot x1`: the repair steps an episode ran (refused reboots are not
    repairs: Slurm never started them)."""
    counts: dict[str, int] = {}
    for s in steps:
        if not s.output.startswith(REFUSED):
            counts[s.action] = counts.get(s.action, 0) + 1
    return ", ".join(f"{action} x{n}" for action, n in counts.items())


def rma_reason(
    episode: ep.Episode,
    steps: Sequence[ep.Step],
    failure: str,
    first_rung: Mapping[str, str] | None = None,
) -> str:
    """Why an episode goes to RMA, for the vendor and the operator: the lemon rule's reason
    (recorded when it was admitted), else the rungs tried and the last failure, else what
    starts its fault class at RMA (`first_rung`: [remediation] first_rung, or the finding's
    recommendation)."""
    lemon = episode.evidence.get("lemon")
    if isinstance(lemon, str) and lemon:
        return lemon
    tried = rung_history(steps)
    if tried:
        return f"{tried} did not repair it" + (f": {failure}" if failure else "")
    if failure:
        return failure
    parts = episode.fault_class.split(".")
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        if key in (first_rung or {}):
            return f"[remediation] first_rung sends {key} straight to RMA: no repair tried"
    return f"recommended {episode.recommendation!r}: no repair tried"

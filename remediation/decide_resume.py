"""The decision core's part in giving a node back (split from remediation.decide): whether
a drained node may be resumed, and by whom. Every resume asks it (remediation.give_back):
Medic resumes only what its own records say it drained, never a node with an open RMA
ticket or episode. Pure, like the rest of the core."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from medic_core.vocabulary import Finding
from remediation.decide import NodeFacts


class Refusal(StrEnum):
    """Why a resume was refused, for the caller's outcome (DrainOutcome) and exit code."""

    NONE = ""
    NOT_DRAINED = "not_drained"
    NOT_OURS = "not_ours"  # the records were read: none holds this drain
    NO_RECORD = "no_record"  # the records are unreachable: no resume without one
    HELD = "held"  # waits for a human
    KEPT = "kept"  # Medic's, but an RMA ticket, an episode or a failing check keeps it out


@dataclass(frozen=True)
class ResumeDecision:
    resume: bool
    why: str
    refusal: Refusal = Refusal.NONE


def decide_resume(
    slurm: NodeFacts,
    *,
    blocking: Sequence[Finding] = (),
    open_episode: int | None = None,
    rma_open: Sequence[int] = (),
    resolving: int | None = None,
    human: bool = False,
    force: bool = False,
) -> ResumeDecision:
    """May this node return to service? Every resume asks here (the ladder's give-back,
    the HealthCheckProgram, the isolator, spares, burn-in, `medic node resume`, `medic
    episode close --resume`, `medic check --requalify`). Only a drain Medic's records hold
    (`slurm.recorded`: never judged on the reason's text, and never without a record), not
    held for a human unless a human asks (`human`), with no open RMA ticket, no episode
    other than the one being resolved, a drain made for an episode given back only while
    resolving that episode (or by a human), and nothing CRITICAL or UNKNOWN in a fresh
    check run. `force` (a human's `--force`) resumes any drain: the human answers for it."""
    out = slurm.drained or slurm.down
    if not out:
        return ResumeDecision(False, "not drained", Refusal.NOT_DRAINED)
    if force and human:
        whose = (
            "Medic's drain" if slurm.recorded else f"a drain Medic did not record ({slurm.reason})"
        )
        return ResumeDecision(True, f"forced by a human: {whose}")
    if not slurm.reason:
        return ResumeDecision(
            False, "out of service without a reason: not Medic's", Refusal.NOT_OURS
        )
    if slurm.recorded is None:
        return ResumeDecision(
            False,
            f"Medic's drain records are unreachable (store and journal): no resume without"
            f" a record ({slurm.reason})",
            Refusal.NO_RECORD,
        )
    if not slurm.recorded:
        return ResumeDecision(
            False,
            f"not Medic's drain: no record of Medic's holds {slurm.reason!r}",
            Refusal.NOT_OURS,
        )
    if slurm.held and not human:
        return ResumeDecision(
            False, f"kept for a human ({slurm.held}): `medic node resume`", Refusal.HELD
        )
    if slurm.drain_episode is not None and slurm.drain_episode != resolving and not human:
        # The episode's to give back (the ladder, once repaired) or a human's (it waits for
        # one, or was closed): never a bystander's such as the HealthCheckProgram.
        why = f"drained for remediation episode {slurm.drain_episode}: its ladder or a human"
        return ResumeDecision(False, f"{why} gives it back", Refusal.HELD)
    if rma_open:
        return ResumeDecision(False, f"RMA ticket {rma_open[0]} is open", Refusal.KEPT)
    if open_episode is not None and open_episode != resolving:
        return ResumeDecision(False, f"remediation episode {open_episode} owns it", Refusal.KEPT)
    if blocking:
        f = blocking[0]
        return ResumeDecision(False, f"still {f.status.value}: {f.check} {f.message}", Refusal.KEPT)
    return ResumeDecision(True, "given back by a human" if human else "re-qualified")

"""The decision core's part in post-job hygiene (slurm_hooks/hygiene_run.py): whether what a
job left after SIGKILL drains the node as `user_problem`, and the finding that keeps such a
node out until it is clean (given to remediation.give_back, which decides every resume).

A user_problem drain is the user's, not the hardware's: it opens no episode (so no lemon
counts it), the drain cap neither holds it back nor counts it (remediation.decide.cap_reason),
and it is given back by itself once nothing is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from medic_core.drain_reason import USER_PROBLEM, format_reason, is_user_problem_reason
from medic_core.status import Status
from medic_core.vocabulary import Finding, Recommendation
from remediation.decide import NodeFacts

CHECK = "hygiene"


@dataclass(frozen=True)
class HygieneDecision:
    drain: bool
    why: str
    reason: str = ""  # the drain reason, when `drain`
    already: bool = False  # the node is out for a user_problem of Medic's already


def decide_user_problem(
    left: Sequence[str], node: NodeFacts, *, drain_enabled: bool
) -> HygieneDecision:
    """`left`: what survived the cleaning, one phrase per kind (empty: clean)."""
    if not left:
        return HygieneDecision(False, "clean")
    what = "; ".join(left)
    if not drain_enabled:
        return HygieneDecision(False, f"left: {what} ([hygiene] drain is off)")
    if not node.known:
        return HygieneDecision(False, f"left: {what}; Slurm does not know the node")
    if node.drained or node.down:
        if node.owner == "medic" and is_user_problem_reason(node.reason):
            why = f"left: {what}; already drained as {USER_PROBLEM}"
            return HygieneDecision(False, why, already=True)
        return HygieneDecision(False, f"left: {what}; already out ({node.reason!r}): kept")
    return HygieneDecision(True, f"left after SIGKILL: {what}", user_problem_reason(what))


def user_problem_reason(what: str) -> str:
    return format_reason(USER_PROBLEM, "", what)


def still_left(left: Sequence[str]) -> list[Finding]:
    """What keeps a user_problem node out, as the blocking finding decide_resume takes."""
    if not left:
        return []
    return [
        Finding(
            CHECK, Status.CRITICAL, USER_PROBLEM, "", f"still left: {'; '.join(left)}",
            Recommendation.DRAIN,
        )
    ]  # fmt: skip

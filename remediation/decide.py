"""The decision core: pure functions, state in, decision out. Every path that touches a
node (the daemon's fault response, the prolog's refusal, the HealthCheckProgram, the sweep,
the epilog, the CLI) asks here and goes through the same rails: the drain cap, the pause,
ownership of drains (Medic only resumes what Medic drained, judged on the reason Slurm
stores) and a resilient job's restart budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from medic_core.settings import HookSettings
from medic_core.status import Status
from medic_core.vocabulary import Finding, Verdict


@dataclass(frozen=True)
class GateDecision:
    allow: bool
    status: Status
    blocking: tuple[Finding, ...] = field(default=())
    why: str = ""

    @property
    def first(self) -> Finding | None:
        return self.blocking[0] if self.blocking else None


def decide_launch(verdict: Verdict, settings: HookSettings) -> GateDecision:
    """May a job start here? CRITICAL never; UNKNOWN only with on_unknown = "open"."""
    critical = tuple(f for f in verdict.findings if f.status is Status.CRITICAL)
    if critical:
        return GateDecision(False, Status.CRITICAL, critical, "CRITICAL fault on this node")
    unknown = tuple(f for f in verdict.findings if f.status is Status.UNKNOWN)
    if unknown and settings.on_unknown == "closed":
        return GateDecision(
            False, Status.UNKNOWN, unknown, "a launch check could not tell (on_unknown=closed)"
        )
    return GateDecision(True, verdict.status, (), "")

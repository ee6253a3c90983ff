"""Giving a node back to service: the one way Medic resumes a node.

Every resume (the ladder's give-back, the HealthCheckProgram, the isolator, spares, burn-in,
`medic node resume`, `medic episode close --resume`, `medic check --requalify`) reads the node
from Slurm, asks Medic's drain records whose the drain is (medic_core.drain_book), lets the
decision core decide (remediation.decide_resume), records the resume with its actor and
episode (closing the drain record) BEFORE asking Slurm, and only then resumes. A drain with no
record is never resumed by Medic, whatever its text.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from medic_core.drain_book import DrainBook, Ownership
from medic_core.drain_reason import DrainOutcome, observing
from medic_core.slurm import NodeInfo, SlurmClient, SlurmError
from medic_core.vocabulary import Finding
from remediation.decide import NodeFacts
from remediation.decide_resume import Refusal, ResumeDecision, decide_resume

log = logging.getLogger("medic.remediation")

_OUTCOMES = {
    Refusal.NOT_DRAINED: DrainOutcome.NOT_DRAINED,
    Refusal.NOT_OURS: DrainOutcome.NOT_OURS,
    Refusal.NO_RECORD: DrainOutcome.NOT_OURS,
    Refusal.HELD: DrainOutcome.KEPT,
    Refusal.KEPT: DrainOutcome.KEPT,
}


@dataclass(frozen=True)
class GiveBack:
    outcome: DrainOutcome
    decision: ResumeDecision | None  # None: Slurm does not know the node
    ownership: Ownership | None = None
    recorded_in: str = ""  # where the resume was recorded: "store", "journal" or ""

    @property
    def resumed(self) -> bool:
        return self.outcome is DrainOutcome.RESUMED

    @property
    def why(self) -> str:
        return self.decision.why if self.decision is not None else self.outcome.value

    @property
    def text(self) -> str:
        """One line for logs, events and the CLI."""
        if self.outcome in (DrainOutcome.RESUMED, DrainOutcome.UNKNOWN_NODE):
            return self.outcome.value
        return f"{self.outcome.value}: {self.why}"


def facts_of(info: NodeInfo | None, own: Ownership) -> NodeFacts:
    """The decision core's facts: the node as Slurm shows it, with what Medic's records
    say of its drain."""
    if info is None:
        return NodeFacts(known=False)
    episode = own.record.episode_id if own.record is not None and own.recorded else None
    return NodeFacts(True, info.drained, info.down, info.reason, own.recorded, own.held, episode)


def node_facts(client: SlurmClient, book: DrainBook, node: str) -> tuple[NodeFacts, Ownership]:
    """The node as Slurm shows it now, with whether Medic's records hold its drain."""
    info = client.node(node)
    own = book.ownership(node, info)
    return facts_of(info, own), own


def give_back(
    client: SlurmClient,
    book: DrainBook,
    node: str,
    *,
    actor: str,
    episode_id: int | None = None,
    blocking: Sequence[Finding] = (),
    open_episode: int | None = None,
    rma_open: Sequence[int] = (),
    resolving: int | None = None,
    human: bool = False,
    force: bool = False,
    note: str = "",
    resolving_its_episode: bool = False,
) -> GiveBack:
    """Resume `node` if the decision core says so (see the module's docstring). Raises
    SlurmError when Slurm refuses the resume (the drain is recorded again as Medic's, so
    the next try finds it). `resolving_its_episode`: the caller resolves whichever episode
    the drain was made for (a spare joining the pool at the ladder's give-back)."""
    facts, own = node_facts(client, book, node)
    if not facts.known:
        return GiveBack(DrainOutcome.UNKNOWN_NODE, None, own)
    if resolving_its_episode and resolving is None:
        resolving = facts.drain_episode
    decision = decide_resume(
        facts,
        blocking=blocking,
        open_episode=open_episode,
        rma_open=rma_open,
        resolving=resolving,
        human=human,
        force=force,
    )
    if not decision.resume:
        log.info("%s: not resumed (%s): %s", node, actor, decision.why)
        return GiveBack(_OUTCOMES[decision.refusal], decision, own)
    episode = episode_id if episode_id is not None else resolving
    if episode is None and own.record is not None and own.recorded:
        episode = own.record.episode_id
    why = f"{decision.why}; {note}" if note else decision.why
    # The record's own reason (Slurm may have appended its reboot marks to the one shown).
    reason = own.record.reason if own.record is not None and own.recorded else facts.reason
    where = book.record_resume(node, reason, actor=actor, episode_id=episode, note=why)
    try:
        client.resume(node)
    except SlurmError:
        if own.recorded:  # still drained: the drain stays Medic's for the next try
            book.record_drain(
                node, reason, actor=actor, episode_id=episode, note="the resume failed"
            )
        raise
    if observing(client):
        return GiveBack(DrainOutcome.WOULD_RESUME, decision, own, where)
    log.warning("%s: resumed by %s (%s)", node, actor, why)
    return GiveBack(DrainOutcome.RESUMED, decision, own, where)

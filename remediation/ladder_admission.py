"""The ladder's admission of a fault (remediation.ladder's first concern): gather the facts
(Slurm's node table, the drain cap and Medic's drain records, the open episode, the lemon and
strike history, the fleet's signature), let the decision core decide (remediation.decide)
and record the episode it opens or joins; and Slurm's own drains adopted. Acting on a fault
never waits on the store: without it, the decision is taken on Slurm's facts alone."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from medic_core.drain_book import LADDER, DrainBook
from medic_core.drain_reason import parse_reason
from medic_core.settings import RemediationSettings
from medic_core.slurm import NodeInfo, SlurmClient, SlurmError
from medic_core.vocabulary import Finding, component_of
from remediation import episodes as ep
from remediation.decide import (
    EpisodeMove,
    FaultDecision,
    FaultFacts,
    JobFacts,
    NodeFacts,
    Rails,
    cap_reason,
    decide_adopt,
    decide_fault,
    primary,
)
from remediation.policy import LemonScore, Rung, StrikeScore, fault_family, lemon_episode

log = logging.getLogger("medic.remediation")

JOIN_WINDOW = 60.0  # seconds in which the same fault joins the episode it just closed


class LadderHost(Protocol):
    """What the ladder needs from the node's daemon."""

    def boot_id(self) -> str: ...

    def jobs_running(self) -> bool: ...

    def gpu_busy(self, gpu: int) -> bool: ...

    def release_gpus(self) -> None:
        """Let go of NVML before a GPU reset or a driver reload: a client of the GPU (this
        daemon) makes `nvidia-smi --gpu-reset` refuse and the module unload fail."""

    def reacquire_gpus(self) -> None:
        """Open NVML again after the repair, whatever its outcome."""

    def after_repair(self, gpu: int | None, before: float) -> None:
        """Forget what the repair cleared (XIDs of `gpu`, or of all for None, buffered before
        the monotonic time `before`: one that recurs during the repair still counts)."""

    def verify(self, extra_checks: Sequence[str]) -> list[Finding]: ...

    def event(self, message: str, *, severity: str, fault_class: str, target: str) -> None: ...

    def open_rma(self, episode: ep.Episode, why: str) -> int | None: ...


@dataclass(frozen=True)
class Admission:
    """The decision core's answer to a fault, and the episode it opened or joined."""

    decision: FaultDecision
    episode: ep.Episode | None
    # Why the store could not take part ("" when it did): the decision was taken on Slurm's
    # facts alone and no episode was recorded; the fault is admitted again once the store is
    # back (the daemon's unsynced conditions, written then, are fresh faults to it).
    store_down: str = ""
    slurm_read: bool = True  # Slurm's node table was read: the drain was decided on facts

    @property
    def drain(self) -> bool:
        return self.decision.drain

    @property
    def why(self) -> str:
        return self.decision.why


class LadderAdmission:
    """What `Ladder` does before it drains anything. Its attributes are `Ladder`'s."""

    node: str
    store: ep.EpisodeStore
    slurm: SlurmClient
    host: LadderHost
    settings: RemediationSettings
    book: DrainBook

    # ---- admission: before Medic drains anything --------------------------------------

    def admit(
        self,
        findings: Sequence[Finding],
        jobs: Sequence[JobFacts] = (),
        *,
        requeue_resilient: bool = True,
        again: bool = False,
    ) -> Admission:
        """A fresh fault on this node: gather the facts, let the decision core decide
        (drain, requeue, episode, pause) and record the episode it opens or joins. Runs
        under the store's admission lock, so two nodes never both take the cap's last slot.

        Acting on a fault never waits on the store: when it cannot be read or written (its
        database down, its disk full), the decision is taken on Slurm's facts alone (no open
        episode, pause, lemon or fleet signature known; the cap counts Slurm's drains only,
        without the lock) and no episode is recorded."""
        try:
            with self.store.locked():
                facts = self.fault_facts(
                    findings, jobs, requeue_resilient=requeue_resilient, again=again
                )
                decision = decide_fault(findings, facts)
                episode = self._record(decision, findings, facts.lemon)
                admission = Admission(decision, episode, slurm_read=facts.slurm.known)
        except SlurmError:
            raise
        except Exception as exc:  # the store: down, full, read-only
            store_down = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            facts = self._facts_without_store(findings, jobs, requeue_resilient)
            decision = decide_fault(findings, facts)
            admission = Admission(decision, None, store_down, slurm_read=facts.slurm.known)
            log.warning(
                "%s: the store is unavailable (%s): decided on Slurm's facts alone; the"
                " episode opens when the store is back",
                self.node,
                store_down[:200],
            )
        log.warning(
            "%s: %s: drain=%s %s",
            self.node,
            primary(findings).fault_class,
            decision.drain,
            decision.why,
        )
        return admission

    def _facts_without_store(
        self, findings: Sequence[Finding], jobs: Sequence[JobFacts], requeue_resilient: bool
    ) -> FaultFacts:
        try:
            nodes: list[NodeInfo] | None = self.slurm.nodes()
        except SlurmError as exc:
            log.warning("%s: cannot read Slurm: %s", self.node, exc)
            nodes = None
        info = next((n for n in nodes or () if n.name == self.node), None)
        own = self.book.ownership(self.node, info)
        cap = (
            "cannot read Slurm to apply the drain cap"
            if nodes is None
            else cap_reason(
                nodes,
                self.node,
                self.settings.max_drained_share,
                self.settings.min_drained,
                records=None,  # the store is down: counted by Slurm's reasons, not asked again
            )
        )
        return FaultFacts(
            node=self.node,
            slurm=NodeFacts(True, info.drained, info.down, info.reason, own.recorded, own.held)
            if info is not None
            else NodeFacts(known=False),
            jobs=tuple(jobs),
            rails=Rails(paused="", cap=cap, signature=""),
            enabled=self.settings.enabled,
            requeue_resilient=requeue_resilient,
            first_rung=self.settings.first_rung,
            max_restarts=self.settings.max_restarts,
        )

    def fault_facts(
        self,
        findings: Sequence[Finding],
        jobs: Sequence[JobFacts] = (),
        *,
        requeue_resilient: bool = True,
        again: bool = False,
    ) -> FaultFacts:
        first = primary(findings)
        current = self.store.open_for(self.node)
        handed = None if current is not None else self._just_handed_over(first)
        # One read of Slurm's node table for the node, the cap and the signature (22.05
        # has no one-node JSON read: `node()` reads the whole table anyway).
        try:
            nodes: list[NodeInfo] | None = self.slurm.nodes()
        except SlurmError as exc:
            log.warning("%s: cannot read Slurm: %s", self.node, exc)
            nodes = None
        info = next((n for n in nodes or () if n.name == self.node), None)
        own = self.book.ownership(self.node, info)
        slurm = (
            NodeFacts(True, info.drained, info.down, info.reason, own.recorded, own.held)
            if info is not None
            else NodeFacts(known=False)
        )
        control = self.store.control()
        lemon = self.lemon_score(first)
        strikes = self.strike_score(first) if current is None and handed is None else None
        return FaultFacts(
            node=self.node,
            slurm=slurm,
            jobs=tuple(jobs),
            rails=Rails(
                paused=f"remediation paused by {control.actor}: {control.reason}"
                if control.paused
                else "",
                cap=self._over_cap(nodes),
                signature=""
                if current is not None or handed is not None
                else self._fleet_signature(first.fault_class, nodes or []),
            ),
            open_episode=current.id if current is not None else None,
            handed_over=handed.id if handed is not None else None,
            lemon=lemon.why() if lemon.is_lemon else "",
            strikes=strikes.why() if strikes is not None and strikes.latched else "",
            enabled=self.settings.enabled,
            requeue_resilient=requeue_resilient,
            first_rung=self.settings.first_rung,
            answer_again=again,
            max_restarts=self.settings.max_restarts,
        )

    def _record(
        self, decision: FaultDecision, findings: Sequence[Finding], lemon: str = ""
    ) -> ep.Episode | None:
        """`lemon`: FaultFacts.lemon, kept in the episode (evidence["lemon"]) when the lemon
        rule sent it to RMA, so its ticket says why."""
        if decision.episode is EpisodeMove.JOIN and decision.episode_id is not None:
            return self.store.get(decision.episode_id)
        if decision.episode is not EpisodeMove.OPEN:
            return None
        first = primary(findings)
        if decision.pause and not self.store.control().paused:
            self.store.set_paused(True, decision.pause, "medic")
            self.host.event(
                f"AUTOMATION PAUSED: {decision.pause}",
                severity="CRITICAL",
                fault_class="remediation.paused",
                target="",
            )
            log.critical("remediation paused: %s", decision.pause)
        episode = self.store.open_episode(
            self.node,
            state=decision.state,
            fault_class=first.fault_class,
            target=first.target,
            check=first.check,
            recommendation=(decision.recommendation or first.recommendation).value,
            rung=int(decision.rung or 0),
            message=first.message + (f" ({decision.why})" if decision.why else ""),
            evidence={
                "findings": [f.as_json() for f in findings],
                **({"lemon": f"lemon: {lemon}"} if lemon and decision.rung is Rung.RMA else {}),
            },
        )
        log.warning("episode %d on %s: %s %s", episode.id, self.node, episode.state, decision.why)
        return episode

    def _just_handed_over(self, finding: Finding) -> ep.Episode | None:
        """The same fault reported twice (a sweep and the node's daemon both saw the deep
        check fail) joins the episode the first report closed for a human or an RMA, instead
        of opening a second one within JOIN_WINDOW."""
        closed = self.store.find(node=self.node, states=(ep.NEEDS_HUMAN, ep.RMA))
        if not closed:
            return None
        last = closed[-1]
        age = (self.store.now() - last.updated_at).total_seconds()
        same = (last.fault_class, last.target) == (finding.fault_class, finding.target)
        return last if same and age < JOIN_WINDOW else None

    def drained(self, admission: Admission, outcome: str) -> None:
        """What the drain did: a drain that is not Medic's hands the node to its owner."""
        episode = admission.episode
        if episode is None or not episode.open:
            return
        if "someone else" in outcome:
            self.store.update(
                episode.id, state=ep.NEEDS_HUMAN, message=f"{episode.message}; {outcome}"
            )

    def _over_cap(self, nodes: Sequence[NodeInfo] | None = None) -> str:
        """`nodes`: Slurm's node table if the caller has read it (None: read it here)."""
        if nodes is None:
            try:
                nodes = self.slurm.nodes()
            except SlurmError as exc:
                return f"cannot read Slurm to apply the drain cap: {exc}"
        # Episodes admitted a moment ago whose drain Slurm does not show yet count too:
        # admission runs under the store's lock, so this is never a race.
        pending = {e.node for e in self.store.find(states=ep.DRAINING_STATES)}
        return cap_reason(
            nodes,
            self.node,
            self.settings.max_drained_share,
            self.settings.min_drained,
            pending,
            records=self._drain_holdings(),
        )

    def _drain_holdings(self) -> dict[str, str | None] | None:
        """Medic's drain records by node (Store.drain_holdings); None with the store down:
        the cap then counts by the reasons' text alone."""
        try:
            return self.store.store.drain_holdings()
        except Exception as exc:  # the store down: the cap still holds, by Slurm's text
            log.warning("%s: drain records unread for the cap: %s", self.node, exc)
            return None

    def _fleet_signature(self, fault_class: str, slurm_nodes: Sequence[NodeInfo]) -> str:
        """The same fault class on fleet_signature_nodes nodes within the window, counted
        from Medic's drains that Slurm shows (every node can read them, whatever the store)
        and the store's episodes; never from before the last resume of the pause, so a
        human's resume is not undone by the faults that caused the pause."""
        since = self.store.now() - dt.timedelta(seconds=self.settings.fleet_signature_window)
        control = self.store.control()
        if not control.paused and control.since is not None and control.since > since:
            since = control.since
        recent = self.store.find(since=since)
        nodes = {e.node for e in recent if e.fault_class == fault_class} | {self.node}
        for n in slurm_nodes:
            theirs = parse_reason(n.reason) if (n.drained or n.down) else None
            at = dt.datetime.fromtimestamp(n.reason_time, dt.UTC) if n.reason_time else None
            if theirs is not None and theirs.fault_class == fault_class and at and at >= since:
                nodes.add(n.name)
        if len(nodes) >= self.settings.fleet_signature_nodes:
            return (
                f"{fault_class} on {len(nodes)} nodes within"
                f" {self.settings.fleet_signature_window:g}s ({', '.join(sorted(nodes)[:8])}):"
                " looks fleet-wide (driver rollout? switch?); `medic remediation resume` after"
                " checking"
            )
        return ""

    def lemon_score(self, finding: Finding) -> LemonScore:
        """The lemon rule (remediation.policy.LemonScore) for `finding` about to be admitted:
        the node's episodes of the same component and fault family within lemon_days."""
        days = self.settings.lemon_days
        since = self.store.now() - dt.timedelta(days=days)
        # The window's episodes are enough: an RMA ticket before it changes nothing in it.
        history = [lemon_episode(e) for e in self.store.find(node=self.node, since=since)]
        return LemonScore.of(
            component_of(finding),
            fault_family(finding.fault_class),
            history,
            since=since,
            episodes_limit=self.settings.lemon_episodes,
            failed_limit=self.settings.lemon_failed_requalifications,
            days=days,
        )

    def adopt(self, evidence: Mapping[str, object] | None = None) -> Admission | None:
        """Slurm's own drain of this node (remediation.decide.decide_adopt), taken over: the
        drain recorded as Medic's (the reason exactly as Slurm shows it), then admitted as a
        fault of its own, so the ladder repairs and gives it back like any of its drains.
        `evidence`: what the daemon gathered of the node (the stuck tasks). None when
        nothing was adopted."""
        try:
            info = self.slurm.node(self.node)
        except SlurmError as exc:
            log.warning("%s: cannot read Slurm to adopt its drain: %s", self.node, exc)
            return None
        if info is None:
            return None
        own = self.book.ownership(self.node, info)
        facts = NodeFacts(True, info.drained, info.down, info.reason, own.recorded, own.held)
        current = self.store.open_for(self.node)
        decision = decide_adopt(
            facts,
            enabled=self.settings.adopt,
            open_episode=current.id if current is not None else None,
        )
        if not decision.adopt or decision.finding is None:
            log.info("%s: Slurm's drain not adopted: %s", self.node, decision.why)
            return None
        self.book.record_drain(
            self.node, info.reason, actor=LADDER, note=f"adopted Slurm's {info.reason!r}"
        )
        finding = replace(
            decision.finding, evidence={**decision.finding.evidence, **(evidence or {})}
        )
        admission = self.admit([finding])
        self.host.event(
            f"{decision.why}: {admission.decision.why or admission.decision.recommendation}",
            severity="WARN",
            fault_class=finding.fault_class,
            target="",
        )
        return admission

    def strike_score(self, finding: Finding) -> StrikeScore:
        """The strike rule (remediation.policy.StrikeScore) for `finding` about to be
        admitted: the node's episodes of the same part and family that came back by
        themselves within the rule's window."""
        since = self.store.now() - dt.timedelta(days=1)  # every rule's window is shorter
        history = [lemon_episode(e) for e in self.store.find(node=self.node, since=since)]
        return StrikeScore.of(
            component_of(finding),
            fault_family(finding.fault_class),
            history,
            now=self.store.now(),
        )

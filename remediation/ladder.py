"""The remediation ladder: GPU reset -> driver reload -> reboot -> RMA, one persistent
episode per node, run by the node's own medic-healthd (the node-local rungs need its
devices; the reboot goes through Slurm; the cluster-wide rails read Slurm and the shared
store).

    fault --admit--> waiting_idle --(no jobs)--> acting ------> verifying --clean--> resolved
                |                               |    ^            |
                |                               |    +- retry or next rung (not clean)
                |                               +--> rebooting --(new boot id)--> verifying
                +--> needs_human (cap reached, not our drain, no rung for the fault)
                +--> paused (kill switch, fleet-wide signature)
    last rung failed --> rma (ticket opened; the node stays drained)

Every action's intent is stored before it runs (remediation.episodes), so `tick()` after a
crash continues from facts: a reboot is never asked twice for one decision (the boot id
and Slurm's reboot flags say whether it happened), no step is skipped, and attempts count
from the intent.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from medic_core import proc
from medic_core.drain_book import LADDER, DrainBook
from medic_core.drain_reason import (
    DrainOutcome,
    as_slurm_stores,
    drain_if_allowed,
    format_reason,
    parse_reason,
)
from medic_core.settings import BurnInSettings, RemediationSettings
from medic_core.slurm import NodeInfo, SlurmClient, SlurmError
from medic_core.status import Status
from medic_core.vocabulary import Finding, component_of
from remediation import episodes as ep
from remediation.actions import job_facts
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
    decide_reset_beside_jobs,
    primary,
)
from remediation.isolation import APPLIED, INTENT, RESTORED, RESTORING, gres_count, recorded
from remediation.isolator import IsolationError, Isolator
from remediation.observe import observing, would
from remediation.policy import LemonScore, Rung, StrikeScore, fault_family, lemon_episode
from remediation.step import (
    REBOOT_REFUSED_RETRY,
    REFUSED,
    CapDrain,
    LastStep,
    Move,
    StepDecision,
    StepFacts,
    StepRules,
    decide_step,
    goes_on_in,
    keeps_rma_out,
    rma_reason,
    rma_redrain_reason,
)
from remediation.step import rung_history as rung_history  # re-exported (tests, reports)

if TYPE_CHECKING:
    from pathlib import Path

    from remediation.tickets import NodeRails

log = logging.getLogger("medic.remediation")

JOIN_WINDOW = 60.0  # seconds in which the same fault joins the episode it just closed
REQUALIFY_RETRY = 60.0  # seconds between re-qualification runs of a node back from RMA
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"})
# Added to a reboot step's output when its new boot is seen (`medic report` times the reboot
# from the intent to then): remediation.report.REBOOT_SEEN.
REBOOT_SEEN = "new boot seen"
# `scontrol reboot` refused (slurmctld busy or down, RebootProgram not set) says nothing of
# the node: asked again after REBOOT_REFUSED_RETRY (remediation.step), and after
# REBOOT_REFUSALS refusals in one episode a human looks (Slurm's configuration, not the
# node's hardware: never an RMA).
REBOOT_REFUSALS = 3
LONG_WAIT = "waited over"
UNEXPECTED_REBOOT = "slurm.unexpected_reboot"  # an adopted drain: burnt in as after a reboot
# A GPU reset beside running jobs (_reset_beside_jobs) asks Slurm for the GPU's holders every
# tick for BESIDE_EAGER seconds after the episode last moved, then every BESIDE_EVERY seconds.
BESIDE_EAGER = 60.0
BESIDE_EVERY = 30.0


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


class Ladder:
    # A short spare pool's offer for the node being given back: the text of what was done
    # (it joined), or "" (given back as usual). Set by the daemon (remediation.spares).
    spares: Callable[[], str] | None = None
    # `[remediation.burn_in]`, read at each use (set by the daemon): the verification after a
    # reboot rung, of a failed burn-in's episode and of a node back from RMA adds its checks.
    burn_in: Callable[[], BurnInSettings] | None = None
    # The node's state dir (set by the daemon), where a burn-in pass is mirrored for the
    # prolog without the daemon (remediation/burn_in_marker.py).
    burn_in_state_dir: Callable[[], Path] | None = None
    # Single-GPU isolation (remediation.isolator), `[remediation.isolation]` read at each use
    # (set by the daemon). A GPU-reset episode whose fault policy allows takes the GPU out of
    # the node's GRES once the node is idle (the node serves jobs on the others while the GPU
    # is reset), and the re-qualified GPU comes back (`restore`) instead of the plain resume.
    isolation: Callable[[], Isolator] | None = None
    # Told the node's rails (open episode, RMA tickets, re-qualification) each tick reads
    # (set by the daemon: the launch gate then need not read them again itself).
    on_rails: Callable[[NodeRails], object] | None = None
    # Starts the node's evidence bundle for an episode gone to RMA or needs-human, on its own
    # thread (remediation.evidence; set by the daemon): ("rma" | "needs_human", episode).
    evidence: Callable[[str, ep.Episode], object] | None = None

    def __init__(
        self,
        node: str,
        store: ep.EpisodeStore,
        slurm: SlurmClient,
        host: LadderHost,
        settings: RemediationSettings,
    ) -> None:
        self.node = node
        self.store = store
        self.slurm = slurm
        self.host = host
        self.settings = settings
        self._last_requalify = -REQUALIFY_RETRY
        self._not_isolated: set[int] = set()  # episodes isolation was decided against
        self._told_beside: set[int] = set()  # episodes whose wait for every job was logged
        self._beside_asked: dict[int, dt.datetime] = {}  # episode: when Slurm was last asked
        # Medic's drain records (medic_core.drain_book): every drain the ladder makes is
        # written there first, and it gives back only a drain they hold. The daemon sets
        # one with the node's journal too (kept when the store is down).
        self.book = DrainBook.of(store.store)

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

    # ---- progress ----------------------------------------------------------------------

    def tick(self) -> ep.Episode | None:
        """Move this node's open episode on by what is possible now; safe to call any time,
        in particular right after a restart."""

        rails = hand_over_rails(self.store, self.node, self.on_rails)
        episode = rails.episode
        if keeps_rma_out(episode.state if episode else None, bool(rails.open_tickets)):
            self._keep_rma_out()
        if episode is None:
            return self._requalify_after_rma() if rails.requalify else None
        if episode.state == ep.WAITING_CAP:
            return self._await_cap(episode)
        if self.store.control().paused:
            return episode
        if episode.state == ep.PAUSED:  # the pause was lifted: carry on where it stopped
            episode = self.store.update(episode.id, state=goes_on_in(episode))
            self.host.event(
                f"episode {episode.id}: repairs resumed",
                severity="INFO",
                fault_class=episode.fault_class,
                target=episode.target,
            )
        record = recorded(episode.evidence) if self.isolation is not None else None
        if record is not None and record.state in (INTENT, RESTORING):
            return self._isolation_recover(episode, record.state)
        alone = record is not None and record.state == APPLIED
        if alone and episode.rung != int(Rung.GPU_RESET) and episode.state == ep.WAITING_IDLE:
            self._drain_whole(episode)  # a rung past the GPU's reset needs the whole node
            alone = False
        if episode.state == ep.WAITING_IDLE:
            # With the GPU isolated, the other GPUs' jobs do not hold its reset up (the
            # reset waits only for the GPU itself: _act's gpu_busy); nor, drained, do they
            # hold up a reset beside them (_reset_beside_jobs).
            beside = False
            watch = not observing(self.settings.observe_only, self.slurm)  # none was made to go
            if not alone and watch and self.host.jobs_running():
                if not self._reset_beside_jobs(episode):
                    return self._note_a_long_wait(episode)
                beside = True
            last = LastStep.of(self.store.steps(episode.id))
            decision = decide_step(episode, self._facts(last_step=last))
            if decision.move is Move.WAIT:  # cooling down after a failed step
                return episode
            reset = decision.move is Move.ACT and episode.rung == int(Rung.GPU_RESET)
            if reset and record is None and not beside:
                isolated = self._isolate(episode)
                if isolated is not None:
                    return isolated  # the reset on the next tick, the node back in service
            return self._carry_out(episode, decision)
        if episode.state == ep.ACTING:
            return self._recover_acting(episode)
        if episode.state == ep.REBOOTING:
            return self._await_reboot(episode)
        if episode.state == ep.VERIFYING:
            return self._verify(episode)
        return episode

    def _await_cap(self, episode: ep.Episode) -> ep.Episode:
        """A fault the drain cap kept in service: drain it once the cap frees (the episode
        then goes on as any other), under the admission lock like a fresh fault."""
        with self.store.locked():
            if decide_step(episode, self._facts(cap=self._over_cap())).move is not Move.DRAIN:
                return episode
            reason = format_reason(episode.fault_class, episode.target, "drain cap freed")
            try:
                outcome = drain_if_allowed(
                    self.slurm, self.node, reason, self.book, actor=LADDER, episode_id=episode.id
                )
            except SlurmError as exc:
                log.warning("%s: drain after the cap freed failed: %s", self.node, exc)
                return episode
            drain = CapDrain(outcome is DrainOutcome.NOT_OURS_KEPT, self.store.control().paused)
            decision = decide_step(episode, self._facts(cap="", cap_drain=drain))
            episode = self.store.update(episode.id, state=decision.state)
        self.host.event(
            f"episode {episode.id}: drain cap freed: {outcome.value}",
            severity="WARN",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        return episode

    def _keep_rma_out(self) -> None:
        """Called while the node has an open RMA ticket, which keeps it unschedulable: a
        reboot rung's DOWN, then ReturnToService, or a human's resume must not put it back.
        Drain it again."""
        try:
            info = self.slurm.node(self.node)
            if info is None or info.drained:
                return
            own = self.book.ownership(self.node, info) if info.reason else None
            reason = rma_redrain_reason(
                info.reason,
                own.recorded if own is not None else None,
                parse_reason(info.reason) is not None,
                format_reason("rma.open", "", "RMA ticket open"),
            )
            if reason is None:
                return
            self.book.record_drain(self.node, as_slurm_stores(reason), actor=LADDER)
            self.slurm.drain(self.node, reason)
        except SlurmError as exc:
            log.warning("%s: could not keep the RMA node drained: %s", self.node, exc)
            return
        self.host.event(
            "RMA ticket open: node drained again",
            severity="WARN",
            fault_class="rma.open",
            target="",
        )

    def _note_a_long_wait(self, episode: ep.Episode) -> ep.Episode:
        """Jobs still running `idle_timeout` seconds into the wait: say so once (a WARN event
        and the episode's message). The ladder never kills a job to repair a node: the
        node is drained, so the wait ends when its jobs do, or when a human ends them."""
        waited = (self.store.now() - episode.updated_at).total_seconds()
        if waited < self.settings.idle_timeout or LONG_WAIT in episode.message:
            return episode
        note = f"{LONG_WAIT} {waited:.0f}s for running jobs to end (idle_timeout)"
        self.host.event(
            f"episode {episode.id}: {note}; end them (scancel) to repair now",
            severity="WARN",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        return self.store.update(episode.id, message=f"{episode.message}; {note}")

    def _reset_beside_jobs(self, episode: ep.Episode) -> bool:
        """The episode's GPU reset may go now while jobs run on the node's other GPUs
        (remediation.decide.decide_reset_beside_jobs). The node is drained, so no new job
        can be given the GPU between this look at Slurm's allocation and the reset."""
        if episode.rung != int(Rung.GPU_RESET):
            return False
        # Slurm is asked every tick for the first BESIDE_EAGER seconds (a requeued job leaves
        # its GPU within seconds), then once per BESIDE_EVERY: a job holding the GPU for
        # hours must not cost slurmctld a query every tick from every waiting node.
        now = self.store.now()
        age = (now - episode.updated_at).total_seconds()
        last = self._beside_asked.get(episode.id)
        if age > BESIDE_EAGER and last is not None and (now - last).total_seconds() < BESIDE_EVERY:
            return False
        self._beside_asked[episode.id] = now
        try:
            jobs: list[JobFacts] | None = job_facts(self.slurm, self.node)
        except SlurmError:
            jobs = None
        _, burn_in = self._burn_in_checks(episode)
        why = decide_reset_beside_jobs(
            int(episode.target) if episode.target.isascii() and episode.target.isdigit() else None,
            jobs,
            enabled=self.settings.gpu_reset_in_service,
            whole_node_checks=(*self.settings.requalify_checks, *burn_in),
        )
        if why and episode.id not in self._told_beside:
            self._told_beside.add(episode.id)
            log.info("%s: episode %s: the GPU reset waits: %s", self.node, episode.id, why)
        return not why

    def _facts(
        self,
        *,
        last_step: LastStep | None = None,
        cap: str | None = None,
        cap_drain: CapDrain | None = None,
        reboot_waited: float | None = None,
        findings: tuple[Finding, ...] | None = None,
    ) -> StepFacts:
        """What remediation.step.decide_step reads: the time, [remediation]'s rules and the
        facts the caller gathered."""
        s = self.settings
        trial = (s.dry_run, observing(s.observe_only, self.slurm))
        rules = StepRules(s.attempts, s.cooldown, s.recheck_window, s.reboot_timeout, *trial)
        return StepFacts(
            self.store.now(), rules, last_step, cap, cap_drain, reboot_waited, findings
        )

    def _carry_out(self, episode: ep.Episode, decision: StepDecision) -> ep.Episode:
        """Carry out a decision of remediation.step.decide_step."""
        if decision.move is Move.ACT:
            return self._act(episode)
        if decision.escalate:  # the next rung (the same while it has attempts left), or RMA
            self.host.event(
                decision.event,
                severity="WARN",
                fault_class=episode.fault_class,
                target=episode.target,
            )
            episode = self.store.update(
                episode.id,
                rung=decision.rung,
                state=decision.state,
                failed_requalifications=decision.failed_requalifications,
            )
            return self._rma(episode, decision.why) if decision.rma else episode
        if decision.move is Move.RMA:
            return self._rma(episode, decision.why)
        if decision.resolve:
            return self._resolve(episode)
        if decision.move is Move.NEEDS_HUMAN:
            observed = would(self.slurm, decision.observed, self.node, episode)  # observe only
            if decision.event and not observed:
                self.host.event(
                    decision.event,
                    severity="INFO",
                    fault_class=episode.fault_class,
                    target=episode.target,
                )
            return self._handed_to_human(
                self.store.update(
                    episode.id, state=ep.NEEDS_HUMAN, message=decision.message or episode.message
                )
            )
        if decision.move is Move.SET_STATE:
            return self._handed_to_human(self.store.update(episode.id, state=decision.state))
        return episode

    def _handed_to_human(self, episode: ep.Episode) -> ep.Episode:
        """An episode the decision core gave a human starts its evidence bundle (not in a
        dry run: nvidia-bug-report.sh is no trial's to run)."""
        trial = self.settings.dry_run or observing(self.settings.observe_only, self.slurm)
        wanted = episode.state == ep.NEEDS_HUMAN and not trial
        if self.evidence is not None and wanted:
            self.evidence("needs_human", episode)
        return episode

    def _act(self, episode: ep.Episode) -> ep.Episode:
        """Run the episode's rung (decide_step chose it: a GPU reset names one GPU)."""
        rung = Rung(episode.rung)
        if rung is Rung.REBOOT:
            return self._reboot(episode)
        gpu = int(episode.target) if rung is Rung.GPU_RESET else None
        if gpu is not None:
            if self.host.gpu_busy(gpu):
                return episode  # "only when no process holds it": try again next tick
            argv = [a.format(gpu=gpu, node=self.node) for a in self.settings.gpu_reset]
        else:
            argv = [a.format(node=self.node) for a in self.settings.driver_reload]
        step = self.store.record_intent(episode, rung, rung.word, argv, self.host.boot_id())
        started = time.monotonic()
        self.host.release_gpus()
        try:
            result = proc.run(argv, timeout=self.settings.action_timeout)
        finally:
            self.host.reacquire_gpus()
        state = "done" if result.ok else "failed"
        self.store.finish_step(step.id, state, result.returncode, result.tail())
        self.host.event(
            f"{rung.word} {' '.join(argv)}: {state}"
            + ("" if result.ok else f" ({result.describe_failure()})"),
            severity="WARN",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        if result.ok:
            self.host.after_repair(gpu, started)
        # Verified on the next tick, not at once: a fault the repair did not cure (a GPU
        # that faults again under the first touch) needs a moment to show again.
        return self.store.update(episode.id, state=ep.VERIFYING)

    def _recover_acting(self, episode: ep.Episode) -> ep.Episode:
        """A daemon that died mid-step: the step counts as an attempt (its intent did); judge
        by a fresh verification, never by running it again unasked."""
        steps = self.store.steps(episode.id)
        if steps and steps[-1].state == "intent":
            self.store.finish_step(steps[-1].id, "interrupted", output="daemon restarted")
            if steps[-1].action == Rung.REBOOT.word:
                return self._await_reboot(self.store.update(episode.id, state=ep.REBOOTING))
        return self._verify(self.store.update(episode.id, state=ep.VERIFYING))

    def _reboot(self, episode: ep.Episode) -> ep.Episode:
        reason = format_reason(episode.fault_class, episode.target, "ladder: reboot")
        argv = ["scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", self.node]
        step = self.store.record_intent(episode, Rung.REBOOT, "reboot", argv, self.host.boot_id())
        episode = self.store.update(episode.id, state=ep.REBOOTING)
        # `scontrol reboot ASAP` drains with this reason and leaves it on the DOWN node.
        self.book.record_drain(
            self.node, as_slurm_stores(reason), actor=LADDER, episode_id=episode.id
        )
        try:
            self.slurm.reboot(self.node, reason, nextstate="DOWN")
        except SlurmError as exc:
            self.store.finish_step(step.id, "failed", output=f"{REFUSED}{str(exc)[:1000]}")
            return self._reboot_refused(episode, exc)
        self.store.finish_step(step.id, "done", 0, "asked Slurm")
        self.host.event(
            f"reboot asked of Slurm ({reason})",
            severity="WARN",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        return episode

    def _await_reboot(self, episode: ep.Episode) -> ep.Episode:
        step = next(s for s in reversed(self.store.steps(episode.id)) if s.action == "reboot")
        if self.host.boot_id() != step.boot_id:
            if step.state == "intent":  # asked of Slurm; the daemon died before recording it
                step = replace(step, state="done", output="rebooted (asked before a restart)")
            if REBOOT_SEEN not in step.output:  # the step ends here: its time is the reboot's
                output = f"{step.output}; {REBOOT_SEEN}"
                self.store.finish_step(step.id, step.state, step.returncode, output)
            self.host.event(
                "rebooted", severity="INFO", fault_class=episode.fault_class, target=episode.target
            )
            self._keep_out_until_verified(episode)
            return self._verify(self.store.update(episode.id, state=ep.VERIFYING))
        try:
            node = self.slurm.node(self.node)
        except SlurmError:
            return episode
        pending = node is not None and bool(REBOOT_FLAGS & node.flags)
        if not pending and step.state in ("intent", "interrupted"):
            # Died between the intent and Slurm: no flag and the same boot, so it was never
            # asked. Asking now is the one reboot of this decision, not a second.
            self.store.finish_step(step.id, "interrupted", output="not asked before restart")
            attempts = {**episode.attempts, str(int(Rung.REBOOT)): episode.attempts_at(3) - 1}
            return self._reboot(self.store.update(episode.id, attempts=attempts))
        elapsed = (self.store.now() - step.started_at).total_seconds()
        return self._carry_out(episode, decide_step(episode, self._facts(reboot_waited=elapsed)))

    def _keep_out_until_verified(self, episode: ep.Episode) -> None:
        """Slurm may put a rebooted node back in service before Medic verified it:
        `ReturnToService=2` returns a DOWN node that registers (a reboot past ResumeTimeout
        loses Medic's reason to "reboot timed out" first). Drain it again until verified."""
        reason = format_reason(episode.fault_class, episode.target, "rebooted, verifying")
        try:
            outcome = drain_if_allowed(
                self.slurm, self.node, reason, self.book, actor=LADDER, episode_id=episode.id
            )
        except SlurmError as exc:
            log.warning("%s: could not keep the rebooted node out: %s", self.node, exc)
            return
        if outcome is DrainOutcome.DRAINED:
            self.host.event(
                "rebooted: Slurm put the node back in service before it was verified; drained"
                " again until it is",
                severity="WARN",
                fault_class=episode.fault_class,
                target=episode.target,
            )

    def _reboot_refused(self, episode: ep.Episode, exc: SlurmError) -> ep.Episode:
        refusals = sum(
            1
            for s in self.store.steps(episode.id)
            if s.action == Rung.REBOOT.word and s.output.startswith(REFUSED)
        )
        if refusals >= REBOOT_REFUSALS:
            why = (
                f"Slurm refused the reboot {refusals} times ({exc}): check slurmctld and"
                " RebootProgram, then `medic episode retry`"
            )
            self.host.event(
                why, severity="CRITICAL", fault_class=episode.fault_class, target=episode.target
            )
            return self.store.update(
                episode.id, state=ep.NEEDS_HUMAN, message=f"{episode.message}; {why}"
            )
        self.host.event(
            f"Slurm refused the reboot ({refusals} of {REBOOT_REFUSALS}): {exc}; asked again"
            f" in {REBOOT_REFUSED_RETRY:g}s",
            severity="WARN",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        # The attempt was not made: the node did not reboot.
        attempts = {**episode.attempts, str(int(Rung.REBOOT)): episode.attempts_at(3) - 1}
        return self.store.update(episode.id, attempts=attempts, state=ep.WAITING_IDLE)

    def _verify(self, episode: ep.Episode) -> ep.Episode:
        reason, burn_in = self._burn_in_checks(episode)
        findings = self.host.verify((*self.settings.requalify_checks, *burn_in))
        decision = decide_step(episode, self._facts(findings=tuple(findings)))
        if decision.resolve:
            self._burnt_in(reason, burn_in)
        return self._carry_out(episode, decision)

    def _requalify_after_rma(self) -> ep.Episode | None:
        """Called while a closed RMA ticket (the part replaced) waits for re-qualification:
        it keeps the node out until the node passes the checks a repair must pass; then the
        ticket's flag is cleared, its episode resolved and Medic's drain lifted. A failing
        node is tried again every REQUALIFY_RETRY."""
        from remediation import tickets

        now = time.monotonic()
        if self.store.control().paused or now - self._last_requalify < REQUALIFY_RETRY:
            return None
        self._last_requalify = now
        burn_in = self.burn_in().after_rma if self.burn_in is not None else ()
        findings = self.host.verify((*self.settings.requalify_checks, *burn_in))
        blocking = [f for f in findings if f.status in (Status.CRITICAL, Status.UNKNOWN)]
        rma = [e for e in self.store.find(node=self.node) if e.state == ep.RMA]
        last = rma[-1] if rma else None
        if blocking:
            first = blocking[0]
            self.host.event(
                f"RMA closed, but re-qualification failed: {first.check} "
                f"{first.status.value}: {first.message}; the node stays out",
                severity="WARN",
                fault_class=last.fault_class if last else first.fault_class,
                target=last.target if last else "",
            )
            return None
        flagged = [
            t.id for t in tickets.list_tickets(self.store.store, node=self.node) if t.requalify
        ]
        outcome = None
        if last is not None and last.ticket_id in flagged:
            try:  # before the flags are cleared: if Slurm fails, they stay, to try again
                outcome = self._give_back(last)
            except SlurmError as exc:
                log.warning("%s: re-qualified, but Slurm failed: %s", self.node, exc)
                return None
        self._burnt_in("after_rma", burn_in)
        cleared = tickets.requalified(
            self.store.store, self.node, "medic-healthd", f"{len(findings)} checks passed"
        )
        for episode in rma[:-1]:
            if episode.ticket_id in cleared:
                self.store.update(episode.id, state=ep.RESOLVED)
        if last is not None and last.ticket_id in cleared:
            return self._resolve(last, outcome)  # lifts Medic's drain, never another's
        self.host.event(
            f"RMA ticket(s) {cleared} re-qualified; no episode of Medic's to close",
            severity="INFO",
            fault_class="rma.requalified",
            target="",
        )
        return None

    def _burn_in_checks(self, episode: ep.Episode) -> tuple[str, tuple[str, ...]]:
        """(reason, checks) of burn-in this verification adds (remediation.burn_in)."""
        if self.burn_in is None:
            return "", ()
        from remediation.burn_in_record import ladder_checks

        rebooted = episode.fault_class == UNEXPECTED_REBOOT or any(
            s.action == Rung.REBOOT.word and not s.output.startswith(REFUSED)
            for s in self.store.steps(episode.id)
        )
        return ladder_checks(self.burn_in(), self.store.store, self.node, episode.id, rebooted)

    def _burnt_in(self, reason: str, checks: Sequence[str]) -> None:
        if checks:
            from remediation.burn_in_record import record_pass

            state_dir = self.burn_in_state_dir() if self.burn_in_state_dir else None
            record_pass(self.store.store, self.node, reason, checks, state_dir)

    # ---- single-GPU isolation (remediation.isolator) ----------------------------------

    def _isolate(self, episode: ep.Episode) -> ep.Episode | None:
        """The episode's GPU out of the node's GRES if `[remediation.isolation]` allows; None:
        not isolated (the ladder goes on as before, the node drained whole)."""
        isolator = self.isolation() if self.isolation is not None else None
        if isolator is None or not isolator.settings.enabled or episode.id in self._not_isolated:
            return None
        try:
            info = self.slurm.node(self.node)
        except SlurmError as exc:
            log.warning("%s: no isolation: cannot read Slurm: %s", self.node, exc)
            return None
        total = gres_count(info.gres) if info is not None else None
        try:
            done = isolator.isolate(episode, total) if total else None
        except (IsolationError, SlurmError) as exc:
            return self._isolation_failed(episode, exc)
        if done is None:  # decided once per episode (a GPU still busy retries the reset only)
            self._not_isolated.add(episode.id)
        return done

    def _isolation_recover(self, episode: ep.Episode, state: str) -> ep.Episode:
        """A record left at `intent` (the apply command may not have run) is carried out
        again; one at `restoring` once the node is idle, then the episode resolves."""
        assert self.isolation is not None
        jobs = state == RESTORING and self.host.jobs_running()
        try:
            episode = self.isolation().recover(episode, jobs)
        except (IsolationError, SlurmError) as exc:
            return self._isolation_failed(episode, exc)
        after = recorded(episode.evidence)
        if after is not None and after.state == RESTORED:
            return self._resolve(episode, f"GPU(s) {list(after.gpus)} back in the GRES")
        return episode

    def _restore(self, episode: ep.Episode, isolator: Isolator) -> ep.Episode:
        """Repaired and re-qualified: the isolated GPU(s) come back; the node is drained
        until idle (tick's recover finishes it), then resumed by the isolator."""
        try:
            episode = isolator.restore(episode, self.host.jobs_running())
        except (IsolationError, SlurmError) as exc:
            return self._isolation_failed(episode, exc)
        after = recorded(episode.evidence)
        if after is not None and after.state == RESTORED:
            return self._resolve(episode, f"GPU(s) {list(after.gpus)} back in the GRES")
        return episode

    def _drain_whole(self, episode: ep.Episode) -> None:
        reason = format_reason(episode.fault_class, episode.target, "isolated GPU: next rung")
        try:
            drain_if_allowed(
                self.slurm, self.node, reason, self.book, actor=LADDER, episode_id=episode.id
            )
        except SlurmError as exc:
            log.warning("%s: could not drain the node for the next rung: %s", self.node, exc)

    def _isolation_failed(self, episode: ep.Episode, exc: Exception) -> ep.Episode:
        """The apply command failed or Slurm did not show the count: the node's Slurm
        configuration may be half-changed, which is a human's to look at."""
        why = f"single-GPU isolation failed: {str(exc)[:300]}"
        self.host.event(
            why, severity="CRITICAL", fault_class=episode.fault_class, target=episode.target
        )
        return self.store.update(
            episode.id, state=ep.NEEDS_HUMAN, message=f"{episode.message}; {why}"
        )

    def _resolve(self, episode: ep.Episode, outcome: str | None = None) -> ep.Episode:
        """`outcome`: of `_give_back`, if the caller has given the node back already."""
        record = recorded(episode.evidence) if outcome is None else None
        if record is not None and record.state in (APPLIED, RESTORING) and self.isolation:
            return self._restore(episode, self.isolation())
        if outcome is None:
            try:
                outcome = self._give_back(episode)
            except SlurmError as exc:  # tried again at the next tick; noted once
                note = f"resume: {exc}"
                if note in episode.message:
                    return episode
                return self.store.update(episode.id, message=f"{episode.message}; {note}")
        self.host.event(
            f"repaired and re-qualified: {outcome}",
            severity="INFO",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        return self.store.update(episode.id, state=ep.RESOLVED)

    def _give_back(self, episode: ep.Episode) -> str:
        """Resume the node through the decision core (remediation.give_back): only a drain
        Medic's records hold, never with an RMA ticket open."""
        from remediation import tickets
        from remediation.give_back import give_back

        rma_open = tickets.open_tickets(self.store.store, self.node)
        if rma_open:
            return "kept out: an RMA ticket is open"
        if self.spares is not None:  # a short spare pool takes it (remediation.spares)
            joined = self.spares()
            if joined:
                return joined
        done = give_back(
            self.slurm,
            self.book,
            self.node,
            actor=LADDER,
            episode_id=episode.id,
            resolving=episode.id,
            rma_open=rma_open,
        )
        return done.text

    def _rma(self, episode: ep.Episode, why: str) -> ep.Episode:
        """Open the ticket. `why`: the last rung's failure ("" when none ran); the ticket's
        reason is the lemon rule's, or the rungs tried and that failure, or the policy that
        sends this fault class straight to RMA."""
        why = rma_reason(episode, self.store.steps(episode.id), why, self.settings.first_rung)
        ticket = self.host.open_rma(episode, why)
        self.host.event(
            f"RMA ticket {ticket}: {why or episode.fault_class}",
            severity="CRITICAL",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        episode = self.store.update(episode.id, state=ep.RMA, rung=int(Rung.RMA), ticket_id=ticket)
        if self.evidence is not None:
            self.evidence("rma", episode)
        # The gate learns of the ticket now, not at the next tick: after a reboot rung
        # ReturnToService can put the node back in service before the keep-out drains it
        # again, and a job Slurm places there meanwhile is refused in its prolog.
        hand_over_rails(self.store, self.node, self.on_rails)
        self._keep_rma_out()
        return episode


def hand_over_rails(
    store: ep.EpisodeStore, node: str, on_rails: Callable[[NodeRails], object] | None
) -> NodeRails:
    """Read the node's rails and hand them to the onlooker (the launch gate, which then
    refuses a job on a node with an open RMA ticket without reading the store)."""
    from remediation import tickets

    rails = tickets.read_rails(store.store, node)
    if on_rails is not None:
        try:
            on_rails(rails)
        except Exception:  # an onlooker's failure is its own: the tick goes on
            log.exception("%s: handing the rails over failed", node)
    return rails

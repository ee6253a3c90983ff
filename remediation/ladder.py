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
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from medic_core import proc
from medic_core.drain_book import LADDER, DrainBook
from medic_core.drain_reason import (
    DrainOutcome,
    as_slurm_stores,
    drain_if_allowed,
    format_reason,
)
from medic_core.settings import BurnInSettings, RemediationSettings
from medic_core.slurm import SlurmClient, SlurmError
from medic_core.status import Status
from medic_core.vocabulary import Finding
from remediation import episodes as ep
from remediation.actions import job_facts
from remediation.decide import (
    JobFacts,
    decide_reset_beside_jobs,
)
from remediation.isolation import APPLIED, INTENT, RESTORING, recorded
from remediation.isolator import Isolator
from remediation.observe import observing, would
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
    decide_step,
    goes_on_in,
    keeps_rma_out,
    rma_reason,
)
from remediation.step import rung_history as rung_history  # re-exported (tests, reports)

if TYPE_CHECKING:
    from pathlib import Path

    from remediation.tickets import NodeRails

from remediation.ladder_admission import JOIN_WINDOW as JOIN_WINDOW  # re-exported
from remediation.ladder_admission import Admission as Admission
from remediation.ladder_admission import LadderHost as LadderHost
from remediation.ladder_isolation import LadderIsolation

log = logging.getLogger("medic.remediation")

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
# A GPU reset beside running jobs (_reset_beside_jobs) asks Slurm for the GPU's holders every
# tick for BESIDE_EAGER seconds after the episode last moved, then every BESIDE_EVERY seconds.
BESIDE_EAGER = 60.0
BESIDE_EVERY = 30.0


class Ladder(LadderIsolation):
    """The ladder's progress, tick by tick (admission and isolation are its bases'):
    see the module's docstring."""

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

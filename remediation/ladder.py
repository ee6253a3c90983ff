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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from medic_core import proc
from medic_core.drain_reason import format_reason, is_medic_reason
from medic_core.settings import RemediationSettings
from medic_core.slurm import SlurmClient, SlurmError
from medic_core.status import Status
from medic_core.vocabulary import Finding
from remediation import episodes as ep
from remediation.policy import LemonScore, Rung, after_failure, drain_cap, first_rung

log = logging.getLogger("medic.remediation")

JOIN_WINDOW = 60.0  # seconds in which the same fault joins the episode it just closed
REQUALIFY_RETRY = 60.0  # seconds between re-qualification runs of a node back from RMA
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"})


class LadderHost(Protocol):
    """What the ladder needs from the node's daemon."""

    def boot_id(self) -> str: ...

    def jobs_running(self) -> bool: ...

    def gpu_busy(self, gpu: int) -> bool: ...

    def after_repair(self, gpu: int | None, before: float) -> None:
        """Forget what the repair cleared (XIDs of `gpu`, or of all for None, buffered before
        the monotonic time `before`: one that recurs during the repair still counts) and
        reopen NVML after a driver reload."""

    def verify(self, extra_checks: Sequence[str]) -> list[Finding]: ...

    def event(self, message: str, *, severity: str, fault_class: str, target: str) -> None: ...

    def open_rma(self, episode: ep.Episode, why: str) -> int | None: ...


@dataclass(frozen=True)
class Admission:
    drain: bool  # go ahead and drain (and requeue)
    episode: ep.Episode | None
    why: str


class Ladder:
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

    # ---- admission: before Medic drains anything --------------------------------------

    def admit(self, findings: Sequence[Finding]) -> Admission:
        """A fresh CRITICAL fault on this node: open (or join) its episode and say whether
        draining is allowed (kill switch, blast radius, fleet-wide signature)."""
        with self.store.locked():
            return self._admit(findings)

    def _admit(self, findings: Sequence[Finding]) -> Admission:
        first = findings[0]
        current = self.store.open_for(self.node)
        if current is not None:
            return Admission(True, current, f"joins episode {current.id}")
        handed = self._just_handed_over(first)
        if handed is not None:
            # Whatever the first report decided (a drain, or none past the cap) stands.
            return Admission(False, handed, f"joins episode {handed.id} ({handed.state})")
        recommendation = _recommendation(first)
        rung = first_rung(first.fault_class, recommendation, self.settings.first_rung)
        control = self.store.control()
        state, why = ep.WAITING_IDLE, ""
        if not self.settings.enabled:
            state, why = ep.NEEDS_HUMAN, "remediation disabled in [remediation] enabled"
        elif rung is None:
            state, why = ep.NEEDS_HUMAN, f"no ladder rung for {recommendation!r}: a human looks"
        elif control.paused:
            state, why = ep.PAUSED, f"remediation paused by {control.actor}: {control.reason}"
        signature = self._fleet_signature(first.fault_class)
        if signature:
            self.store.set_paused(True, signature, "medic")
            self.host.event(
                f"AUTOMATION PAUSED: {signature}",
                severity="CRITICAL",
                fault_class="remediation.paused",
                target="",
            )
            log.critical("remediation paused: %s", signature)
            state, why = ep.PAUSED, signature
        cap_reason = self._over_cap()
        if cap_reason and state != ep.PAUSED:
            state, why = ep.NEEDS_HUMAN, cap_reason
        lemon = self.lemon_score()
        if lemon.is_lemon and rung is not None:
            rung, why = Rung.RMA, f"lemon node: {lemon.describe()}"
        episode = self.store.open_episode(
            self.node,
            state=state,
            fault_class=first.fault_class,
            target=first.target,
            check=first.check,
            recommendation=recommendation,
            rung=int(rung or 0),
            message=first.message + (f" ({why})" if why else ""),
            evidence={"findings": [f.__dict__ | {"status": f.status.value} for f in findings]},
        )
        drain = state in (ep.WAITING_IDLE, ep.NEEDS_HUMAN) and not cap_reason
        drain = drain and state != ep.PAUSED and not signature
        log.warning("episode %d on %s: %s %s", episode.id, self.node, state, why)
        return Admission(drain, episode, why or f"starts at {Rung(rung).word if rung else '-'}")

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

    def _over_cap(self) -> str:
        try:
            nodes = self.slurm.nodes()
        except SlurmError as exc:
            return f"cannot read Slurm to apply the drain cap: {exc}"
        me = next((n for n in nodes if n.name == self.node), None)
        if me is None:
            return ""
        for partition in me.partitions or ("",):
            members = [n for n in nodes if partition in n.partitions or not partition]
            cap = drain_cap(
                len(members), self.settings.max_drained_share, self.settings.min_drained
            )
            member_names = {n.name for n in members}
            ours = {
                n.name
                for n in members
                if n.name != self.node
                and (n.drained or "DOWN" in (n.state, *n.flags))
                and is_medic_reason(n.reason)
            }
            # Episodes admitted a moment ago whose drain Slurm does not show yet count too:
            # admission runs under the store's lock, so this is never a race.
            ours |= {
                e.node
                for e in self.store.find(states=ep.DRAINING_STATES)
                if e.node != self.node and e.node in member_names
            }
            if len(ours) >= cap:
                return (
                    f"drain cap reached in partition {partition or '-'}: {len(ours)} of"
                    f" {len(members)} nodes drained by Medic (cap {cap}); left in service"
                )
        return ""

    def _fleet_signature(self, fault_class: str) -> str:
        since = self.store.now() - dt.timedelta(seconds=self.settings.fleet_signature_window)
        recent = self.store.find(since=since)
        nodes = {e.node for e in recent if e.fault_class == fault_class} | {self.node}
        if len(nodes) >= self.settings.fleet_signature_nodes:
            return (
                f"{fault_class} on {len(nodes)} nodes within"
                f" {self.settings.fleet_signature_window:g}s ({', '.join(sorted(nodes)[:8])}):"
                " looks fleet-wide (driver rollout? switch?); `medic remediation resume` after"
                " checking"
            )
        return ""

    def lemon_score(self) -> LemonScore:
        since = self.store.now() - dt.timedelta(days=self.settings.lemon_days)
        recent = self.store.find(node=self.node, since=since)
        return LemonScore(
            episodes_recent=len(recent) + 1,
            failed_requalifications=sum(e.failed_requalifications for e in recent),
            episodes_limit=self.settings.lemon_episodes,
            failed_limit=self.settings.lemon_failed_requalifications,
        )

    # ---- progress ----------------------------------------------------------------------

    def tick(self) -> ep.Episode | None:
        """Move this node's open episode on by what is possible now; safe to call any time,
        in particular right after a restart."""
        episode = self.store.open_for(self.node)
        if episode is None:
            return self._requalify_after_rma()
        if self.store.control().paused or episode.state == ep.PAUSED:
            return episode
        if episode.state == ep.WAITING_IDLE:
            if self.host.jobs_running() or self._cooling_down(episode):
                return episode
            return self._act(episode)
        if episode.state == ep.ACTING:
            return self._recover_acting(episode)
        if episode.state == ep.REBOOTING:
            return self._await_reboot(episode)
        if episode.state == ep.VERIFYING:
            return self._verify(episode)
        return episode

    def _cooling_down(self, episode: ep.Episode) -> bool:
        """A failed step is followed by its rung's cool-down before the next one."""
        steps = self.store.steps(episode.id)
        if not steps or steps[-1].ended_at is None:
            return False
        last = steps[-1]
        ended = last.ended_at
        wait = self.settings.cooldown.get(last.action, 0.0)
        return ended is not None and (self.store.now() - ended).total_seconds() < wait

    def _act(self, episode: ep.Episode) -> ep.Episode:
        rung = Rung(episode.rung)
        if rung is Rung.RMA:
            why = "every rung tried" if episode.first_rung < 4 else "policy: no repair to try"
            return self._rma(episode, why)
        if self.settings.dry_run:
            self.host.event(
                f"dry run: would start {rung.word} for {episode.fault_class}",
                severity="INFO",
                fault_class=episode.fault_class,
                target=episode.target,
            )
            return self.store.update(episode.id, state=ep.NEEDS_HUMAN, message="dry run")
        if rung is Rung.REBOOT:
            return self._reboot(episode)
        gpu = int(episode.target) if episode.target.isdigit() else None
        if rung is Rung.GPU_RESET:
            if gpu is None:  # a node-wide fault: a per-GPU reset does not apply
                return self._escalate(episode, "no single GPU to reset")
            if self.host.gpu_busy(gpu):
                return episode  # "only when no process holds it": try again next tick
            argv = [a.format(gpu=gpu, node=self.node) for a in self.settings.gpu_reset]
        else:
            argv = [a.format(node=self.node) for a in self.settings.driver_reload]
        step = self.store.record_intent(episode, rung, rung.word, argv, self.host.boot_id())
        started = time.monotonic()
        result = proc.run(argv, timeout=self.settings.action_timeout)
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
            self.host.after_repair(gpu if rung is Rung.GPU_RESET else None, started)
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
        try:
            self.slurm.reboot(self.node, reason, nextstate="DOWN")
        except SlurmError as exc:
            self.store.finish_step(step.id, "failed", output=str(exc))
            return self._escalate(episode, f"reboot refused: {exc}")
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
            self.host.event(
                "rebooted", severity="INFO", fault_class=episode.fault_class, target=episode.target
            )
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
            return self._reboot_again_same_attempt(episode)
        elapsed = (self.store.now() - step.started_at).total_seconds()
        if elapsed > self.settings.reboot_timeout:
            return self._escalate(episode, f"no new boot within {elapsed:.0f}s")
        return episode

    def _reboot_again_same_attempt(self, episode: ep.Episode) -> ep.Episode:
        attempts = {**episode.attempts, str(int(Rung.REBOOT)): episode.attempts_at(3) - 1}
        return self._reboot(self.store.update(episode.id, attempts=attempts))

    def _verify(self, episode: ep.Episode) -> ep.Episode:
        findings = self.host.verify(self.settings.requalify_checks)
        blocking = [f for f in findings if f.status in (Status.CRITICAL, Status.UNKNOWN)]
        if not blocking:
            return self._resolve(episode)
        first = blocking[0]
        episode = self.store.update(
            episode.id, failed_requalifications=episode.failed_requalifications + 1
        )
        return self._escalate(episode, f"still {first.status.value}: {first.message}")

    def _requalify_after_rma(self) -> ep.Episode | None:
        """A closed RMA ticket (the part replaced) keeps the node out until it passes the
        checks a repair must pass; then the ticket's flag is cleared, its episode resolved
        and Medic's drain lifted. A failing node is tried again every REQUALIFY_RETRY."""
        from remediation import tickets

        if not tickets.needs_requalification(self.store.store, self.node):
            return None
        now = time.monotonic()
        if self.store.control().paused or now - self._last_requalify < REQUALIFY_RETRY:
            return None
        self._last_requalify = now
        findings = self.host.verify(self.settings.requalify_checks)
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
        cleared = tickets.requalified(
            self.store.store, self.node, "medic-healthd", f"{len(findings)} checks passed"
        )
        for episode in rma[:-1]:
            if episode.ticket_id in cleared:
                self.store.update(episode.id, state=ep.RESOLVED)
        if last is not None and last.ticket_id in cleared:
            return self._resolve(last)  # lifts Medic's drain, never another's
        self.host.event(
            f"RMA ticket(s) {cleared} re-qualified; no episode of Medic's to close",
            severity="INFO",
            fault_class="rma.requalified",
            target="",
        )
        return None

    def _escalate(self, episode: ep.Episode, why: str) -> ep.Episode:
        rung = Rung(episode.rung)
        allowed = self.settings.attempts.get(rung.word, 1)
        nxt = after_failure(rung, episode.attempts_at(rung), allowed)
        self.host.event(
            f"{rung.word} did not repair it ({why}); next: {nxt.word}",
            severity="WARN",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        episode = self.store.update(episode.id, rung=int(nxt), state=ep.WAITING_IDLE)
        if nxt is Rung.RMA:
            return self._rma(episode, why)
        return episode

    def _resolve(self, episode: ep.Episode) -> ep.Episode:
        from medic_core.drain_reason import resume_if_medic

        try:
            outcome = resume_if_medic(self.slurm, self.node).value
        except SlurmError as exc:
            return self.store.update(episode.id, message=f"{episode.message}; resume: {exc}")
        self.host.event(
            f"repaired and re-qualified: {outcome}",
            severity="INFO",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        return self.store.update(episode.id, state=ep.RESOLVED)

    def _rma(self, episode: ep.Episode, why: str) -> ep.Episode:
        ticket = self.host.open_rma(episode, why)
        self.host.event(
            f"RMA ticket {ticket}: {why or episode.fault_class}",
            severity="CRITICAL",
            fault_class=episode.fault_class,
            target=episode.target,
        )
        return self.store.update(episode.id, state=ep.RMA, rung=int(Rung.RMA), ticket_id=ticket)


def _recommendation(finding: Finding) -> str:
    return finding.recommendation or "drain"

"""The remediation ladder's thread in the daemon: repairs take minutes and must not hold up
the checks. It ticks the ladder (remediation.ladder) every few seconds and at once when a
fault arrives, delivers RMA ticket changes to the site's webhook, answers a fresh fault on
Slurm's side (`respond`: drain, requeues, the episode) and answers again what Slurm could not
take, and tends this node's place in the hot-spare pool.

`healthd.ladder_wiring.attach_ladder(daemon)` builds it for a daemon (`LadderDaemon`: what the
ladder's host needs, and the configuration); the daemon hands `respond` its new faults and
starts the thread. The thread also starts and stops the watch over the jobs' progress
heartbeats (healthd.hang_watch), whose findings `healthd.progress_answers` answers through
this thread. Both sides' Slurm clients note what they learn of this node in `seen` (the
metrics read it).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from healthd.checks.base import Result, Status
from healthd.hang_watch import HangWatch
from healthd.ladder_host import HealthDaemon as HostDaemon
from healthd.observing import automatic_slurm, observe_only
from healthd.results import finding_of
from healthd.slurm_seen import SlurmSeen
from medic_core.config import MedicConfig
from medic_core.journal import keep_in_journal
from medic_core.settings import HookSettings, SpareSettings, WebhookSettings
from medic_core.slurm import SlurmError
from medic_core.store import Severity
from medic_core.vocabulary import Finding
from remediation.decide import primary
from remediation.episodes import EpisodeStore
from remediation.ladder import Ladder

if TYPE_CHECKING:  # imported when used: a node without spares or a webhook never loads them
    from remediation.spares import SparePool

log = logging.getLogger("medic.healthd")


class LadderDaemon(HostDaemon, Protocol):
    """What the ladder thread needs of the daemon: what the ladder's host reads, and the
    configuration (for the `[remediation]`, `[hooks]` and webhook settings)."""

    @property
    def config(self) -> MedicConfig: ...

    def latest(self, name: str) -> tuple[float, tuple[Result, ...]] | None: ...


# With no episode open, nothing to answer again and burn-in settled, the ladder looks every
# IDLE_EVERY seconds (a fault wakes it at once): what it then finds without being woken (an
# RMA ticket opened or closed by an admin, a pause lifted) is human-paced.
IDLE_EVERY = 5.0


class LadderThread:
    def __init__(
        self,
        daemon: LadderDaemon,
        ladder: Ladder,
        episodes: EpisodeStore,
        webhook: WebhookSettings | None = None,
        *,
        every: float = 2.0,
        idle_every: float = IDLE_EVERY,
        seen: SlurmSeen | None = None,
    ) -> None:
        self.daemon = daemon
        self.seen = seen or SlurmSeen(daemon.node)  # this node as Slurm last showed it
        self.ladder = ladder
        self.episodes = episodes
        self.webhook = webhook
        self.every = every
        self.idle_every = idle_every
        self.lock = threading.Lock()  # one step at a time: a tick, or an admission
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._unanswered: list[Result] = []  # faults whose answer Slurm could not complete
        self._retry_at = 0.0
        self.hangs: HangWatch | None = None  # the progress watch (attach_ladder sets it)
        self.spares: Callable[[], SparePool] | None = None  # the pool (attach_ladder)
        self._fill_at = 0.0
        self._spare_watch = False  # this node in the spare pool or handed: loop at `every`
        self.burn_in: Any = None  # remediation.burn_in_runner.BurnInRunner (attach_ladder)

    def start(self) -> threading.Thread:
        """Also continues an episode a restart interrupted, and starts the progress watch.
        A node never burnt in is drained first, before the daemon says it is ready."""
        if self.burn_in is not None:
            try:
                self.burn_in.drain_first()
            except Exception:
                log.exception("burn-in drain at start-up failed")
        thread = threading.Thread(target=self.loop, name="ladder", daemon=True)
        thread.start()
        if self.hangs is not None:
            self.hangs.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()
        if self.hangs is not None:
            self.hangs.stop()

    def loop(self) -> None:
        """The ladder's own thread: repairs take minutes and must not hold up the checks."""
        failing = ""  # the failure every tick repeats (the store down): logged once
        while not self._stop.is_set():
            if self.burn_in is not None:  # before the ladder: a node never burnt in stays out
                try:
                    with self.lock:
                        self.burn_in.tick()
                except Exception:
                    log.exception("burn-in step failed")
            quiet = False
            try:
                with self.lock:
                    quiet = self.ladder.tick() is None
            except Exception as exc:
                first = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
                if first != failing:
                    log.exception("remediation step failed (logged once while it repeats)")
                failing = first
            else:
                if failing:
                    log.warning("remediation steps work again")
                failing = ""
            try:
                self.fill_pool()
            except Exception:
                log.exception("filling the spare pool failed")
            try:
                self.retry_unanswered()
            except Exception:
                log.exception("answering a fault again failed")
            if self.webhook is not None:  # RMA ticket changes to the site's ticketing system
                try:
                    from remediation.webhook import deliver_pending

                    deliver_pending(self.daemon.store, self.webhook)
                except Exception:
                    log.exception("webhook delivery failed")
            quiet = quiet and not self._unanswered and not self._spare_watch
            quiet = quiet and (self.burn_in is None or self.burn_in.settled())
            self.wake.wait(self.idle_every if quiet else self.every)
            self.wake.clear()

    def respond(self, faults: list[Result], again: bool = False) -> None:
        """Slurm's side of a fresh fault: the ladder gathers the facts, the decision core
        (remediation.decide) decides drain, requeues and episode, and remediation.actions
        carries it out; each outcome is an event.

        An answer Slurm could not complete (slurmctld down: the jobs or the node table
        unreadable, a drain or requeue refused) is tried again every RETRY_SECONDS by the
        ladder's thread while the fault is still what the checks report."""
        try:
            complete = self._respond(faults, again)
        except SlurmError as exc:
            log.warning("answering %s: Slurm failed: %s", _classes(faults), exc)
            complete = False
        with self.lock:
            if complete:
                self._unanswered = [f for f in self._unanswered if not _same_fault(f, faults)]
            else:
                kept = [f for f in self._unanswered if not _same_fault(f, faults)]
                self._unanswered = kept + list(faults)
                self._retry_at = time.monotonic() + RETRY_SECONDS
        self.wake.set()

    def _respond(self, faults: list[Result], again: bool) -> bool:
        from remediation.actions import carry_out, job_facts, start_releaser

        daemon = self.daemon
        # medic report: when Medic knew (a retry's is later) and when it happened (fault_at).
        known = {} if again else {"known_at": dt.datetime.now(dt.UTC).isoformat()}
        settings = HookSettings.from_config(daemon.config)
        findings = [finding_of(r) for r in faults]
        client = self.seen.wrap(automatic_slurm(daemon, settings, "daemon"))
        jobs_read = True
        with self.lock:
            try:
                jobs = job_facts(client, daemon.node)
            except SlurmError as exc:
                log.warning("cannot read the jobs on %s: %s", daemon.node, exc)
                jobs, jobs_read = [], False
            admission = self.ladder.admit(
                findings, jobs, requeue_resilient=settings.requeue_resilient, again=again
            )
            decision = admission.decision

            def make_eligible(job_id: str, restarts: int) -> None:
                self.hand_spare(job_id, restarts)  # before the job is eligible again
                if settings.release_held:
                    start_releaser(daemon.config, job_id, restarts, requeued=True)

            episode_id = admission.episode.id if admission.episode is not None else None
            drained, actions = carry_out(
                client,
                daemon.node,
                decision,
                make_eligible,
                book=self.ladder.book,
                episode_id=episode_id,
            )
            if drained is not None and not admission.store_down:
                self.ladder.drained(admission, drained.value)
        now = dt.datetime.now(dt.UTC)  # when the drain and requeues were done (medic report)
        first = primary(findings)
        happened = [
            str(r.evidence["fault_at"])
            for r in faults
            if r.fault_class == first.fault_class and r.evidence.get("fault_at")
        ]
        if happened:  # ISO times in UTC (healthd.kmsg.wall_time): the first sorts first
            known["fault_at"] = min(happened)
        outcome = drained.value if drained else f"not drained: {decision.why}"
        self.event(
            now,
            kind="job_action",
            severity=Severity.CRITICAL if first.status is Status.CRITICAL else Severity.WARN,
            source="healthd",
            message=f"{first.fault_class}: {outcome}",
            fault_class=first.fault_class,
            target=first.target,
            evidence={"drain": drained.value if drained else None, "why": decision.why},
        )
        for action in actions:
            log.warning("job %s: %s: %s", action.job_id, action.action, action.detail)
            self.event(
                action.at or now,
                kind="job_action",
                severity=Severity.WARN,
                source="healthd",
                message=action.detail,
                fault_class=first.fault_class,
                target=f"job:{action.job_id}",
                evidence={"action": action.action, "job_id": action.job_id, **known},
            )
        failed = any(a.action == "requeue_failed" for a in actions)
        return jobs_read and admission.slurm_read and not failed

    def hand_spare(self, job_id: str, restarts: int) -> None:
        """A spare from the pool for a job just requeued off this node, when no healthy
        node is free for it (remediation.spares); never raises into the fault's answer."""
        if self.spares is None:
            return
        try:
            handed = self.spares().hand_over(job_id, restarts)
        except Exception:
            log.exception("job %s: handing a spare failed", job_id)
            return
        if handed.node:
            log.warning("job %s: spare %s handed (%s)", job_id, handed.node, handed.reservation)
        else:
            log.info("job %s: no spare handed: %s", job_id, handed.why)

    def adopt(self) -> str:
        """Slurm's own drain of this node, taken over if [remediation] adopt says so (the
        HealthCheckProgram asks, having seen one: socket op "adopt"); what became of it.
        A "Kill task failed" keeps the stuck tasks as evidence before the reboot."""
        from healthd.stuck_tasks import stuck_tasks

        evidence = {"stuck_tasks": stuck_tasks(self.daemon.ctx.roots.proc)}
        with self.lock:
            admission = self.ladder.adopt(evidence)
        self.wake.set()
        if admission is None or admission.episode is None:
            return "not adopted"
        return f"adopted: episode {admission.episode.id} {admission.episode.state}"

    def guard_launch(self, job_id: str) -> Finding | None:
        """A job about to start on this node (the launch gate, in its prolog): a handed
        spare refuses it unless it is the run it was handed to (SparePool.guard_launch):
        the finding the gate refuses the launch for, or None."""
        # Not this thread's `_spare_watch`, which lags a join by a loop: the pool's own
        # note (SparePool.watching), set the moment this node joins or is seen handed.
        return self.spares().guard_launch(job_id) if self.spares is not None else None

    def fill_pool(self) -> None:
        """This node, listed in [remediation.spares] nodes and idle in service, joins a
        short pool after the deep tier; looked at every FILL_SECONDS."""
        if self.spares is None:
            return
        spares = self.spares()
        spares.tend()  # this node as a handed spare: bound to the run it was handed to
        self._spare_watch = spares.watching()
        if time.monotonic() < self._fill_at:
            return
        self._fill_at = time.monotonic() + FILL_SECONDS
        node = self.daemon.node
        listed = node in SpareSettings.from_config(self.daemon.config).nodes
        if not listed or observe_only(self.daemon):  # observe only: a reservation changes Slurm
            return  # (not listed: the pool itself is not even made)
        pool = self.spares()
        if self.episodes.open_for(node) is not None:
            return
        from remediation.spares import idle_in_service

        try:
            if idle_in_service(pool.slurm.node(node)) and not pool.wants(node):
                pool.join(node, self.deep_findings)
                self._spare_watch = pool.watching()  # may be handed from now on
        except SlurmError as exc:
            log.info("%s: not taken as a spare: %s", node, exc)

    def deep_findings(self) -> list[Finding]:
        """What a spare must pass: the checks a repair passes, then the deep tier (or
        [remediation.spares] checks)."""
        from healthd.checks.base import Tier
        from healthd.results import result_json

        checks = self.spares().settings.checks if self.spares is not None else ()
        found = list(self.ladder.host.verify(checks))
        if not checks:
            report = self.daemon.run_checks(tier=Tier.DEEP)
            found += [Finding.from_json(result_json(r)) for r in report.results]
        return found

    def event(self, at: dt.datetime, **event: Any) -> None:
        """An event into the store, or into the node's journal when the store refuses it
        (replayed, with its time, once the store is back)."""
        daemon = self.daemon
        try:
            daemon.store.add_event(node=daemon.node, at=at, **event)
        except Exception as exc:  # the store: down, full, read-only
            keep_in_journal(
                daemon.config,
                at,
                event,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )

    def retry_unanswered(self) -> None:
        """Answer again the faults Slurm could not take when they came, if still reported."""
        with self.lock:
            if not self._unanswered or time.monotonic() < self._retry_at:
                return
            waiting, self._unanswered = self._unanswered, []
        current = [f for f in waiting if self._still_reported(f)]
        if current:
            log.info("answering %s again (Slurm failed before)", _classes(current))
            self.respond(current, again=True)

    def _still_reported(self, fault: Result) -> bool:
        latest = self.daemon.latest(fault.check)
        if latest is None:
            return True
        return any(
            (r.target or "") == (fault.target or "") and r.status is fault.status for r in latest[1]
        )


RETRY_SECONDS = 5.0  # an answer Slurm refused (slurmctld down) is tried again this often
FILL_SECONDS = 30.0  # a listed spare looks whether the pool wants it this often


def _same_fault(fault: Result, faults: Sequence[Result]) -> bool:
    return any((f.check, f.target) == (fault.check, fault.target) for f in faults)


def _classes(faults: Sequence[Result]) -> str:
    return ", ".join(sorted({f.fault_class or f.check for f in faults}))

"""The remediation ladder's thread in the daemon: repairs take minutes and must not hold up
the checks. It ticks the ladder (remediation.ladder) every few seconds and at once when a
fault arrives, delivers RMA ticket changes to the site's webhook, and answers a fresh fault
on Slurm's side (`respond`: drain, requeues, the episode).

`attach_ladder(daemon)` builds it for a daemon (`LadderDaemon`: what the ladder's host needs,
and the configuration); the daemon hands `respond` its new faults and starts the thread. The
thread also owns the watch over the jobs' progress heartbeats (healthd.hang_watch), started
and stopped with it: a hung job is a job fault, answered by `respond_hang` through the same
decision core (requeue from the last checkpoint, charged once to the restart budget; the
node is not drained).
Both sides' Slurm clients note what they learn of this node in `seen` (the metrics read it).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from healthd.checks.base import Result, Status
from healthd.hang import HangSettings, Pace, StragglerSettings, repeat_straggler
from healthd.hang_watch import Hang, HangWatch, Straggler, WatchSettings
from healthd.jobs import SpoolJobState
from healthd.ladder_host import DaemonLadderHost
from healthd.ladder_host import HealthDaemon as HostDaemon
from healthd.observing import automatic_slurm, observe_only
from healthd.results import finding_of
from healthd.slurm_seen import SlurmSeen
from medic_core.config import MedicConfig
from medic_core.journal import keep_in_journal
from medic_core.settings import (
    DaemonSettings,
    HookSettings,
    RemediationSettings,
    SpareSettings,
    WebhookSettings,
)
from medic_core.slurm import SlurmError
from medic_core.store import Severity
from medic_core.vocabulary import Finding, Recommendation
from remediation.decide import FaultFacts, NodeFacts, decide_fault, primary
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
        self._event(
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
            self._event(
                now,
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

    def respond_hang(self, hang: Hang) -> bool:
        """A hung job (healthd.hang_watch): the decision core decides as for any fault that
        asks the application to restart (RESTART_APP, not CRITICAL: no drain, no episode)
        with this one job as the facts: requeued if resilient, within its budget, charged
        once per run in its ledger; the releaser makes it eligible at once. The hang and
        each action are events. False when Slurm could not complete the answer."""
        from remediation.actions import carry_out, job_fact, start_releaser

        daemon = self.daemon
        verdict = hang.verdict
        seen = dt.datetime.now(dt.UTC)  # medic report: known now, stalled since the last step
        known = {
            "known_at": seen.isoformat(),
            "fault_at": (seen - dt.timedelta(seconds=verdict.stalled)).isoformat(),
        }
        settings = HookSettings.from_config(daemon.config)
        client = self.seen.wrap(automatic_slurm(daemon, settings, "daemon"))
        try:
            info = next(
                (j for j in client.jobs_on(daemon.node) if j.job_id == verdict.job_id), None
            )
        except SlurmError as exc:
            log.warning("hang of job %s: cannot read the jobs on %s: %s", verdict.job_id,
                        daemon.node, exc)  # fmt: skip
            return False
        if info is None:
            return True  # gone meanwhile: nothing to answer
        owner_uid = _uid_of(info.user)
        if hang.owner is None or hang.owner not in (owner_uid, 0):
            log.warning("job %s: heartbeat owned by uid %s, not by the job's user %s: ignored",
                        verdict.job_id, hang.owner, info.user)  # fmt: skip
            return True
        finding = Finding(
            check="job_progress",
            status=Status.WARN,
            fault_class="job.hang",
            target=f"job:{verdict.job_id}",
            message=f"no progress for {verdict.stalled:.0f}s at step {verdict.step}",
            recommendation=Recommendation.RESTART_APP,
        )
        facts = FaultFacts(
            node=daemon.node,
            slurm=NodeFacts(),
            jobs=(job_fact(info, daemon.node),),
            requeue_resilient=settings.requeue_resilient,
            max_restarts=RemediationSettings.from_config(daemon.config).max_restarts,
        )
        with self.lock:
            decision = decide_fault([finding], facts)

            def make_eligible(job_id: str, restarts: int) -> None:
                start_releaser(daemon.config, job_id, restarts, requeued=True)

            after = make_eligible if settings.release_held else None
            _, actions = carry_out(client, daemon.node, decision, after)
        now = dt.datetime.now(dt.UTC)
        evidence: dict[str, Any] = {
            "action": "hang",
            "job_id": verdict.job_id,
            "step": verdict.step,
            "stalled_s": round(verdict.stalled, 3),
            "threshold_s": round(verdict.threshold or 0.0, 3),
            "median_step_s": round(verdict.median or 0.0, 6),
            "steps_timed": verdict.steps_timed,
            "pid": hang.pid,
            "evidence_s": round(hang.evidence_s, 3),
            "drain": None,
            "why": decision.why,
            **hang.evidence.to_json(),
        }
        self._event(
            now,
            kind="job_action",
            severity=Severity.WARN,
            source="healthd",
            message=verdict.describe(),
            fault_class="job.hang",
            target=f"job:{verdict.job_id}",
            evidence=evidence,
        )
        for action in actions:
            log.warning("job %s: %s: %s", action.job_id, action.action, action.detail)
            self._event(
                now,
                kind="job_action",
                severity=Severity.WARN,
                source="healthd",
                message=action.detail,
                fault_class="job.hang",
                target=f"job:{action.job_id}",
                evidence={"action": action.action, "job_id": action.job_id, **known},
            )
        return not any(a.action == "requeue_failed" for a in actions)

    def compare_pace(self, mine: Pace, window: float) -> list[Pace] | None:
        """Share this node's pace of a job (a `job_pace` INFO event) and return the latest
        pace of each of the job's other nodes from the last `window` seconds (the store's
        newest DEFAULT_EVENTS_LIMIT `job_pace` events). None when the store cannot say."""
        daemon = self.daemon
        now = dt.datetime.now(dt.UTC)
        target = f"job:{mine.job_id}"
        try:
            daemon.store.add_event(
                node=daemon.node,
                at=now,
                kind="job_pace",
                severity=Severity.INFO,
                source="healthd",
                message=f"job {mine.job_id}: {mine.basis} {mine.seconds:.6f}s",
                target=target,
                evidence={"pace_s": mine.seconds, "basis": mine.basis, "steps": mine.steps},
            )
            events = daemon.store.events(since=now - dt.timedelta(seconds=window), kind="job_pace")
        except Exception as exc:
            log.debug("job %s: pace not shared: %s", mine.job_id, exc)
            return None
        latest: dict[str, Pace] = {}
        for e in events:  # newest first
            if e.target != target or e.node == daemon.node or e.node in latest:
                continue
            try:
                seconds = float(e.evidence["pace_s"])
                basis, steps = str(e.evidence["basis"]), int(e.evidence["steps"])
            except (KeyError, TypeError, ValueError):
                continue
            latest[e.node] = Pace(mine.job_id, seconds, basis, steps)
        return list(latest.values())

    def report_straggler(self, found: Straggler) -> None:
        """This node is slower than the job's other nodes: an event (report only)."""
        pace = found.pace
        others = [round(o.seconds, 6) for o in found.others]
        self._event(
            dt.datetime.now(dt.UTC),
            kind="straggler",
            severity=Severity.WARN,
            source="healthd",
            message=(
                f"{found.node} is a straggler in job {pace.job_id}: {pace.basis} time "
                f"{pace.seconds:.3f}s, {found.times:.2f}x the median of its other nodes"
            ),
            fault_class="node.straggler",
            target=f"job:{pace.job_id}",
            evidence={
                "job_id": pace.job_id,
                "basis": pace.basis,
                "pace_s": round(pace.seconds, 6),
                "others_s": others,
                "times": round(found.times, 3),
            },
        )
        self._drain_repeat_straggler(found)

    def _drain_repeat_straggler(self, found: Straggler) -> None:
        """A node that was a straggler in `straggler_drain_jobs` jobs within
        `straggler_drain_days`: a DRAIN_AFTER_JOB fault through the usual answer (the
        decision core drains it after its running jobs, nothing requeued; the ladder takes
        it from there: a reboot, then the re-qualification checks)."""
        daemon, pace = self.daemon, found.pace
        s = DaemonSettings.from_config(daemon.config)
        if s.straggler_drain_jobs <= 0:
            return
        since = dt.datetime.now(dt.UTC) - dt.timedelta(days=s.straggler_drain_days)
        try:
            reports = daemon.store.events(daemon.node, since=since, kind="straggler")
        except Exception as exc:  # the store: down, full; this report alone counts then
            log.warning("stragglers: earlier reports of %s unknown: %s", daemon.node, exc)
            reports = []
        jobs = {str(e.evidence.get("job_id") or e.target) for e in reports} | {pace.job_id}
        if not repeat_straggler(jobs, s.straggler_drain_jobs):
            return
        message = (
            f"a straggler in {len(jobs)} jobs within {s.straggler_drain_days:g} days; last"
            f" job {pace.job_id}: {found.times:.2f}x the median of its other nodes"
        )
        evidence = {"jobs": sorted(jobs)[-20:], "last_job": pace.job_id, "times": found.times}
        fault = Result(
            "job_pace", Status.WARN, "node.straggler", None, message, evidence,
            Recommendation.DRAIN_AFTER_JOB,
        )  # fmt: skip
        self.respond([fault])

    def _event(self, at: dt.datetime, **event: Any) -> None:
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


def _uid_of(user: str) -> int | None:
    """The uid of a Slurm job's user name (squeue may give a number for an unknown user)."""
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return int(user) if user.isascii() and user.isdigit() else None


def _same_fault(fault: Result, faults: Sequence[Result]) -> bool:
    return any((f.check, f.target) == (fault.check, fault.target) for f in faults)


def _classes(faults: Sequence[Result]) -> str:
    return ", ".join(sorted({f.fault_class or f.check for f in faults}))


def attach_ladder(daemon: LadderDaemon) -> LadderThread:
    """The ladder for this node, with the daemon as its host and Slurm as the hooks see it."""
    settings = RemediationSettings.from_config(daemon.config)
    webhook = WebhookSettings.from_config(daemon.config)
    hooks = HookSettings.from_config(daemon.config)
    episodes = EpisodeStore(daemon.store)
    seen = SlurmSeen(daemon.node)
    ladder = Ladder(
        daemon.node,
        episodes,
        seen.wrap(automatic_slurm(daemon, hooks, "ladder")),
        DaemonLadderHost(daemon, episodes),
        settings,
    )
    from medic_core.drain_book import DrainBook

    # Medic's drain records, read by the give-back, the isolator and Slurm view
    ladder.book = DrainBook.of(daemon.store, daemon.config.paths, lambda: observe_only(daemon))
    seen.owns = lambda info: ladder.book.ownership(daemon.node, info).recorded
    thread = LadderThread(daemon, ladder, episodes, webhook, seen=seen)
    attach_spares(daemon, ladder, thread)
    attach_burn_in(daemon, ladder, thread)
    attach_isolation(daemon, ladder)
    from healthd.evidence_sources import attach_evidence

    attach_evidence(daemon, ladder)  # bundles on RMA and needs-human (remediation.evidence)
    thread.hangs = watch_hangs(daemon, thread)
    return thread


def attach_burn_in(daemon: LadderDaemon, ladder: Ladder, thread: LadderThread) -> None:
    """Burn-in (remediation.burn_in), `[remediation.burn_in]` read at every use."""
    from medic_core.settings import BurnInSettings
    from remediation.burn_in_runner import BurnInRunner

    def settings() -> BurnInSettings:
        return BurnInSettings.from_config(daemon.config)

    def state_dir() -> Path:
        return daemon.config.paths.state_dir

    ladder.burn_in = settings
    ladder.burn_in_state_dir = state_dir
    thread.burn_in = BurnInRunner(ladder, settings, state_dir=state_dir)


def attach_isolation(daemon: LadderDaemon, ladder: Ladder) -> None:
    """Single-GPU isolation (remediation.isolator), `[remediation.isolation]` read at every
    use: off (the default), the ladder decides none; a record already made is still
    recovered and restored (only GPUs in Medic's own record)."""
    from medic_core.settings import IsolationSettings
    from remediation.isolator import Isolator

    def event(message: str, severity: str) -> None:
        ladder.host.event(message, severity=severity, fault_class="gpu.isolation", target="")

    def isolator() -> Isolator:
        settings = IsolationSettings.from_config(daemon.config)
        return Isolator(
            daemon.node, ladder.store, ladder.slurm, settings, event=event, book=ladder.book
        )

    ladder.isolation = isolator


def attach_spares(daemon: LadderDaemon, ladder: Ladder, thread: LadderThread) -> None:
    """Hot spares (remediation.spares), with `[remediation.spares]` read at every use (a
    reload applies at the next): the thread hands spares and fills the pool from listed
    nodes; the ladder offers a repaired node to a short pool before giving it back."""
    from remediation.actions import slurm_env
    from remediation.spares import SparePool, SparesSlurm

    def pool() -> SparePool:
        hooks = HookSettings.from_config(daemon.config)
        slurm = SparesSlurm(env=slurm_env(daemon.config), timeout=hooks.slurm_timeout)
        grace = hooks.launch_budget + 5.0  # the prolog's budget, its actions, slurmctld
        return SparePool(SpareSettings.from_config(daemon.config), slurm, daemon.store,
                         daemon.node, prolog_grace=grace)  # fmt: skip

    def offer() -> str:
        spares = pool()
        if spares.settings.size <= 0:
            return ""
        try:
            return spares.join(daemon.node, thread.deep_findings)
        except SlurmError as exc:  # given back as usual
            log.warning("%s: not taken as a spare: %s", daemon.node, exc)
            return ""

    thread.spares = pool
    ladder.spares = offer


def watch_hangs(daemon: LadderDaemon, thread: LadderThread) -> HangWatch:
    """The progress watch, reading `[healthd] hang_*` and `progress_dir` from the daemon's
    configuration at every look (a reload applies at the next one)."""
    node = daemon.node
    spool: list[Path] = []  # slurmd's spool as the last look's settings name it
    # (the configuration they were read from, the settings): read again only after a reload
    # replaced the configuration, not at every look.
    read: list[tuple[object, WatchSettings]] = []

    def settings() -> WatchSettings:
        config = daemon.config
        if read and read[0][0] is config:
            return read[0][1]
        s = DaemonSettings.from_config(config)
        spool[:] = [Path(s.slurmd_spool_dir.replace("%n", node).replace("{node}", node))]
        watch = WatchSettings(
            enabled=s.hang_detection,
            hang=HangSettings(
                factor=s.hang_factor,
                floor=s.hang_floor,
                window=s.hang_window,
                min_steps=s.hang_min_steps,
            ),
            directory=Path(s.progress_dir),
            poll=s.hang_poll,
            py_spy_timeout=s.hang_py_spy_timeout,
            straggler=StragglerSettings(ratio=s.straggler_ratio, repeats=s.straggler_repeats),
            straggler_every=s.straggler_every,
        )
        read[:] = [(config, watch)]
        return watch

    def job_ids() -> tuple[str, ...] | None:
        return SpoolJobState(spool[0], node).job_ids() if spool else None

    plumbing = getattr(daemon, "gpu", None)  # the daemon's NVML (None on a CPU node)
    return HangWatch(
        node,
        settings,
        job_ids,
        thread.respond_hang,
        proc_root=daemon.config.paths.proc,
        gpus=plumbing.client if plumbing is not None else None,
        compare=thread.compare_pace,
        report=thread.report_straggler,
    )

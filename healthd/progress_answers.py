"""The answers to what the watch over the jobs' progress heartbeats finds (healthd.hang_watch),
given through the ladder's thread (its lock, its Slurm client, its events, its `respond`).

A hung job is a job fault, answered by `respond_hang` through the decision core (requeue from
the last checkpoint, charged once to the restart budget; the node is not drained). This node's
pace of a job is shared through the store and compared with its other nodes'
(`compare_pace`); a straggler is reported, and a repeat straggler drained after its jobs
(`report_straggler`). `watch_hangs` builds the watch, its settings read from the daemon's
configuration at every look.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

from healthd.checks.base import Result, Status
from healthd.hang import HangSettings, Pace, StragglerSettings, repeat_straggler
from healthd.hang_watch import Hang, HangWatch, Straggler, WatchSettings
from healthd.jobs import SpoolJobState
from healthd.ladder_thread import LadderDaemon, LadderThread
from healthd.observing import automatic_slurm
from medic_core.settings import DaemonSettings, HookSettings, RemediationSettings
from medic_core.slurm import SlurmError
from medic_core.store import Severity
from medic_core.vocabulary import Finding, Recommendation
from remediation.decide import FaultFacts, NodeFacts, decide_fault

log = logging.getLogger("medic.healthd")


class ProgressAnswers:
    """The ladder thread's answers to the progress watch: hangs, paces and stragglers."""

    def __init__(self, thread: LadderThread) -> None:
        self.thread = thread
        self.daemon = thread.daemon

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
        client = self.thread.seen.wrap(automatic_slurm(daemon, settings, "daemon"))
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
        with self.thread.lock:
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
        self.thread.event(
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
            self.thread.event(
                action.at or now,
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
        self.thread.event(
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
        self.thread.respond([fault])


def _uid_of(user: str) -> int | None:
    """The uid of a Slurm job's user name (squeue may give a number for an unknown user)."""
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return int(user) if user.isascii() and user.isdigit() else None


def watch_hangs(daemon: LadderDaemon, answers: ProgressAnswers) -> HangWatch:
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
        answers.respond_hang,
        proc_root=daemon.config.paths.proc,
        gpus=plumbing.client if plumbing is not None else None,
        compare=answers.compare_pace,
        report=answers.report_straggler,
    )

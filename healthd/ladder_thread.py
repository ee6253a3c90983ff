"""The remediation ladder's thread in the daemon: repairs take minutes and must not hold up
the checks. It ticks the ladder (remediation.ladder) every few seconds and at once when a
fault arrives, delivers RMA ticket changes to the site's webhook, and answers a fresh fault
on Slurm's side (`respond`: drain, requeues, the episode).

`attach_ladder(daemon)` builds it for a daemon (`LadderDaemon`: what the ladder's host needs,
and the configuration); the daemon hands `respond` its new faults and starts the thread.
Both sides' Slurm clients note what they learn of this node in `seen` (the metrics read it).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Protocol

from healthd.checks.base import Result, Status
from healthd.ladder_host import DaemonLadderHost
from healthd.ladder_host import HealthDaemon as HostDaemon
from healthd.results import finding_of
from healthd.slurm_seen import SlurmSeen
from medic_core.config import MedicConfig
from medic_core.settings import HookSettings, RemediationSettings, WebhookSettings
from medic_core.slurm import SlurmError
from medic_core.store import Severity
from remediation.decide import primary
from remediation.episodes import EpisodeStore
from remediation.ladder import Ladder
from remediation.webhook import deliver_pending

log = logging.getLogger("medic.healthd")


class LadderDaemon(HostDaemon, Protocol):
    """What the ladder thread needs of the daemon: what the ladder's host reads, and the
    configuration (for the `[remediation]`, `[hooks]` and webhook settings)."""

    @property
    def config(self) -> MedicConfig: ...


class LadderThread:
    def __init__(
        self,
        daemon: LadderDaemon,
        ladder: Ladder,
        episodes: EpisodeStore,
        webhook: WebhookSettings | None = None,
        *,
        every: float = 2.0,
        seen: SlurmSeen | None = None,
    ) -> None:
        self.daemon = daemon
        self.seen = seen or SlurmSeen(daemon.node)  # this node as Slurm last showed it
        self.ladder = ladder
        self.episodes = episodes
        self.webhook = webhook
        self.every = every
        self.lock = threading.Lock()  # one step at a time: a tick, or an admission
        self.wake = threading.Event()
        self._stop = threading.Event()

    def start(self) -> threading.Thread:
        """Also continues an episode a restart interrupted."""
        thread = threading.Thread(target=self.loop, name="ladder", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()

    def loop(self) -> None:
        """The ladder's own thread: repairs take minutes and must not hold up the checks."""
        while not self._stop.is_set():
            try:
                with self.lock:
                    self.ladder.tick()
            except Exception:
                log.exception("remediation step failed")
            if self.webhook is not None:  # RMA ticket changes to the site's ticketing system
                try:
                    deliver_pending(self.daemon.store, self.webhook)
                except Exception:
                    log.exception("webhook delivery failed")
            self.wake.wait(self.every)
            self.wake.clear()

    def respond(self, faults: list[Result]) -> None:
        """Slurm's side of a fresh fault: the ladder gathers the facts, the decision core
        (remediation.decide) decides drain, requeues and episode, and slurm_hooks.actions
        carries it out; each outcome is an event."""
        from slurm_hooks.actions import carry_out, job_facts, slurm_client, start_releaser

        daemon = self.daemon
        settings = HookSettings.from_config(daemon.config)
        findings = [finding_of(r) for r in faults]
        client = self.seen.wrap(slurm_client(daemon.config, settings))
        now = dt.datetime.now(dt.UTC)
        with self.lock:
            try:
                jobs = job_facts(client, daemon.node)
            except SlurmError as exc:
                log.warning("cannot read the jobs on %s: %s", daemon.node, exc)
                jobs = []
            admission = self.ladder.admit(
                findings, jobs, requeue_resilient=settings.requeue_resilient
            )
            decision = admission.decision

            def make_eligible(job_id: str, restarts: int) -> None:
                start_releaser(daemon.config, job_id, restarts)

            after = make_eligible if settings.release_held else None
            drained, actions = carry_out(client, daemon.node, decision, after)
            if drained is not None:
                self.ladder.drained(admission, drained.value)
        self.wake.set()
        first = primary(findings)
        outcome = drained.value if drained else f"not drained: {decision.why}"
        daemon.store.add_event(
            node=daemon.node,
            at=now,
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
            daemon.store.add_event(
                node=daemon.node,
                at=now,
                kind="job_action",
                severity=Severity.WARN,
                source="healthd",
                message=action.detail,
                fault_class=first.fault_class,
                target=f"job:{action.job_id}",
                evidence={"action": action.action, "job_id": action.job_id},
            )


def attach_ladder(daemon: LadderDaemon) -> LadderThread:
    """The ladder for this node, with the daemon as its host and Slurm as the hooks see it."""
    from slurm_hooks.actions import slurm_client

    settings = RemediationSettings.from_config(daemon.config)
    webhook = WebhookSettings.from_config(daemon.config)
    hooks = HookSettings.from_config(daemon.config)
    episodes = EpisodeStore(daemon.store)
    seen = SlurmSeen(daemon.node)
    ladder = Ladder(
        daemon.node,
        episodes,
        seen.wrap(slurm_client(daemon.config, hooks)),
        DaemonLadderHost(daemon, episodes),
        settings,
    )
    return LadderThread(daemon, ladder, episodes, webhook, seen=seen)

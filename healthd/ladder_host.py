"""The node daemon's side of the remediation ladder (remediation.ladder.LadderHost): the
boot id, running jobs, GPU processes, forgetting what a repair cleared, fresh verification
runs, events and RMA tickets."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from healthd.checks.base import CheckContext, Tier
from healthd.gpu_plumbing import GpuPlumbing
from healthd.runner import RunReport
from medic_core.store import Severity, Store
from medic_core.vocabulary import Finding
from remediation import episodes as ep


class HealthDaemon(Protocol):
    """What the ladder's host needs of the daemon (so the daemon imports this module, and
    not the other way round)."""

    node: str
    ctx: CheckContext
    gpu: GpuPlumbing | None
    store: Store

    def run_checks(
        self,
        names: Iterable[str] | None = None,
        *,
        tier: Tier | None = None,
        budget: float | None = None,
        wait: float | None = None,
    ) -> RunReport: ...

    def gpu_identities(self) -> list[dict[str, Any]]: ...


log = logging.getLogger("medic.remediation")


class DaemonLadderHost:
    def __init__(self, daemon: HealthDaemon, episodes: ep.EpisodeStore) -> None:
        self.daemon = daemon
        self.episodes = episodes

    def boot_id(self) -> str:
        path = self.daemon.ctx.roots.proc / "sys/kernel/random/boot_id"
        try:
            return path.read_text().strip()
        except OSError:
            return ""

    def jobs_running(self) -> bool:
        jobs = self.daemon.gpu.jobs if self.daemon.gpu is not None else None
        if jobs is None:
            return False
        return jobs.job_state().running is True

    def gpu_busy(self, gpu: int) -> bool:
        plumbing = self.daemon.gpu
        if plumbing is None:
            return False
        try:
            return bool(plumbing.client.processes(gpu))
        except Exception:  # cannot tell: let the reset itself refuse if it must
            return False

    def release_gpus(self) -> None:
        if self.daemon.gpu is not None:
            self.daemon.gpu.release()

    def reacquire_gpus(self) -> None:
        if self.daemon.gpu is not None:
            self.daemon.gpu.reacquire()

    def after_repair(self, gpu: int | None, before: float) -> None:
        if self.daemon.gpu is not None:
            self.daemon.gpu.xids.clear(gpu, before=before)

    def verify(self, extra_checks: Sequence[str]) -> list[Finding]:
        from healthd.results import result_json

        results = []
        for tier in (Tier.LAUNCH, Tier.PERIODIC):
            results += self.daemon.run_checks(tier=tier).results
        if extra_checks:
            results += self.daemon.run_checks(list(extra_checks)).results
        return [Finding.from_json(result_json(r)) for r in results]

    def event(self, message: str, *, severity: str, fault_class: str, target: str) -> None:
        log.warning("%s: %s", self.daemon.node, message)
        self.daemon.store.add_event(
            node=self.daemon.node,
            at=dt.datetime.now(dt.UTC),
            kind="remediation",
            severity=Severity(severity),
            source="ladder",
            message=message,
            fault_class=fault_class,
            target=target,
        )

    def open_rma(self, episode: ep.Episode, why: str) -> int | None:
        from medic_core.vocabulary import component_of
        from remediation.policy import episode_finding
        from remediation.tickets import component_json, open_ticket, rma_summary, ticket_component

        gpus = ticket_gpus(episode, self.daemon.gpu_identities)
        component = ticket_component(component_of(episode_finding(episode)), gpus)
        evidence = {
            "episode": episode.id,
            "reason": why,
            "component": component_json(component),
            "fault": dict(episode.evidence),
            "steps": [
                {"action": s.action, "state": s.state, "rc": s.returncode, "output": s.output}
                for s in self.episodes.steps(episode.id)
            ],
            "conditions": [
                {"type": c.type, "target": c.target, "status": str(c.status), "reason": c.reason}
                for c in self.daemon.store.conditions(self.daemon.node)
                if str(c.status) != "OK"
            ],
            "events": [
                {
                    "at": e.at.isoformat(),
                    "kind": e.kind,
                    "fault_class": e.fault_class,
                    "message": e.message,
                }
                for e in self.daemon.store.events(self.daemon.node, limit=50)
            ],
        }
        ticket = open_ticket(
            self.daemon.store,
            node=self.daemon.node,
            fault_class=episode.fault_class,
            summary=rma_summary(self.daemon.node, episode.fault_class, component, why),
            gpus=gpus,
            evidence=evidence,
            actor="medic-ladder",
        )
        return int(ticket.id)


def ticket_gpus(
    episode: ep.Episode, identities: Callable[[], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The GPUs an RMA ticket names: the faulty one for a GPU fault on one GPU, every GPU for
    a GPU fault on the node, none for a part that is not a GPU (an HCA's port, a service, a
    filesystem: the ticket's evidence names that part)."""
    if not episode.fault_class.startswith("gpu."):
        return []
    gpus = identities()
    if episode.target.isdigit():
        return [g for g in gpus if g.get("index") == int(episode.target)]
    return gpus

"""The daemon's side of observe-only mode (remediation.observe): its automatic Slurm clients
and where what they would have done is recorded."""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol

from medic_core.config import MedicConfig
from medic_core.journal import keep_in_journal
from medic_core.settings import HookSettings, RemediationSettings
from medic_core.slurm import SlurmClient
from medic_core.store import Severity, Store


class ObservedDaemon(Protocol):
    """What observe-only needs of the daemon (healthd.ladder_thread.LadderDaemon is one)."""

    node: str
    store: Store

    @property
    def config(self) -> MedicConfig: ...


def observe_only(daemon: ObservedDaemon) -> bool:
    """`[remediation] observe_only` as the daemon's configuration says now (a reload
    switches it at the next change)."""
    return RemediationSettings.from_config(daemon.config).observe_only


def automatic_slurm(daemon: ObservedDaemon, hooks: HookSettings, actor: str) -> SlurmClient:
    """The daemon's Slurm client for `actor`'s automatic changes: with observe-only on,
    recorded as what it would have done (remediation.observe), into the store or, when it
    refuses them, the node's journal."""
    from remediation.actions import slurm_client

    def record(event: dict[str, Any]) -> None:
        at = dt.datetime.now(dt.UTC)
        try:
            fields = {**event, "severity": Severity(event["severity"])}
            daemon.store.add_event(node=daemon.node, at=at, **fields)
        except Exception as exc:  # the store: down, full, read-only
            keep_in_journal(daemon.config, at, event, (str(exc).strip() or type(exc).__name__))

    return slurm_client(
        daemon.config, hooks, actor=actor, record=record, observing=lambda: observe_only(daemon)
    )

"""The daemon's side of observe-only mode (remediation.observe): its automatic Slurm clients
and where what they would have done is recorded."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from medic_core.settings import HookSettings, RemediationSettings
from medic_core.slurm import SlurmClient
from medic_core.store import Severity

if TYPE_CHECKING:
    from healthd.ladder_thread import LadderDaemon


def observe_only(daemon: LadderDaemon) -> bool:
    """`[remediation] observe_only` as the daemon's configuration says now (a reload
    switches it at the next change)."""
    return RemediationSettings.from_config(daemon.config).observe_only


def automatic_slurm(daemon: LadderDaemon, hooks: HookSettings, actor: str) -> SlurmClient:
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
            from healthd.ladder_thread import keep_in_journal

            keep_in_journal(daemon.config, at, event, (str(exc).strip() or type(exc).__name__))

    return slurm_client(
        daemon.config, hooks, actor=actor, record=record, observing=lambda: observe_only(daemon)
    )

"""Burn-in's record (one `burn_in` condition per node) as the store keeps it, and the
ladder's side of burn-in: its verification adds the burn-in checks and records their pass.
Kept apart from the runner (remediation/burn_in_runner.py), which drives the ladder: the
ladder reads and writes the record through here and never imports the runner.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from medic_core.settings import BurnInSettings
from medic_core.store import Store
from medic_core.store.models import ConditionUpdate
from remediation import burn_in as bi


def read_record(store: Store, node: str) -> bi.Record | None:
    found = store.conditions(node, type=bi.CONDITION)
    return bi.Record.from_evidence(found[0].evidence) if found else None


def write_record(store: Store, node: str, record: bi.Record, message: str,
                 now: dt.datetime | None = None) -> None:  # fmt: skip
    update = ConditionUpdate(
        type=bi.CONDITION,
        status=bi.STATUS_OF[record.phase],
        reason=f"{bi.CONDITION}.{record.reason}" if record.phase is bi.Phase.FAILED else "",
        message=message,
        evidence=record.evidence(),
    )
    store.set_condition(node, update, now or dt.datetime.now(dt.UTC))


def ladder_checks(
    settings: BurnInSettings, store: Store, node: str, episode_id: int, rebooted: bool
) -> tuple[str, tuple[str, ...]]:
    """(reason, checks) the ladder adds to the verification of `episode_id`."""
    record = read_record(store, node)
    checks = bi.verify_checks(settings, record, episode_id, rebooted)
    handed = record is not None and record.phase is bi.Phase.FAILED and record.episode == episode_id
    reason = record.reason if handed and record is not None else bi.AFTER_REBOOT
    return reason, checks


def record_pass(store: Store, node: str, reason: str, checks: Sequence[str]) -> None:
    """The ladder's verification (or an RMA's re-qualification) passed burn-in `checks`."""
    record = bi.after_verify(read_record(store, node), reason, checks, True)
    if record is not None:
        write_record(store, node, record, f"burn-in passed ({reason}): {' '.join(checks)}")

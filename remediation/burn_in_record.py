"""Burn-in's record (one `burn_in` condition per node) as the store keeps it, and the
ladder's side of burn-in: its verification adds the burn-in checks and records their pass.
Kept apart from the runner (remediation/burn_in_runner.py), which drives the ladder: the
ladder reads and writes the record through here and never imports the runner.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from pathlib import Path

from medic_core.settings import BurnInSettings
from medic_core.store import Store
from medic_core.store.models import ConditionUpdate
from remediation import burn_in as bi
from remediation import burn_in_marker as marker

log = logging.getLogger("medic.burn_in")


def read_record(store: Store, node: str) -> bi.Record | None:
    found = store.conditions(node, type=bi.CONDITION)
    return bi.Record.from_evidence(found[0].evidence) if found else None


def write_record(store: Store, node: str, record: bi.Record, message: str,
                 now: dt.datetime | None = None,
                 state_dir: Path | None = None) -> None:  # fmt: skip
    """`state_dir`: the node's own, where its pass is mirrored for the prolog
    (remediation/burn_in_marker.py): removed before a record that is no pass is written,
    written after a pass is (a crash between them errs on the side of no pass, and the
    daemon's next start mirrors the record again)."""
    if not record.qualified:
        mirror(state_dir, node, record)
    update = ConditionUpdate(
        type=bi.CONDITION,
        status=bi.STATUS_OF[record.phase],
        reason=f"{bi.CONDITION}.{record.reason}" if record.phase is bi.Phase.FAILED else "",
        message=message,
        evidence=record.evidence(),
    )
    store.set_condition(node, update, now or dt.datetime.now(dt.UTC))
    if record.qualified:
        mirror(state_dir, node, record)


def mirror(state_dir: Path | None, node: str, record: bi.Record | None, *,
           keep: bool = False) -> None:  # fmt: skip
    """The node's pass file as its record says: written for a pass (or a waiver), removed
    otherwise. `keep`: a valid file for this node is left as it is (the daemon's start).
    A file that cannot be written is logged: the prolog then refuses, the safe side."""
    if state_dir is None:
        return
    try:
        if record is None or not record.qualified:
            marker.remove_marker(state_dir)
        elif not (keep and marker.refusal(state_dir, node) is None):
            reason = record.reason if record.phase is bi.Phase.PASSED else bi.Phase.WAIVED.value
            marker.write_marker(state_dir, marker.marker_for(node, reason, record.checks))
    except OSError as exc:
        log.warning("%s: burn-in pass file in %s not updated: %s", node, state_dir, exc)


def ladder_checks(
    settings: BurnInSettings, store: Store, node: str, episode_id: int, rebooted: bool
) -> tuple[str, tuple[str, ...]]:
    """(reason, checks) the ladder adds to the verification of `episode_id`."""
    record = read_record(store, node)
    checks = bi.verify_checks(settings, record, episode_id, rebooted)
    handed = record is not None and record.phase is bi.Phase.FAILED and record.episode == episode_id
    reason = record.reason if handed and record is not None else bi.AFTER_REBOOT
    return reason, checks


def record_pass(store: Store, node: str, reason: str, checks: Sequence[str],
                state_dir: Path | None = None) -> None:  # fmt: skip
    """The ladder's verification (or an RMA's re-qualification) passed burn-in `checks`."""
    record = bi.after_verify(read_record(store, node), reason, checks, True)
    if record is not None:
        write_record(store, node, record, f"burn-in passed ({reason}): {' '.join(checks)}",
                     state_dir=state_dir)  # fmt: skip

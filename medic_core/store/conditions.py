"""Writing a node's conditions: one observation checked, then applied to its row (created,
or updated with `since` moved only when status or reason changes) in the caller's transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from medic_core.store.models import (
    NAME_LEN,
    TARGET_LEN,
    ConditionChange,
    ConditionRow,
    ConditionUpdate,
    Status,
    check_evidence,
    check_text,
)
from medic_core.store.values import required_name, status_of


def insert_ignoring_conflict(dialect: str, values: dict[str, Any]) -> Any:
    index = [ConditionRow.node, ConditionRow.type, ConditionRow.target]
    if dialect == "postgresql":
        pg = postgresql.insert(ConditionRow).values(values)
        return pg.on_conflict_do_nothing(index_elements=index).returning(ConditionRow.id)
    lite = sqlite.insert(ConditionRow).values(values)
    return lite.on_conflict_do_nothing(index_elements=index).returning(ConditionRow.id)


def check_update(update: ConditionUpdate) -> tuple[ConditionUpdate, Status, dict[str, Any]]:
    required_name(update.type, "condition type", NAME_LEN)
    check_text(update.target, "condition target", TARGET_LEN)
    check_text(update.reason, "condition reason", NAME_LEN)
    check_text(update.message, "condition message")
    return update, status_of(update.status), check_evidence(update.evidence)


def apply_update(
    session: Session,
    node: str,
    update: ConditionUpdate,
    status: Status,
    evidence: dict[str, Any],
    at: datetime,
) -> ConditionChange | None:
    query = (
        select(ConditionRow)
        .where(
            ConditionRow.node == node,
            ConditionRow.type == update.type,
            ConditionRow.target == update.target,
        )
        .with_for_update()
    )
    row = session.scalars(query).one_or_none()
    if row is None:
        values = {
            "node": node,
            "type": update.type,
            "target": update.target,
            "status": status.value,
            "reason": update.reason,
            "message": update.message,
            "evidence": evidence,
            "since": at,
            "updated_at": at,
        }
        dialect = session.get_bind().dialect.name
        inserted = session.execute(insert_ignoring_conflict(dialect, values)).first()
        if inserted is not None:
            return ConditionChange(
                node, update.type, update.target, None, None, None, status,
                update.reason, update.message, at,
            )  # fmt: skip
        # Another writer created it between our read and our insert: update theirs.
        row = session.scalars(query).one()
    change = None
    if row.status != status.value or row.reason != update.reason:
        change = ConditionChange(
            node, update.type, update.target, Status(row.status), row.reason, row.since,
            status, update.reason, update.message, at,
        )  # fmt: skip
        row.since = at
    row.status = status.value
    row.reason = update.reason
    row.message = update.message
    row.evidence = evidence
    row.updated_at = at
    return change

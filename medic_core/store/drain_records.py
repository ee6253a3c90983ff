"""Medic's drain records (docs/store.md): the events that open, close or hold a node's
`drain_records` row, applied in the same transaction as the event itself, whichever way it
arrives (a direct call, the daemon's socket, or a journal replay after the store was down)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from medic_core.store.models import NAME_LEN, NODE_LEN, DrainRecordRow, EventRow, check_text

DRAIN_RECORDED = "medic.drain"
DRAIN_RESUMED = "medic.resume"
DRAIN_HELD = "medic.drain_held"
DRAIN_KINDS = frozenset({DRAIN_RECORDED, DRAIN_RESUMED, DRAIN_HELD})


def drain_event(
    kind: str, reason: str, at: datetime, actor: str, episode_id: int | None, note: str
) -> dict[str, Any]:
    """add_event's keywords (but the node) for a drain record's event: also what a node's
    journal keeps when the store is down, replayed into the same record later."""
    verb = {DRAIN_RECORDED: "drained", DRAIN_RESUMED: "resumed", DRAIN_HELD: "held"}[kind]
    episode = f" (episode {episode_id})" if episode_id is not None else ""
    return {
        "at": at,
        "kind": kind,
        "severity": "WARN" if kind == DRAIN_RECORDED else "INFO",
        "source": actor[:NAME_LEN] or "medic",
        "message": f"{verb} by {actor}{episode}: {reason}" + (f"; {note}" if note else ""),
        "evidence": {"reason": reason, "actor": actor, "episode_id": episode_id, "note": note},
    }


def apply_drain_event(session: Session, values: Mapping[str, Any]) -> int:
    """Apply a drain record's event to `drain_records` and insert the event; its id."""
    evidence = values["evidence"]
    reason = evidence.get("reason")
    actor = evidence.get("actor")
    episode_id = evidence.get("episode_id")
    if not isinstance(reason, str) or not isinstance(actor, str) or not actor:
        raise ValueError(f"a {values['kind']} event needs evidence reason and actor (strings)")
    if episode_id is not None and (isinstance(episode_id, bool) or not isinstance(episode_id, int)):
        raise ValueError(f"episode_id must be a whole number or null, got {episode_id!r}")
    check_text(actor, "actor", NODE_LEN)
    node, at, note = values["node"], values["at"], str(evidence.get("note") or "")
    current = session.scalars(
        select(DrainRecordRow)
        .where(DrainRecordRow.node == node, DrainRecordRow.closed_at.is_(None))
        .with_for_update()
    ).one_or_none()
    kind = values["kind"]
    if kind == DRAIN_RECORDED:
        seen = session.scalars(
            select(DrainRecordRow.id).where(
                DrainRecordRow.node == node,
                DrainRecordRow.drained_at == at,
                DrainRecordRow.reason == reason,
                DrainRecordRow.actor == actor,
            )
        ).first()
        if seen is None:  # a journal replays at least once: the same drain is one record
            older = current is not None and current.drained_at > at
            if current is not None and not older:
                current.closed_at, current.closed_by = at, actor
                current.note = "replaced by a later drain"
                session.flush()
            session.add(
                DrainRecordRow(
                    node=node, reason=reason, actor=actor, episode_id=episode_id,
                    drained_at=at, held="", closed_at=at if older else None,
                    closed_by=actor if older else "",
                    note="replayed after a later drain" if older else note,
                )
            )  # fmt: skip
    elif current is not None and current.reason == reason and current.drained_at <= at:
        if kind == DRAIN_RESUMED:
            current.closed_at, current.closed_by, current.note = at, actor, note or "resumed"
        else:
            current.held = f"{actor}: {note}" if note else actor
    session.flush()
    event_id: int = session.execute(
        insert(EventRow).returning(EventRow.id), dict(values)
    ).scalar_one()
    return event_id

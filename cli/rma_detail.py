"""What `medic rma show` tells of one ticket beyond its row: its webhook notifications, the
remediation episodes that ended in it, a summary of its evidence, its audit trail, its
re-qualification, and the ticket as JSON (the other `medic rma` commands print it too)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cli.common import clip, iso, when
from remediation.ticket_states import TicketState

if TYPE_CHECKING:
    from medic_core.store import Store
    from remediation.tickets import AuditEntry, Ticket


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Deliveries:
    """The ticket's webhook notifications, by state."""

    pending: int = 0
    delivered: int = 0
    failed: int = 0
    last_error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "delivered": self.delivered,
            "failed": self.failed,
            "last_error": self.last_error,
        }

    def line(self) -> str:
        if not (self.pending or self.delivered or self.failed):
            return "notifications: none"
        text = (
            f"notifications: {self.delivered} delivered, {self.pending} pending, "
            f"{self.failed} failed"
        )
        return text + (f" (last error: {clip(self.last_error, 80)})" if self.last_error else "")


def deliveries(store: Store, ticket_id: int) -> Deliveries:
    from sqlalchemy import func, select

    from medic_core.store.models import RmaOutboxRow
    from remediation import tickets as rma

    o = RmaOutboxRow.__table__
    counts_query = (
        select(o.c.state, func.count()).where(o.c.ticket_id == ticket_id).group_by(o.c.state)
    )
    error_query = (
        select(o.c.last_error)
        .where(o.c.ticket_id == ticket_id, o.c.last_error != "")
        .order_by(o.c.id.desc())
        .limit(1)
    )
    with store.engine.connect() as conn:
        counts = {str(s): int(n) for s, n in conn.execute(counts_query).all()}
        error = conn.execute(error_query).scalar_one_or_none()
    return Deliveries(
        pending=counts.get(rma.OUTBOX_PENDING, 0),
        delivered=counts.get(rma.OUTBOX_DELIVERED, 0),
        failed=counts.get(rma.OUTBOX_FAILED, 0),
        last_error=error or "",
    )


@dataclass(frozen=True)
class EpisodeRef:
    id: int
    state: str
    rung: int
    opened_at: dt.datetime


def linked_episodes(store: Store, ticket_id: int) -> list[EpisodeRef]:
    """The remediation episodes that ended in this ticket."""
    from sqlalchemy import select

    from remediation import episodes as ep

    e = ep.episodes
    query = (
        select(e.c.id, e.c.state, e.c.rung, e.c.opened_at)
        .where(e.c.ticket_id == ticket_id)
        .order_by(e.c.id)
    )
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    return [EpisodeRef(int(r.id), r.state, int(r.rung), _aware(r.opened_at)) for r in rows]


def evidence_summary(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, what it holds) for each top-level key: `3 items`, `2 keys`, or the value."""
    out = []
    for key, value in evidence.items():
        if isinstance(value, list):
            what = f"{len(value)} item" + ("" if len(value) == 1 else "s")
        elif isinstance(value, dict):
            what = f"{len(value)} key" + ("" if len(value) == 1 else "s")
        else:
            what = clip(str(value), 80)
        out.append((key, what))
    return out


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "at": iso(entry.at),
        "actor": entry.actor,
        "from": entry.from_state.value if entry.from_state else None,
        "to": entry.to_state.value,
        "note": entry.note,
    }


def audit_rows(trail: Iterable[AuditEntry]) -> list[list[str]]:
    return [
        ["  " + when(e.at), e.actor, e.from_state.value if e.from_state else "-", e.to_state.value,
         clip(e.note, 80) or "-"]
        for e in trail
    ]  # fmt: skip


def requalification_line(ticket: Ticket, trail: Sequence[AuditEntry]) -> str:
    if ticket.is_open:
        return "re-qualification: after the ticket is closed"
    if ticket.requalify:
        return f"re-qualification: pending ({ticket.node} must pass it before it takes jobs)"
    done = [e for e in trail if e.from_state is TicketState.CLOSED]
    if done:
        return f"re-qualification: passed {when(done[-1].at)} ({done[-1].actor})"
    return "re-qualification: not needed"


def ticket_json(ticket: Ticket) -> dict[str, Any]:
    return {
        "id": ticket.id,
        "node": ticket.node,
        "state": ticket.state.value,
        "fault_class": ticket.fault_class,
        "summary": ticket.summary,
        "component": ticket.component,
        "reason": ticket.reason,
        "gpus": [g.as_dict() for g in ticket.gpus],
        "resolution": ticket.resolution,
        "requalify": ticket.requalify,
        "vendor_ref": ticket.external_id,
        "vendor_url": ticket.external_url,
        "created_at": iso(ticket.created_at),
        "updated_at": iso(ticket.updated_at),
        "closed_at": iso(ticket.closed_at),
    }

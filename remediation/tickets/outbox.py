"""The record of one ticket change: its audit row and its outbox row (the webhook's payload,
delivered later by `remediation.webhook.deliver_pending`), written in the caller's
transaction so a crash between the change and the POST loses nothing; the outbox's states,
and putting deliveries the receiver refused back in the queue (`retry_failed`)."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import update
from sqlalchemy.orm import Session

from medic_core.store import Store
from medic_core.store.engine import writer
from medic_core.store.models import RmaAuditRow, RmaOutboxRow
from remediation.ticket_states import TicketState
from remediation.tickets.values import Ticket

EVENT_OPENED = "ticket.opened"
EVENT_TRANSITION = "ticket.transition"
EVENT_REQUALIFIED = "ticket.requalified"
EVENT_EVIDENCE = "ticket.evidence"  # the node's evidence bundle was written (its path, sha256)

OUTBOX_PENDING = "pending"
OUTBOX_DELIVERED = "delivered"
OUTBOX_FAILED = "failed"  # refused by the receiver (4xx); see retry_failed()


def record_change(
    session: Session,
    snapshot: Ticket,
    *,
    event: str,
    at: dt.datetime,
    actor: str,
    from_state: TicketState | None,
    note: str,
) -> None:
    """The audit row and the outbox row of one change to the ticket (`snapshot`: as the
    change left it), in the caller's transaction."""
    session.add(
        RmaAuditRow(
            ticket_id=snapshot.id,
            at=at,
            actor=actor,
            from_state=from_state.value if from_state is not None else None,
            to_state=snapshot.state.value,
            note=note,
        )
    )
    delivery_id = str(uuid.uuid4())
    payload = {
        "event": event,
        "delivery_id": delivery_id,
        "ticket": snapshot.as_dict(),
        "transition": {
            "from": from_state.value if from_state is not None else None,
            "to": snapshot.state.value,
            "actor": actor,
            "note": note,
            "at": at.isoformat(),
        },
        "evidence": snapshot.evidence,
    }
    session.add(
        RmaOutboxRow(
            ticket_id=snapshot.id,
            delivery_id=delivery_id,
            event=event,
            payload=payload,
            state=OUTBOX_PENDING,
            attempts=0,
            last_status=None,
            last_error="",
            created_at=at,
            next_attempt_at=at,
            last_attempt_at=None,
            delivered_at=None,
        )
    )


def retry_failed(store: Store, ticket_id: int | None = None) -> int:
    """Put deliveries the receiver refused (4xx) back in the queue, after fixing the cause
    (the secret, the receiver). Returns how many."""
    query = update(RmaOutboxRow).where(RmaOutboxRow.state == OUTBOX_FAILED)
    if ticket_id is not None:
        query = query.where(RmaOutboxRow.ticket_id == ticket_id)
    with writer(store.engine).begin() as conn:
        result = conn.execute(
            query.values(state=OUTBOX_PENDING, next_attempt_at=dt.datetime.now(dt.UTC))
        )
        return result.rowcount

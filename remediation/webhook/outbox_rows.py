"""The store's outbox rows: which are due, claiming one, sending it and recording what came of
it (delivered, pending to retry later, or failed when refused), in the calling thread."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from medic_core.settings import WebhookSettings
from medic_core.store import Store
from medic_core.store.engine import writer
from medic_core.store.models import RmaOutboxRow
from remediation.tickets import OUTBOX_DELIVERED, OUTBOX_FAILED, OUTBOX_PENDING
from remediation.webhook.sender import Sender
from remediation.webhook.signing import encode

log = logging.getLogger("medic.remediation.webhook")  # one logger for the whole package

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Delivery:
    """What became of one outbox row in one round."""

    outbox_id: int
    ticket_id: int
    delivery_id: str
    event: str
    state: str  # delivered, pending (to retry later) or failed (refused)
    attempts: int  # in total, over every round
    last_status: int | None
    last_error: str


def _claim(store: Store, row_id: int, now: dt.datetime, lease: dt.timedelta) -> bool:
    """Take one pending row for this process: its next_attempt_at moves past the longest
    this round can take, so a concurrent round skips it, and a crash mid-send only delays
    it."""
    with writer(store.engine).begin() as conn:
        result = conn.execute(
            update(RmaOutboxRow)
            .where(
                RmaOutboxRow.id == row_id,
                RmaOutboxRow.state == OUTBOX_PENDING,
                RmaOutboxRow.next_attempt_at <= now,
            )
            .values(next_attempt_at=now + lease)
        )
        return result.rowcount == 1


def _lease(settings: WebhookSettings) -> dt.timedelta:
    n = settings.max_attempts
    waits = n * settings.timeout + (n - 1) * max(settings.backoff_cap, settings.retry_after_max)
    return dt.timedelta(seconds=waits + 60)


def due_rows(store: Store, now: dt.datetime, limit: int = 100) -> list[int]:
    """The ids of the pending outbox rows whose time has come, oldest first."""
    query = (
        select(RmaOutboxRow.id)
        .where(RmaOutboxRow.state == OUTBOX_PENDING, RmaOutboxRow.next_attempt_at <= now)
        .order_by(RmaOutboxRow.id)
        .limit(limit)
    )
    with Session(store.engine) as session:
        return list(session.scalars(query))


def deliver_row(
    store: Store, settings: WebhookSettings, sender: Sender, row_id: int, now: Clock = utc_now
) -> Delivery | None:
    """Send one outbox row if it is still pending and due and no earlier event of its ticket
    is still pending (a ticket's events go out in order); record what came of it. None when
    it was not sent (not due, held back, or another process claimed it)."""
    with Session(store.engine) as session:
        row = session.get(RmaOutboxRow, row_id)
        if row is None or row.state != OUTBOX_PENDING:
            return None
        ticket_id, delivery_id, event = row.ticket_id, row.delivery_id, row.event
        payload, attempts, due = dict(row.payload), row.attempts, row.next_attempt_at
        earlier = session.scalar(
            select(RmaOutboxRow.id)
            .where(
                RmaOutboxRow.ticket_id == ticket_id,
                RmaOutboxRow.state == OUTBOX_PENDING,
                RmaOutboxRow.id < row_id,
            )
            .limit(1)
        )
    started = now()
    if earlier is not None or due > started:
        return None
    if not _claim(store, row_id, started, _lease(settings)):
        return None
    result = sender.send(encode(payload), delivery_id, event)
    finished = now()
    total = attempts + len(result.attempts)
    if result.delivered:
        state = OUTBOX_DELIVERED
    elif result.retryable:
        state = OUTBOX_PENDING
    else:
        state = OUTBOX_FAILED
    wait = max(settings.backoff_cap, result.retry_at_least)
    values: dict[str, Any] = {
        "state": state,
        "attempts": total,
        "last_status": result.last.status,
        "last_error": result.last.error,
        "last_attempt_at": finished,
        "next_attempt_at": (
            finished + dt.timedelta(seconds=wait) if state == OUTBOX_PENDING else finished
        ),
    }
    if result.delivered:
        values["delivered_at"] = finished
    with writer(store.engine).begin() as conn:
        conn.execute(update(RmaOutboxRow).where(RmaOutboxRow.id == row_id).values(**values))
    if not result.delivered:
        log.warning(
            "webhook %s of ticket %d (%s): %s after %d attempts",
            event,
            ticket_id,
            state,
            result.last.error,
            len(result.attempts),
        )
    return Delivery(row_id, ticket_id, delivery_id, event, state, total,
                    result.last.status, result.last.error)  # fmt: skip


def deliver_round(
    store: Store,
    settings: WebhookSettings,
    *,
    sender: Sender | None = None,
    now: Clock = utc_now,
    limit: int = 100,
) -> list[Delivery]:
    """Send what the outbox holds, oldest first, in the calling thread (it waits on the
    network: the daemon uses `deliver_pending`). A ticket's events go out in order: while
    one stays pending, that ticket's later events wait for a later round. A delivery that
    fails with a retryable error is tried again no sooner than `backoff_cap` seconds later
    (or its Retry-After); one the receiver refuses (4xx) is marked failed."""
    sender = sender or Sender(settings)
    done = []
    for row_id in due_rows(store, now(), limit):
        delivery = deliver_row(store, settings, sender, row_id, now)
        if delivery is not None:
            done.append(delivery)
    return done


def outbox(store: Store, ticket_id: int | None = None) -> list[Delivery]:
    """Every notification recorded, oldest first (for `medic rma show` and tests)."""
    query = select(RmaOutboxRow).order_by(RmaOutboxRow.id)
    if ticket_id is not None:
        query = query.where(RmaOutboxRow.ticket_id == ticket_id)
    with Session(store.engine) as session:
        return [
            Delivery(r.id, r.ticket_id, r.delivery_id, r.event, r.state, r.attempts,
                     r.last_status, r.last_error)
            for r in session.scalars(query)
        ]  # fmt: skip

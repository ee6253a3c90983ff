"""The outbound webhook: RMA ticket events POSTed as JSON to the site's ticketing system.

Each event is signed (`X-Medic-Signature: sha256=<hex HMAC-SHA256 of the body>`), carries a
delivery id that stays the same across retries (`X-Medic-Delivery`, for the receiver to
deduplicate), and is retried with exponential backoff and jitter on connection errors,
timeouts, 5xx and 429 (Retry-After honoured); other 4xx are not retried. TLS certificates are
verified (a private CA may be given). Events wait in the store's outbox (written with the
ticket change itself) until `deliver_pending` gets them through. See docs/rma.md.

Standard library only: urllib and ssl do all of this in ~100 lines, and every dependency is
one more thing to patch on every node.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import hmac
import http.client
import json
import logging
import random
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from medic_core.settings import WebhookSettings
from medic_core.store import Store
from medic_core.store.engine import writer
from medic_core.store.models import RmaOutboxRow
from remediation.tickets import OUTBOX_DELIVERED, OUTBOX_FAILED, OUTBOX_PENDING

log = logging.getLogger("medic.remediation.webhook")

SIGNATURE_HEADER = "X-Medic-Signature"
DELIVERY_HEADER = "X-Medic-Delivery"
EVENT_HEADER = "X-Medic-Event"
USER_AGENT = "slurm-medic-webhook/1"
ERROR_LEN = 500


def sign(secret: bytes, body: bytes) -> str:
    """The X-Medic-Signature value of `body`."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, body: bytes, header: str) -> bool:
    """What a receiver does (in constant time)."""
    return hmac.compare_digest(sign(secret, body), header)


def encode(payload: Mapping[str, Any]) -> bytes:
    """The body: compact JSON, keys sorted, so a retry sends the same bytes."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class Attempt:
    status: int | None  # HTTP status, None when no response came
    error: str  # "" on success
    retry_after: float | None = None


@dataclass(frozen=True)
class DeliveryResult:
    delivered: bool
    attempts: tuple[Attempt, ...]
    # Worth sending again in a later round (network, 5xx, 429, TLS): False for a refusal.
    retryable: bool
    retry_at_least: float = 0.0  # seconds to wait before that round (a long Retry-After)

    @property
    def last(self) -> Attempt:
        return self.attempts[-1]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not an instruction: re-POSTing signed evidence to wherever
    a 30x points is not something to do silently."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _retry_after(value: str | None, now: float) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, when.timestamp() - now)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:ERROR_LEN]


class Sender:
    """POSTs signed bodies with retries. `sleep` and `rng` are for tests."""

    def __init__(
        self,
        settings: WebhookSettings,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.sleep = sleep
        self.rng = rng
        self._opener = urllib.request.build_opener(
            _NoRedirect(), urllib.request.HTTPSHandler(context=settings.ssl_context())
        )

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based): exponential up to
        the cap, with equal jitter (half fixed, half random) so a fleet does not retry in
        step."""
        s = self.settings
        delay = min(s.backoff_cap, s.backoff_base * 2.0 ** (attempt - 1))
        return delay / 2 + self.rng() * delay / 2

    def post_once(self, body: bytes, delivery_id: str, event: str) -> Attempt:
        request = urllib.request.Request(
            self.settings.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                SIGNATURE_HEADER: sign(self.settings.secret, body),
                DELIVERY_HEADER: delivery_id,
                EVENT_HEADER: event,
            },
        )
        try:
            with self._opener.open(request, timeout=self.settings.timeout) as response:
                response.read(65536)
                return Attempt(int(response.status), "")
        except urllib.error.HTTPError as exc:
            with exc:
                detail = exc.read(300).decode("utf-8", "replace")
            retry_after = _retry_after(exc.headers.get("Retry-After"), time.time())
            return Attempt(
                exc.code, _one_line(f"HTTP {exc.code} {exc.reason}: {detail}"), retry_after
            )
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                return Attempt(None, _one_line(f"TLS: {reason.verify_message or reason}"))
            return Attempt(None, _one_line(f"cannot connect: {reason}"))
        except TimeoutError:
            return Attempt(None, f"no answer within {self.settings.timeout:g}s")
        except (OSError, http.client.HTTPException) as exc:
            return Attempt(None, _one_line(f"connection failed: {exc!r}"))

    def send(self, body: bytes, delivery_id: str, event: str) -> DeliveryResult:
        """Up to `max_attempts` attempts, waiting between them."""
        attempts: list[Attempt] = []
        for number in range(1, self.settings.max_attempts + 1):
            attempt = self.post_once(body, delivery_id, event)
            attempts.append(attempt)
            status = attempt.status
            if status is not None and 200 <= status < 300:
                return DeliveryResult(True, tuple(attempts), False)
            if attempt.error.startswith("TLS:"):
                # Verification will fail again until someone fixes the CA or the certificate.
                return DeliveryResult(False, tuple(attempts), True)
            if status is not None and status != 429 and status < 500:
                return DeliveryResult(False, tuple(attempts), False)  # refused: not retried
            delay = self.backoff(number)
            if attempt.retry_after is not None:
                if attempt.retry_after > self.settings.retry_after_max:
                    return DeliveryResult(False, tuple(attempts), True, attempt.retry_after)
                delay = max(delay, attempt.retry_after)
            if number < self.settings.max_attempts:
                log.info(
                    "webhook %s attempt %d: %s; retry in %.1fs", event, number, attempt.error, delay
                )
                self.sleep(delay)
        return DeliveryResult(False, tuple(attempts), True)


@dataclass(frozen=True)
class Delivery:
    """What `deliver_pending` did with one outbox row."""

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
    this round can take, so a concurrent deliver_pending skips it, and a crash mid-send
    only delays it."""
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


def deliver_pending(
    store: Store,
    settings: WebhookSettings,
    *,
    sender: Sender | None = None,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    limit: int = 100,
) -> list[Delivery]:
    """Send what the outbox holds, oldest first. A ticket's events go out in order: when
    one stays pending, that ticket's later events wait for the next round. A delivery that
    fails with a retryable error is tried again no sooner than `backoff_cap` seconds later
    (or its Retry-After); one the receiver refuses (4xx) is marked failed."""
    sender = sender or Sender(settings)
    query = (
        select(RmaOutboxRow)
        .where(RmaOutboxRow.state == OUTBOX_PENDING)
        .order_by(RmaOutboxRow.id)
        .limit(limit)
    )
    with Session(store.engine) as session:
        rows = [
            (r.id, r.ticket_id, r.delivery_id, r.event, dict(r.payload), r.attempts,
             r.next_attempt_at)
            for r in session.scalars(query)
        ]  # fmt: skip
    done: list[Delivery] = []
    held: set[int] = set()  # tickets with an earlier event still pending
    for row_id, ticket_id, delivery_id, event, payload, attempts, due in rows:
        started = now()
        if ticket_id in held or due > started:
            held.add(ticket_id)
            continue
        if not _claim(store, row_id, started, _lease(settings)):
            held.add(ticket_id)
            continue
        result = sender.send(encode(payload), delivery_id, event)
        finished = now()
        total = attempts + len(result.attempts)
        if result.delivered:
            state = OUTBOX_DELIVERED
        elif result.retryable:
            state = OUTBOX_PENDING
            held.add(ticket_id)
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
        done.append(
            Delivery(row_id, ticket_id, delivery_id, event, state, total,
                     result.last.status, result.last.error)
        )  # fmt: skip
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


__all__ = [
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "Delivery",
    "DeliveryResult",
    "Sender",
    "WebhookSettings",
    "deliver_pending",
    "encode",
    "outbox",
    "sign",
    "verify_signature",
]

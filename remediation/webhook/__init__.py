"""The outbound webhook: RMA ticket events POSTed as JSON to the site's ticketing system.

Each attempt is signed over its time, its delivery id and its body:

    X-Medic-Timestamp: <unix seconds>
    X-Medic-Delivery:  <uuid>, the same on every retry of one event
    X-Medic-Signature: v1=<hex HMAC-SHA256 of "{timestamp}.{delivery_id}." + body>

so a receiver can refuse a replayed request (a stale timestamp, a delivery id it has already
handled) as well as a forged one (docs/examples/webhook_receiver.py does all three). Failed
attempts are retried with exponential backoff and jitter on connection errors, timeouts, 5xx
and 429 (Retry-After honoured); other 4xx are not retried. `timeout` is a deadline for the
whole attempt (connect, TLS handshake, request, answer), not for each read: a receiver that
drips its answer is cut off at the deadline. TLS certificates are verified (a private CA may
be given); https is required unless `allow_http` says otherwise.

Events wait in the store's outbox (written with the ticket change itself). The daemon's
ladder thread calls `deliver_pending`, which never waits on the network: it hands the due
rows to the store's delivery thread (a `Dispatcher`, with a bounded queue) and returns.
`deliver_round` sends them in the calling thread instead (tests, tools). See docs/rma.md.

On PostgreSQL one daemon of the fleet sends (`SenderElection`): the one holding a
session-level advisory lock on a connection it keeps. The others try to take the lock about
once a minute (one `SELECT pg_try_advisory_lock`, no table read) and never read the outbox;
when the sender's daemon dies its session ends and the lock with it. On SQLite every daemon
sends (its own store, or the lab's few daemons sharing one file).

Standard library only: http.client and ssl do all of this, and every dependency is one more
thing to patch on every node.

One module per concern, imported one way (signing <- sender <- outbox_rows <- delivery_thread,
which asks sender_election):

- `signing`: the signature and the body's encoding (`sign`, `verify_signature`, `encode`);
- `sender`: one delivery of one body, its attempts, deadlines and retries (`Sender`);
- `outbox_rows`: the store's outbox rows, claimed, sent and recorded (`due_rows`,
  `deliver_row`, `deliver_round`, `outbox`);
- `delivery_thread`: the store's delivery thread (`Dispatcher`) and `deliver_pending`;
- `sender_election`: the fleet's one sender on PostgreSQL (`SenderElection`, `election`).

This package re-exports their public names: `from remediation.webhook import deliver_pending`.
"""

from __future__ import annotations

from medic_core.settings import WebhookSettings
from remediation.webhook.delivery_thread import Dispatcher, deliver_pending, dispatcher
from remediation.webhook.outbox_rows import Delivery, deliver_round, due_rows, outbox
from remediation.webhook.sender import DeliveryResult, Sender
from remediation.webhook.sender_election import SENDER_LOCK_KEY, SenderElection, election
from remediation.webhook.signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    encode,
    sign,
    signed_bytes,
    verify_signature,
)

__all__ = [
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "SENDER_LOCK_KEY",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "Delivery",
    "DeliveryResult",
    "Dispatcher",
    "Sender",
    "SenderElection",
    "WebhookSettings",
    "deliver_pending",
    "deliver_round",
    "dispatcher",
    "due_rows",
    "election",
    "encode",
    "outbox",
    "sign",
    "signed_bytes",
    "verify_signature",
]

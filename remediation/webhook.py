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
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import email.utils
import hashlib
import hmac
import http.client
import json
import logging
import random
import socket
import ssl
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, event, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from medic_core.settings import WebhookSettings
from medic_core.store import Store
from medic_core.store.engine import writer
from medic_core.store.models import RmaOutboxRow
from remediation.tickets import OUTBOX_DELIVERED, OUTBOX_FAILED, OUTBOX_PENDING

log = logging.getLogger("medic.remediation.webhook")

SIGNATURE_HEADER = "X-Medic-Signature"
TIMESTAMP_HEADER = "X-Medic-Timestamp"
DELIVERY_HEADER = "X-Medic-Delivery"
EVENT_HEADER = "X-Medic-Event"
SIGNATURE_VERSION = "v1"
USER_AGENT = "slurm-medic-webhook/2"
ERROR_LEN = 500
DETAIL_LEN = 300  # bytes of an error answer's body kept in last_error
RETRY_AFTER_LONGEST = 7 * 86400.0  # a larger (or garbled) Retry-After counts as this
QUEUE_SIZE = 256  # deliveries waiting for the delivery thread; the oldest are dropped beyond
# The PostgreSQL session-level advisory lock whose holder is the fleet's one webhook sender
# (distinct from the migration, admission and sweep locks).
SENDER_LOCK_KEY = 0x4D45445748  # "MEDWH"
ELECTION_PERIOD = 60.0  # seconds between a non-sender's tries (jittered down to half)
VERIFY_PERIOD = 10.0  # seconds between the sender's checks of its held connection

Clock = Callable[[], dt.datetime]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def signed_bytes(timestamp: str, delivery_id: str, body: bytes) -> bytes:
    """What the signature covers: `{timestamp}.{delivery_id}.` then the raw body."""
    return f"{timestamp}.{delivery_id}.".encode() + body


def sign(secret: bytes, timestamp: str, delivery_id: str, body: bytes) -> str:
    """The X-Medic-Signature value of one attempt."""
    digest = hmac.new(secret, signed_bytes(timestamp, delivery_id, body), hashlib.sha256)
    return f"{SIGNATURE_VERSION}={digest.hexdigest()}"


def verify_signature(
    secret: bytes, timestamp: str, delivery_id: str, body: bytes, header: str
) -> bool:
    """The signature check a receiver does, in constant time (freshness and repeats are the
    receiver's other two checks: docs/examples/webhook_receiver.py)."""
    expected = sign(secret, timestamp, delivery_id, body).encode()
    return hmac.compare_digest(expected, header.encode("utf-8", "replace"))


def encode(payload: Mapping[str, Any]) -> bytes:
    """The body: compact JSON, keys sorted, so a retry sends the same bytes."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class Attempt:
    status: int | None  # HTTP status, None when no (complete) answer came
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


def _retry_after(value: str | None, now: float) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent
    or unreadable, never more than RETRY_AFTER_LONGEST."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        if len(value) > 12:  # tens of thousands of years, or more than a float holds
            return RETRY_AFTER_LONGEST
        return min(float(value), RETRY_AFTER_LONGEST)
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        seconds = when.timestamp() - now
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return min(max(0.0, seconds), RETRY_AFTER_LONGEST)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:ERROR_LEN]


class Deadline:
    """Ends one attempt at its deadline, whatever it is waiting for: a timer shuts the
    connection's socket down, which wakes any read or write blocked on it. (A socket timeout
    is per read: a receiver sending a byte every few seconds would never trip it.)"""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._ends = time.monotonic() + seconds
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        """Seconds left (at least a little, so a socket call fails by itself, not at once)."""
        return max(0.001, self._ends - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        """The socket to shut down at the deadline (at once if it has passed)."""
        with self._lock:
            self._sock = sock
            if self.expired:
                self._cut()
            else:
                sock.settimeout(self.remaining())

    def done(self) -> None:
        """Call before closing the socket: the timer must not touch it (or its reused fd)."""
        self._timer.cancel()
        with self._lock:
            self._sock = None

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._cut()

    def _cut(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)


class Sender:
    """POSTs signed bodies with retries. `sleep`, `rng` and `clock` are for tests; `cancel`
    ends a delivery between attempts (the waits between them should watch it too)."""

    def __init__(
        self,
        settings: WebhookSettings,
        *,
        sleep: Callable[[float], object] = time.sleep,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
        cancel: threading.Event | None = None,
    ) -> None:
        self.settings = settings
        self.sleep = sleep
        self.rng = rng
        self.clock = clock
        self.cancel = cancel
        parts = urllib.parse.urlsplit(settings.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._context = settings.ssl_context() if self._https else None

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based): exponential up to
        the cap, with equal jitter (half fixed, half random) so a fleet does not retry in
        step."""
        s = self.settings
        delay = min(s.backoff_cap, s.backoff_base * 2.0 ** (attempt - 1))
        return delay / 2 + self.rng() * delay / 2

    def headers(self, body: bytes, delivery_id: str, event: str) -> dict[str, str]:
        """One attempt's headers, signed now."""
        timestamp = str(int(self.clock()))
        return {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            TIMESTAMP_HEADER: timestamp,
            DELIVERY_HEADER: delivery_id,
            SIGNATURE_HEADER: sign(self.settings.secret, timestamp, delivery_id, body),
            EVENT_HEADER: event,
        }

    def post_once(self, body: bytes, delivery_id: str, event: str) -> Attempt:
        """One POST, over within `timeout` seconds in all. Redirects are answers, not
        instructions: re-POSTing signed evidence to wherever a 30x points is not done."""
        deadline = Deadline(self.settings.timeout)
        sock: socket.socket | None = None
        conn: http.client.HTTPConnection | None = None
        try:
            sock = socket.create_connection((self._host, self._port), deadline.remaining())
            deadline.watch(sock)
            if self._context is not None:
                sock = self._context.wrap_socket(
                    sock, server_hostname=self._host, do_handshake_on_connect=False
                )
                deadline.watch(sock)
                sock.do_handshake()
            if self._context is not None:
                conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=deadline.remaining(), context=self._context
                )
            else:
                conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=deadline.remaining()
                )
            conn.sock = sock  # connected (and verified) above, under the deadline
            conn.request("POST", self._target, body, self.headers(body, delivery_id, event))
            response = conn.getresponse()
            status = int(response.status)
            if 200 <= status < 300:
                return Attempt(status, "")  # the answer's body is not read: it means nothing
            retry_after = _retry_after(response.getheader("Retry-After"), self.clock())
            try:
                detail = response.read(DETAIL_LEN).decode("utf-8", "replace")
            except (OSError, ValueError, http.client.HTTPException):
                detail = "(answer cut short)"
            error = _one_line(f"HTTP {status} {response.reason}: {detail}")
            return Attempt(status, error, retry_after)
        except ssl.SSLCertVerificationError as exc:
            return Attempt(None, _one_line(f"TLS: {exc.verify_message or exc}"))
        except (OSError, ValueError, http.client.HTTPException) as exc:
            if deadline.expired or isinstance(exc, TimeoutError):
                return Attempt(None, f"no answer within {self.settings.timeout:g}s")
            if isinstance(exc, ssl.SSLError):
                return Attempt(None, _one_line(f"TLS: {exc}"))
            if conn is None:
                return Attempt(None, _one_line(f"cannot connect: {exc}"))
            if not isinstance(exc, OSError):
                return Attempt(None, _one_line(f"not an HTTP answer: {exc!r}"))
            return Attempt(None, _one_line(f"connection failed: {exc!r}"))
        finally:
            deadline.done()
            if conn is not None:
                conn.close()  # and its socket
            elif sock is not None:
                sock.close()

    def send(self, body: bytes, delivery_id: str, event: str) -> DeliveryResult:
        """Up to `max_attempts` attempts, waiting between them (never longer than
        `retry_after_max` for a Retry-After: a longer one ends the round)."""
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
                if self.cancel is not None and self.cancel.is_set():
                    break
        return DeliveryResult(False, tuple(attempts), True)


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
    store: Store, settings: WebhookSettings, sender: Sender, row_id: int, now: Clock = _utcnow
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
    now: Clock = _utcnow,
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


class Dispatcher:
    """The delivery thread of one store: `offer` (from the ladder thread) queues the due
    outbox rows and returns at once; the thread sends them one by one. The queue is bounded:
    when full, the oldest queued deliveries are dropped, with a logged count. Nothing is
    lost by that: a dropped row is still pending in the outbox and is queued again by a
    later `offer`."""

    def __init__(
        self,
        store: Store,
        settings: WebhookSettings,
        *,
        capacity: int = QUEUE_SIZE,
        sender: Sender | None = None,
        now: Clock = _utcnow,
    ) -> None:
        self.store = store
        self.settings = settings
        self.capacity = capacity
        self.now = now
        self.dropped = 0  # in all, since the start
        self._stop = threading.Event()
        self.sender = sender or Sender(settings, sleep=self._stop.wait, cancel=self._stop)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queue: collections.deque[int] = collections.deque()
        self._known: set[int] = set()  # queued or being sent
        self._finished: collections.deque[Delivery] = collections.deque(maxlen=1000)
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)
        self._thread.start()

    def offer(self, limit: int = 100) -> int:
        """Queue the due outbox rows not queued yet; returns how many were added. Reads the
        store, never the network."""
        return self.enqueue(due_rows(self.store, self.now(), limit))

    def enqueue(self, row_ids: Iterable[int]) -> int:
        added = dropped = 0
        with self._lock:
            for row_id in row_ids:
                if row_id in self._known:
                    continue
                if len(self._queue) >= self.capacity:
                    self._known.discard(self._queue.popleft())
                    dropped += 1
                self._queue.append(row_id)
                self._known.add(row_id)
                added += 1
            self.dropped += dropped
        if dropped:
            log.warning(
                "webhook queue full (%d): dropped the %d oldest deliveries (%d since start);"
                " they stay pending in the outbox and are queued again later",
                self.capacity,
                dropped,
                self.dropped,
            )
        if added:
            self._wake.set()
        return added

    def queued(self) -> int:
        with self._lock:
            return len(self._queue)

    def busy(self) -> bool:
        """Something queued or being sent."""
        with self._lock:
            return bool(self._known)

    def finished(self) -> list[Delivery]:
        """The deliveries done since the last call, oldest first."""
        with self._lock:
            done = list(self._finished)
            self._finished.clear()
        return done

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the attempt in progress (waits between attempts end at once)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def _next(self) -> int | None:
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            row_id = self._next()
            if row_id is None:
                self._wake.wait()
                continue
            try:
                delivery = deliver_row(self.store, self.settings, self.sender, row_id, self.now)
            except Exception:
                log.exception("webhook delivery of outbox row %d failed", row_id)
                delivery = None
            with self._lock:
                self._known.discard(row_id)
                if delivery is not None:
                    self._finished.append(delivery)


class SenderElection:
    """Which daemon of a fleet sends the webhooks. On PostgreSQL: the one holding the
    session-level advisory lock SENDER_LOCK_KEY on a connection it keeps out of the pool.
    A daemon without it tries to take it at most once per `period` seconds (jittered
    between half and all of it, so a fleet does not try in step): one statement, no table
    read. The sender checks its connection every `verify_every` seconds (`SELECT 1`) and
    drops the role on any error, with one log line; its lock went with its session, and
    another daemon takes it at its next try. Closing the store (engine disposed) releases
    it. On SQLite every daemon is a sender. `clock` (monotonic seconds) and `rng` are for
    tests.

    With `[store] pool = "null"` (a pooler such as pgbouncer in transaction mode between the
    daemons and the server) a session lock would stay on a server connection the pooler
    hands to others after the commit; the lock is then `pg_try_advisory_xact_lock` in a
    transaction the sender keeps open (the pooler keeps that server connection its own
    until it ends, as it ends when the daemon's connection closes)."""

    def __init__(
        self,
        store: Store,
        *,
        period: float = ELECTION_PERIOD,
        verify_every: float = VERIFY_PERIOD,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
        key: int = SENDER_LOCK_KEY,
    ) -> None:
        self.period = period
        self.verify_every = verify_every
        self.clock = clock
        self.rng = rng
        self.key = key
        self.backend = store.backend
        self._engine: Engine = store.engine
        self._lock = threading.Lock()
        self._held: Connection | None = None
        self._next_try = float("-inf")  # the first call tries at once
        self._next_verify = float("-inf")
        self._closed = False
        # Behind a transaction-mode pooler (no pool of our own): hold the lock in a
        # transaction instead of a session.
        self.transactional = isinstance(self._engine.pool, NullPool)
        if self.backend == "postgresql":
            event.listen(self._engine, "engine_disposed", self._on_dispose)

    def is_sender(self) -> bool:
        """Whether this daemon sends now; takes or checks the role when its time has come."""
        if self.backend != "postgresql":
            return True
        with self._lock:
            if self._closed:
                return False
            now = self.clock()
            if self._held is not None:
                if now >= self._next_verify:
                    self._verify(now)
                return self._held is not None
            if now >= self._next_try:
                self._next_try = now + self.period * (1.0 - 0.5 * self.rng())
                self._try(now)
            return self._held is not None

    @property
    def holding(self) -> bool:
        """The role as last known, without touching the database."""
        return self._held is not None

    def _try(self, now: float) -> None:
        conn = None
        try:
            conn = self._engine.connect()
            try_lock = "pg_try_advisory_xact_lock" if self.transactional else "pg_try_advisory_lock"
            got = bool(conn.execute(text(f"SELECT {try_lock}(:k)"), {"k": self.key}).scalar())
            if not self.transactional:
                conn.commit()  # the session lock outlives the transaction
        except Exception as exc:
            log.debug("webhook sender election: cannot try the lock: %s", _first_line(exc))
            got = False
        if not got:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            return
        self._held = conn
        self._next_verify = now + self.verify_every
        log.info("webhook: this daemon is the fleet's webhook sender (advisory lock %#x)", self.key)

    def _verify(self, now: float) -> None:
        held = self._held
        assert held is not None
        try:
            held.execute(text("SELECT 1"))
            if not self.transactional:
                held.commit()
        except Exception as exc:
            log.warning(
                "webhook: no longer the fleet's webhook sender (its store connection failed:"
                " %s); another daemon takes over within %.0f s",
                _first_line(exc),
                self.period,
            )
            self._drop()
            self._next_try = now + self.period * (1.0 - 0.5 * self.rng())
            return
        self._next_verify = now + self.verify_every

    def _drop(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        with contextlib.suppress(Exception):
            held.invalidate()  # never back to the pool: its session may still hold the lock
        with contextlib.suppress(Exception):
            held.close()

    def _on_dispose(self, engine: Engine) -> None:
        self.close()

    def close(self) -> None:
        """Give the role up (the session ends, and the lock with it)."""
        with self._lock:
            self._closed = True
            self._drop()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


_elections: weakref.WeakKeyDictionary[Store, SenderElection] = weakref.WeakKeyDictionary()


def election(store: Store) -> SenderElection:
    """The sender election of `store`, made on first use."""
    with _dispatchers_lock:
        current = _elections.get(store)
        if current is None:
            current = _elections[store] = SenderElection(store)
        return current


_dispatchers: weakref.WeakKeyDictionary[Store, Dispatcher] = weakref.WeakKeyDictionary()
_dispatchers_lock = threading.Lock()


def dispatcher(store: Store, settings: WebhookSettings) -> Dispatcher:
    """The delivery thread of `store`, started on first use (and again with new settings)."""
    with _dispatchers_lock:
        current = _dispatchers.get(store)
        if current is not None and current.settings == settings and current.alive():
            return current
        if current is not None:
            current.close(timeout=0)  # ends after its attempt in progress
        current = _dispatchers[store] = Dispatcher(store, settings)
        return current


def deliver_pending(
    store: Store,
    settings: WebhookSettings,
    *,
    limit: int = 100,
    sender: SenderElection | None = None,
) -> list[Delivery]:
    """What the daemon's ladder thread calls every round: hands the due outbox rows to the
    store's delivery thread and returns at once, with the deliveries that thread finished
    since the previous call. It never waits on the network (`deliver_round` does). On
    PostgreSQL only the fleet's elected sender reads the outbox (`SenderElection`; `sender`
    is for tests): the others return at once, having at most tried to take the role."""
    if not (sender or election(store)).is_sender():
        with _dispatchers_lock:
            current = _dispatchers.get(store)
        return current.finished() if current is not None else []
    worker = dispatcher(store, settings)
    worker.offer(limit)
    return worker.finished()


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
    "EVENT_HEADER",
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
    "election",
    "encode",
    "outbox",
    "sign",
    "signed_bytes",
    "verify_signature",
]

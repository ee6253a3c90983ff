"""One delivery of one body: signed POSTs over http.client and ssl, each attempt within its
deadline (connect, TLS handshake, request, answer), retried with backoff and jitter on
connection errors, timeouts, 5xx and 429 (Retry-After honoured); other 4xx are refused."""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import http.client
import logging
import random
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from medic_core.settings import WebhookSettings
from remediation.webhook.signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
)

log = logging.getLogger("medic.remediation.webhook")  # one logger for the whole package

USER_AGENT = "slurm-medic-webhook/2"
ERROR_LEN = 500
DETAIL_LEN = 300  # bytes of an error answer's body kept in last_error
RETRY_AFTER_LONGEST = 7 * 86400.0  # a larger (or garbled) Retry-After counts as this


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

"""Which daemon of a fleet sends the webhooks: on PostgreSQL the holder of an advisory lock
(`SenderElection`), on SQLite every daemon."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable

from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.pool import NullPool

from medic_core.store import Store

log = logging.getLogger("medic.remediation.webhook")  # one logger for the whole package

# The PostgreSQL session-level advisory lock whose holder is the fleet's one webhook sender
# (distinct from the migration, admission and sweep locks).
SENDER_LOCK_KEY = 0x4D45445748  # "MEDWH"
ELECTION_PERIOD = 60.0  # seconds between a non-sender's tries (jittered down to half)
VERIFY_PERIOD = 10.0  # seconds between the sender's checks of its held connection


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
_elections_lock = threading.Lock()


def election(store: Store) -> SenderElection:
    """The sender election of `store`, made on first use."""
    with _elections_lock:
        current = _elections.get(store)
        if current is None:
            current = _elections[store] = SenderElection(store)
        return current

"""The delivery thread of a store, and what the daemon's ladder thread calls every round
(`deliver_pending`): it hands the due outbox rows to that thread and never waits on the
network."""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from collections.abc import Iterable

from medic_core.settings import WebhookSettings
from medic_core.store import Store
from remediation.webhook.outbox_rows import Clock, Delivery, deliver_row, due_rows, utc_now
from remediation.webhook.sender import Sender
from remediation.webhook.sender_election import SenderElection, election

log = logging.getLogger("medic.remediation.webhook")  # one logger for the whole package

QUEUE_SIZE = 256  # deliveries waiting for the delivery thread; the oldest are dropped beyond


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
        now: Clock = utc_now,
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

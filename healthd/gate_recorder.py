"""The launch gate's records, written after the reply.

A gate decision is an event of the node (kind "gate"), but the prolog waits for nothing but
the verdict: the socket replies first and the event goes to a bounded queue that one writer
thread empties into the store, everything queued in one transaction (Store.add_events). The
writer lingers LINGER seconds after the first event for more: in the lab a transaction of a
few rows costs ~0.9 ms of CPU (SQLite, caches cold at one job start a second), a row in it
~0.02 ms, so at one start a second one transaction per 5 s costs 0.02 % of a core where one
per start cost 0.09 %; a daemon killed with SIGKILL loses up to that long of decisions (a
stop, a restart or a reload writes them first).

Nothing is lost on the way: a batch the store refuses (down, locked, its disk full), an event
that finds the queue full, and what is still queued or being written when the daemon exits go
to the node's write-ahead journal (medic_core.journal), in their order and with their own
times; the writer replays the journal once the store takes its writes again (as do the
daemon and the health check). A batch the store refuses as data is written one event at a
time: only the event it refuses goes to the journal (set aside as `.bad` at its replay), with
one line saying why.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DataError, IntegrityError

from medic_core import journal
from medic_core.config import NodePaths
from medic_core.store import Store

log = logging.getLogger("medic.healthd")

QUEUE_BOUND = 1024  # job starts; a node starts a few a second at the very most
EXIT_GRACE = 2.0  # seconds the writer gets at exit before the rest goes to the journal
# Seconds the writer waits after the first queued event for more, so that one transaction takes
# a busy node's starts (a transaction and a wake-up cost ~40x a row); flush() (the epilog's
# job_summary) and close() cut it short. A daemon killed with SIGKILL loses at most this much
# of its decisions.
LINGER = 5.0
# The store refuses the rows, not the write: the batch is tried again one event at a time.
REFUSED_AS_DATA = (ValueError, IntegrityError, DataError)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


@dataclass(frozen=True, eq=False)  # compared by identity: two equal events are two events
class Pending:
    at: dt.datetime
    event: Mapping[str, Any]  # Store.add_event's keywords but node and at
    after: Callable[[], object] | None = None  # more work off the request path, after the write


class EventRecorder:
    def __init__(
        self,
        store: Callable[[], Store],
        paths: NodePaths,
        node: str,
        bound: int = QUEUE_BOUND,
        linger: float = LINGER,
    ) -> None:
        self._store = store  # asked at each write: a reload may give the daemon a new store
        self._paths = paths
        self._node = node
        self._queue: queue.Queue[Pending] = queue.Queue(bound)
        self._linger = linger
        self._hurry = threading.Event()  # flush() or close() waits: write without lingering
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._journaled = False  # events of ours wait in the journal
        self._held = threading.local()  # a request's records, queued once it has its reply
        # The batch being written, and what close() kept of it in the journal meanwhile (the
        # writer removes those entries if its write gets through after all): under _flight.
        self._flight = threading.Lock()
        self._in_flight: list[Pending] = []
        self._claimed: dict[int, Path | None] = {}  # id(item) -> its journal entry
        self._closed = False

    def record(
        self,
        event: Mapping[str, Any],
        at: dt.datetime | None = None,
        after: Callable[[], object] | None = None,
    ) -> None:
        """Queue `event` for the store, and then `after` for the writer to call; returns at
        once."""
        item = Pending(at or dt.datetime.now(dt.UTC), event, after)
        held: list[Pending] | None = getattr(self._held, "items", None)
        if held is not None:
            held.append(item)
            return
        self._put(item)

    @contextlib.contextmanager
    def after_reply(self) -> Iterator[None]:
        """Hold what this thread records until the block ends (the socket writes its reply
        inside it): the writer then cannot take the interpreter from the reply."""
        self._held.items = []
        try:
            yield
        finally:
            items, self._held.items = self._held.items, None
            for item in items:
                self._put(item)

    def _put(self, item: Pending) -> None:
        if self._closed:
            self._keep(item, "medic-healthd is stopping")
            return
        self._start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._keep(item, "the gate recorder's queue is full")

    def flush(self, timeout: float) -> bool:
        """Wait, at most `timeout` seconds, until everything queued is written (or kept in
        the journal); False when some is still queued or being written."""
        deadline = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                self._hurry.set()  # again after each batch: the next one must not linger
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def close(self, timeout: float = EXIT_GRACE) -> None:
        """At exit: the writer gets `timeout` to finish; then the batch it is still writing
        and the rest of the queue go to the journal, in that order (a write that gets
        through after all removes its entries again)."""
        if self.flush(timeout):
            self._closed = True
            return
        with self._flight:
            self._closed = True  # what the writer takes from now on goes to the journal
            for item in self._in_flight:
                if id(item) not in self._claimed:
                    why = "medic-healthd stopped while it was being written"
                    self._claimed[id(item)] = self._keep(item, why)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            self._keep(item, "medic-healthd stopped before it was written")
            self._queue.task_done()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gate-recorder", daemon=True)
                self._thread.start()
                atexit.register(self.close)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            if self._linger > 0:
                self._hurry.wait(self._linger)
            self._hurry.clear()
            while True:  # everything queued now: one transaction
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write(batch)
            except Exception:  # a bug of ours: logged; the writer goes on
                log.exception("gate recorder: writing %d events failed", len(batch))
                with self._flight:
                    self._in_flight = []  # what close() kept of them stays in the journal
            for item in batch:
                try:
                    if item.after is not None:
                        item.after()
                except Exception:
                    log.exception("gate recorder: the work after an event failed")
            for _ in batch:
                self._queue.task_done()

    def _write(self, batch: list[Pending]) -> None:
        with self._flight:
            if self._closed:
                for item in batch:
                    self._keep(item, "medic-healthd stopped before it was written")
                return
            self._in_flight = list(batch)
        up: Store | None = None  # the store, when it took writes
        try:
            up = self._store()
            up.add_events([self._row(item) for item in batch])
        except REFUSED_AS_DATA:
            up = self._one_by_one(batch)
        except Exception as exc:  # the store: down, locked, full, read-only
            self._failed(batch, _first_line(exc))
            return
        else:
            self._written(batch)
        if up is not None and self._journaled:
            self._replay(up)

    def _row(self, item: Pending) -> dict[str, Any]:
        return {**item.event, "node": self._node, "at": item.at}

    def _one_by_one(self, batch: list[Pending]) -> Store | None:
        """The batch again, one event a transaction: only what the store refuses as data is
        kept aside; the store still taking writes is returned (None when it stopped)."""
        try:
            store = self._store()
        except Exception as exc:
            self._failed(batch, _first_line(exc))
            return None
        for place, item in enumerate(batch):
            try:
                store.add_events([self._row(item)])
            except REFUSED_AS_DATA as exc:
                why = f"the store refuses it as data ({_first_line(exc)})"
                self._failed([item], why, refused=True)
            except Exception as exc:
                self._failed(batch[place:], _first_line(exc))
                return None
            else:
                self._written([item])
        return store

    def _written(self, items: list[Pending]) -> None:
        with self._flight:
            for item in items:
                self._in_flight.remove(item)
                kept = self._claimed.pop(id(item), None)
                if kept is not None:  # close() kept it meanwhile: it is in the store now
                    journal.delivered(kept)

    def _failed(self, items: list[Pending], why: str, refused: bool = False) -> None:
        with self._flight:
            for item in items:
                self._in_flight.remove(item)
                if id(item) in self._claimed:  # close() kept it in the journal already
                    del self._claimed[id(item)]
                    continue
                self._keep(item, why, refused)

    def _keep(self, item: Pending, why: str, refused: bool = False) -> Path | None:
        record = {k: (str(v) if k == "severity" else v) for k, v in item.event.items()}
        what = f"event {item.event.get('kind')} ({item.event.get('target') or 'no target'})"
        try:
            kept = journal.write_ahead(self._paths, self._node, record, item.at)
        except journal.JournalFull as exc:
            log.error("%s lost: %s, and %s", what, why[:200], exc)
            return None
        self._journaled = True
        if refused:
            log.error("%s not stored: %s; kept in %s for a human", what, why[:300], kept)
        else:
            log.warning("%s kept in %s: %s", what, kept, why[:200])
        return kept

    def _replay(self, store: Store) -> None:
        def add(entry: journal.Entry) -> None:
            try:
                store.add_event(**entry.store_fields())
            except (IntegrityError, DataError) as exc:  # data: set aside, not retried forever
                raise ValueError(
                    f"{entry.path}: the store refuses it: {_first_line(exc)}"
                ) from None

        done = journal.replay(self._paths, add, deadline=time.monotonic() + 5.0)
        self._journaled = done.left > 0
        if done.delivered:
            log.info(
                "journal: %d events replayed into the store, %d left", done.delivered, done.left
            )
        for line in done.set_aside:
            log.error("journal: set aside (not data the store takes): %s", line)

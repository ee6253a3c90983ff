"""The launch gate's records, written after the reply.

A gate decision is an event of the node (kind "gate"), but the prolog waits for nothing but
the verdict: the socket replies first and the event goes to a bounded queue that one writer
thread empties into the store. Nothing is lost on the way: an event the store refuses (down,
locked, its disk full), one that finds the queue full, and what is still queued when the
daemon exits go to the node's write-ahead journal (medic_core.journal); the writer replays
the journal once the store takes its writes again (as do the daemon and the health check).
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
from typing import Any

from medic_core import journal
from medic_core.config import NodePaths
from medic_core.store import Store

log = logging.getLogger("medic.healthd")

QUEUE_BOUND = 1024  # job starts; a node starts a few a second at the very most
EXIT_GRACE = 2.0  # seconds the writer gets at exit before the rest goes to the journal


@dataclass(frozen=True)
class Pending:
    at: dt.datetime
    event: Mapping[str, Any]  # Store.add_event's keywords but node and at
    after: Callable[[], object] | None = None  # more work off the request path, after the write


class EventRecorder:
    def __init__(
        self, store: Callable[[], Store], paths: NodePaths, node: str, bound: int = QUEUE_BOUND
    ) -> None:
        self._store = store  # asked at each write: a reload may give the daemon a new store
        self._paths = paths
        self._node = node
        self._queue: queue.Queue[Pending] = queue.Queue(bound)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._journaled = False  # events of ours wait in the journal
        self._held = threading.local()  # a request's records, queued once it has its reply

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
        self._start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._keep(item, "the gate recorder's queue is full")

    def flush(self, timeout: float) -> bool:
        """Wait, at most `timeout` seconds, until everything queued is written (or kept in
        the journal); False when some is still queued."""
        deadline = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def close(self, timeout: float = EXIT_GRACE) -> None:
        """At exit: the writer gets `timeout` to finish, the rest goes to the journal."""
        if self.flush(timeout):
            return
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
            item = self._queue.get()
            try:
                self._write(item)
                if item.after is not None:
                    item.after()
            except Exception:  # a bug of ours: logged; the writer goes on
                log.exception("gate recorder: writing an event failed")
            finally:
                self._queue.task_done()

    def _write(self, item: Pending) -> None:
        try:
            store = self._store()
            store.add_event(node=self._node, at=item.at, **item.event)
        except Exception as exc:  # the store: down, locked, full, read-only
            self._keep(item, (str(exc).strip().splitlines() or [type(exc).__name__])[0])
            return
        if self._journaled:
            self._replay(store)

    def _keep(self, item: Pending, why: str) -> None:
        record = {k: (str(v) if k == "severity" else v) for k, v in item.event.items()}
        try:
            kept = journal.write_ahead(self._paths, self._node, record, item.at)
        except journal.JournalFull as exc:
            log.error("event %s lost: %s, and %s", item.event.get("kind"), why[:200], exc)
            return
        self._journaled = True
        log.warning("event %s kept in %s: %s", item.event.get("kind"), kept, why[:200])

    def _replay(self, store: Store) -> None:
        def add(entry: journal.Entry) -> None:
            e = entry.event
            store.add_event(
                node=entry.node,
                at=entry.at,
                kind=str(e["kind"]),
                severity=str(e.get("severity", "INFO")),
                source=str(e.get("source", "healthd")),
                message=str(e.get("message", "")),
                fault_class=str(e.get("fault_class", "")),
                target=str(e.get("target", "")),
                evidence=dict(e.get("evidence") or {}),
            )

        done = journal.replay(self._paths, add, deadline=time.monotonic() + 5.0)
        self._journaled = done.left > 0
        if done.delivered:
            log.info(
                "journal: %d events replayed into the store, %d left", done.delivered, done.left
            )

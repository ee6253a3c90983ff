"""Threads reused across calls that must each be able to overrun.

A check run or an NVML call gets a thread of its own, so a hung one cannot hold up the rest;
starting a new thread for each (a dozen a second with every check at 10 s) was a measurable
share of the daemon's CPU. A worker waits for its next call on a queue, which costs nothing
while it waits. The caller abandons a worker whose call overran: that worker takes no more
calls and exits when (if ever) the call returns, so a hang costs one thread, and the pool
starts a new one for the next call.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

KEEP_IDLE = 32  # workers kept waiting for calls; one more than that exits after its call


class Worker:
    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool
        self._calls: queue.SimpleQueue[tuple[Callable[[], object], str] | None] = (
            queue.SimpleQueue()
        )
        self.abandoned = False
        self.thread = threading.Thread(target=self._loop, name=pool.name, daemon=True)
        self.thread.start()

    def abandon(self) -> None:
        """Its call overran: the worker exits once the call returns, never taking another
        (at once, when the call returned in the meantime)."""
        self._pool.abandon(self)

    def _loop(self) -> None:
        thread = self.thread
        while True:
            job = self._calls.get()
            if job is None:
                return
            call, name = job
            thread.name = name  # py-spy and faulthandler name the check or call it is in
            with contextlib.suppress(BaseException):  # a call reports its own errors
                call()
            thread.name = self._pool.name
            if not self._pool.put_back(self):
                return


class WorkerPool:
    def __init__(self, name: str, keep_idle: int = KEEP_IDLE) -> None:
        self.name = name
        self._keep_idle = keep_idle
        self._idle: list[Worker] = []
        self._lock = threading.Lock()

    def start(self, call: Callable[[], object], name: str = "") -> Worker:
        """Run `call` on an idle worker (a new one when none is idle); the caller learns of
        its end through whatever `call` sets, and abandons the worker when it overran."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = Worker(self)
        worker._calls.put((call, name or self.name))
        return worker

    def put_back(self, worker: Worker) -> bool:
        """False when the worker was abandoned or enough workers already wait: it exits."""
        with self._lock:
            if worker.abandoned or len(self._idle) >= self._keep_idle:
                return False
            self._idle.append(worker)
            return True

    def abandon(self, worker: Worker) -> None:
        with self._lock:
            worker.abandoned = True
            if worker in self._idle:  # its call returned between the deadline and now
                self._idle.remove(worker)
                worker._calls.put(None)

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

"""The main loop's alarm clock: an Event that a signal also rings.

A plain threading.Event is not enough for a daemon's main thread. The kernel hands a
process-wide SIGTERM to any thread that does not block it; when that is not the main thread,
Python only notes the signal, and the main thread sleeps on in Event.wait until its timeout
(seen in CI: `systemctl stop` waited out a 60 s check interval). Here every set() and, once
`ring_on_signals()` is called, every signal writes one byte to a pipe that wait() polls, so
the main thread wakes, runs the Python handler and sees the stop at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import weakref


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class Wakeup:
    def __init__(self) -> None:
        self._flag = threading.Event()
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        weakref.finalize(self, _close, self._read, self._write)

    def set(self) -> None:
        self._flag.set()
        with contextlib.suppress(BlockingIOError):  # full: whoever waits wakes anyway
            os.write(self._write, b"\0")

    def clear(self) -> None:
        self._flag.clear()
        self._drain()

    def is_set(self) -> bool:
        return self._flag.is_set()

    def fileno(self) -> int:
        """Readable once set(): for a poll() that waits on other descriptors too."""
        return self._read

    def wait(self, timeout: float | None = None) -> bool:
        """True when set(); False on timeout or when only a signal rang (its handler has
        run by the time the caller looks at what it set)."""
        if self._flag.is_set():
            return True
        poller = select.poll()
        poller.register(self._read, select.POLLIN)
        poller.poll(None if timeout is None else max(0, int(timeout * 1000)))
        self._drain()
        return self._flag.is_set()

    def ring_on_signals(self) -> None:
        """Every signal with a Python handler writes to this pipe (main thread only)."""
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def _drain(self) -> None:
        try:
            while os.read(self._read, 512):
                pass
        except BlockingIOError:
            pass

"""The kernel log follower: a thread that notices new /dev/kmsg records as they are written
and wakes the checks that read them (`gpu_xid` for NVRM Xid lines, `kernel_log` for
warnings and worse), so a driver-logged XID or an MCE is judged in well under a second
instead of at the next interval. The checks still do the reading and judging themselves
(from their own sequence number): this thread only says "look now".

On the real device a poll() waits for records; on a regular file (a fixture tree, the lab)
inotify says when it changed (its size and mtime polled every `tick` where inotify is
missing). Either way the thread sleeps until there is something to read, and `stop()` wakes
it at once. Wake-ups are limited to one per check per `min_gap` seconds, so a log storm costs
at most one extra run per second.
"""

from __future__ import annotations

import logging
import os
import re
import select
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from healthd.inotify import FileWatch
from healthd.kmsg import parse_header
from healthd.wakeup import Wakeup
from healthd.xid import MEMORY_CHECKS, MEMORY_XIDS

log = logging.getLogger("medic.healthd.kmsg")

WARNING_LEVEL = 4  # kernel levels 0 (emerg) .. 4 (warning) wake the kernel_log check

# The mlx5 driver's link lines, logged at level 6 (info), so the level test alone misses
# them: "mlx5_core 0000:18:00.0 ibp24s0: Link down" (netdev_info in mlx5e_update_carrier),
# "... Link up", and the cable/module events "mlx5_core 0000:18:00.0: Module 0, status:
# unplugged" (older kernels: "...: Port module event: module 0, Cable unplugged"). They wake
# the ib check (the port's state is read from sysfs) and kernel_log (its mlx5 rules).
_IB_LINK = re.compile(
    r"^mlx5_core \S+ \S+: Link (?:down|up)\b"
    r"|^mlx5_core \S+: .*(?:Port module event|Module \d+, status)"
)


# "NVRM: Xid (PCI:0000:18:00): 94, pid=..., ...": the XID's number follows the "): ".
_XID_NUMBER = re.compile(r"NVRM: Xid \([^)]*\): (\d{1,4})\b")


def checks_for_line(line: str) -> tuple[str, ...]:
    """The checks a new kmsg record concerns."""
    record = parse_header(line)
    if record is None:
        return ()
    if "NVRM: Xid" in record.message:
        found = _XID_NUMBER.search(record.message)
        if found is not None and int(found.group(1)) in MEMORY_XIDS:
            return ("gpu_xid", "kernel_log", *MEMORY_CHECKS)
        return ("gpu_xid", "kernel_log")
    if _IB_LINK.search(record.message):
        return ("ib", "kernel_log")
    if record.level <= WARNING_LEVEL:
        return ("kernel_log",)
    return ()


class KmsgWatcher:
    def __init__(
        self,
        path: Path,
        wake: Callable[[Iterable[str]], None],
        *,
        tick: float = 0.5,
        min_gap: float = 1.0,
    ) -> None:
        self.path = path
        self._wake = wake
        self.tick = tick
        self.min_gap = min_gap
        self._stop = Wakeup()
        self._thread: threading.Thread | None = None
        self._last_wake: dict[str, float] = {}
        self._armed = threading.Event()  # set once the follower took its place in the log

    def start(self, armed_within: float = 2.0) -> None:
        """Start following; returns once the follower holds its place in the log (a line
        written after this is seen), or after `armed_within` seconds."""
        self._stop.clear()
        self._armed.clear()
        self._thread = threading.Thread(target=self._main, name="kmsg-watch", daemon=True)
        self._thread.start()
        self._armed.wait(armed_within)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _notify(self, names: Iterable[str]) -> None:
        now = time.monotonic()
        due = [n for n in names if now - self._last_wake.get(n, -1e18) >= self.min_gap]
        for name in due:
            self._last_wake[name] = now
        if due:
            self._wake(due)

    def _main(self) -> None:
        while not self._stop.is_set():
            try:
                mode = os.stat(self.path).st_mode
                if stat.S_ISCHR(mode):
                    self._follow_device()
                else:
                    self._follow_file()
            except OSError as exc:
                log.debug("kernel log %s unreadable: %s", self.path, exc)
            self._armed.set()  # nothing to hold a place in: start() need not wait
            self._stop.wait(self.tick * 10)  # the file vanished or errored: retry slowly

    def _follow_device(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(fd, 0, os.SEEK_END)  # only what is logged from now on
            self._armed.set()
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.register(self._stop.fileno(), select.POLLIN)
            while not self._stop.is_set():
                if not poller.poll():
                    continue
                names: set[str] = set()
                while True:
                    try:
                        chunk = os.read(fd, 65536)  # one record per read on /dev/kmsg
                    except BlockingIOError:
                        break
                    except BrokenPipeError:  # records overwritten before we read them
                        names.update(("gpu_xid", "kernel_log"))
                        continue
                    if not chunk:
                        break
                    names.update(checks_for_line(chunk.decode(errors="replace")))
                self._notify(names)
        finally:
            os.close(fd)

    def _follow_file(self) -> None:
        watch = FileWatch.open(self.path)
        try:
            self._follow_file_with(watch)
        finally:
            if watch is not None:
                watch.close()

    def _follow_file_with(self, watch: FileWatch | None) -> None:
        seen = os.stat(self.path)
        size = seen.st_size
        self._armed.set()
        poller = select.poll()
        poller.register(self._stop.fileno(), select.POLLIN)
        if watch is not None:
            poller.register(watch.fileno(), select.POLLIN)
        while True:
            if watch is None:
                self._stop.wait(self.tick)
            else:
                poller.poll()
                watch.drain()
            if self._stop.is_set():
                return
            now = os.stat(self.path)
            if (now.st_size, now.st_mtime_ns, now.st_ino) == (
                seen.st_size,
                seen.st_mtime_ns,
                seen.st_ino,
            ):
                continue
            names: set[str] = set()
            with open(self.path, "rb") as f:
                if now.st_ino == seen.st_ino and now.st_size >= size:
                    f.seek(size)
                for line in f.read().decode(errors="replace").splitlines():
                    names.update(checks_for_line(line))
            if watch is not None and now.st_ino != seen.st_ino:
                watch.rewatch()  # the file was replaced under its name: watch the new one
            seen, size = now, now.st_size
            self._notify(names)

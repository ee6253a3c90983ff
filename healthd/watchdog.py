"""systemd's watchdog, pinged only while the daemon really makes progress.

A thread of its own sends WATCHDOG=1 every `period` (half of WatchdogSec) as long as every
watched part (the check scheduler, the XID listener) has shown progress within
`stall_after` seconds. When one has not, it stops pinging and logs one line naming the
part and how long it has been stuck, so systemd restarts the daemon (a thread stuck in a
hung NVML call or a dead mount cannot be unstuck from inside). A part that recovers before
systemd acts is logged once too, and the pings resume.

Each part reports its own progress as "seconds since I last went round" (`stalled_for`);
None means it is not running (yet) and is not judged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from healthd import sdnotify

log = logging.getLogger("medic.healthd")

StalledFor = Callable[[], float | None]


class Heartbeat:
    """When a loop last went round: `beat()` as it starts and once per round. Before the
    first beat the loop is not running yet, and `stalled_for()` is None."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._at: float | None = None

    def beat(self) -> None:
        self._at = self._clock()

    def stalled_for(self) -> float | None:
        at = self._at
        return None if at is None else self._clock() - at


class Watchdog:
    def __init__(
        self,
        period: float,
        stall_after: float,
        *,
        notify: Callable[[str], object] = sdnotify.notify,
    ) -> None:
        self.period = period
        self.stall_after = stall_after
        self._notify = notify
        self._parts: dict[str, StalledFor] = {}
        self._stalled: dict[str, float] = {}  # part -> seconds without progress, as logged
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, part: str, stalled_for: StalledFor) -> None:
        """Ping only while `stalled_for()` stays within the bound; `part` names it in the log."""
        self._parts[part] = stalled_for

    def check(self) -> bool:
        """One round: ping systemd when every part made progress within the bound (True);
        otherwise withhold the ping and say which part is stalled, once per stall."""
        stalled: dict[str, float] = {}
        for part, stalled_for in self._parts.items():
            seconds = stalled_for()
            if seconds is not None and seconds > self.stall_after:
                stalled[part] = seconds
        recovered = [part for part in self._stalled if part not in stalled]
        if recovered:
            log.warning(
                "watchdog: %s made progress again%s",
                " and ".join(recovered),
                "" if stalled else ": WATCHDOG=1 resumed",
            )
        if not stalled.keys() <= self._stalled.keys():  # news: a part stalled
            log.error(
                "watchdog: no progress from %s (bound %gs): WATCHDOG=1 withheld, so systemd "
                "restarts medic-healthd",
                " and ".join(f"{part} for {seconds:.0f}s" for part, seconds in stalled.items()),
                self.stall_after,
            )
        self._stalled = stalled
        if stalled:
            return False
        self._notify("WATCHDOG=1")
        return True

    def start(self) -> threading.Thread:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception:  # no ping this round; the next one tries again
                log.exception("watchdog round failed")
            self._stop.wait(self.period)

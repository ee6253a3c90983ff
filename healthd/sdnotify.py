"""systemd's notify protocol (sd_notify) without libsystemd: one datagram per message.

READY=1 once the socket answers, STOPPING=1 on the way out, WATCHDOG=1 from the watchdog
(`healthd.watchdog`), STATUS=<one line> every few seconds for `systemctl status`
(`StatusReporter`), and around a SIGHUP reload RELOADING=1 with MONOTONIC_USEC= and then
READY=1 again (`reloading`), as sd_notify(3) describes."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("medic.healthd")

STATUS_PERIOD = 10.0  # seconds between STATUS= lines


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Run by systemd with a notify socket (Type=notify)."""
    env = os.environ if environ is None else environ
    return bool(env.get("NOTIFY_SOCKET"))


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send e.g. "READY=1" or "WATCHDOG=1"; False when not run by systemd (no NOTIFY_SOCKET)."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:
        return False
    return True


def reloading() -> str:
    """The message that starts a reload: RELOADING=1 with CLOCK_MONOTONIC in microseconds
    (MONOTONIC_USEC=, which systemd reads since 253; older ones ignore it). READY=1 ends it."""
    return f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"


def status(line: str) -> str:
    """STATUS=<line>, on one line (systemd shows it in `systemctl status`)."""
    return "STATUS=" + " ".join(line.split())


def watchdog_period(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of WatchdogSec, as sd_watchdog_enabled advises."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000


class StatusReporter:
    """Sends STATUS=`line()` at once and then every `period` seconds, on a thread of its own
    (so a stuck scheduler shows as "last round 300 s ago", not as its last good line)."""

    def __init__(
        self,
        line: Callable[[], str],
        period: float = STATUS_PERIOD,
        *,
        notify: Callable[[str], object] = notify,
    ) -> None:
        self.line = line
        self.period = period
        self._notify = notify
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send(self) -> None:
        try:
            self._notify(status(self.line()))
        except Exception:  # no line this time; the next one tries again
            log.exception("STATUS= line failed")

    def start(self) -> threading.Thread:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sd-status", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.send()
            self._stop.wait(self.period)

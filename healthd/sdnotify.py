"""systemd's notify protocol (sd_notify) without libsystemd: one datagram per message."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


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


def watchdog_period(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of WatchdogSec, as sd_watchdog_enabled advises."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000

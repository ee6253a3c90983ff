"""medic-healthd's log lines: with a timestamp on a terminal or in a file; for the journal
(systemd connected stderr to it) with no timestamp, since journald stamps every entry
itself, and with a `<N>` syslog priority in front of every line, which journald reads as the
entry's priority (`SyslogLevelPrefix=`, on by default), so `journalctl -p err` finds the
errors, a traceback's lines included.

systemd says stderr is the journal by setting JOURNAL_STREAM to the stream's device and inode
("dev:ino"); as systemd.exec(5) advises, that is compared with stderr itself, so a process
whose stderr was redirected elsewhere, with the variable inherited, writes plain lines.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JOURNAL_FORMAT = "%(levelname)s %(name)s: %(message)s"


def syslog_priority(levelno: int) -> int:
    """syslog(3)'s priority for a logging level: 2 crit, 3 err, 4 warning, 6 info, 7 debug."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def with_priority(text: str, levelno: int) -> str:
    """Every line of `text` with the level's `<N>` prefix: journald makes each line of a
    stream an entry of its own, and a line without a prefix would be `info`."""
    prefix = f"<{syslog_priority(levelno)}>"
    return "\n".join(prefix + line for line in text.split("\n"))


class JournalFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(JOURNAL_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return with_priority(super().format(record), record.levelno)


def is_journal(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """`stream` is connected to the journal: JOURNAL_STREAM names its device and inode."""
    env = os.environ if environ is None else environ
    device, _, inode = env.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        stat = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # closed, or no descriptor (a test's)
        return False
    return (stat.st_dev, stat.st_ino) == (int(device), int(inode))


class _Handler(logging.StreamHandler[TextIO]):
    """The handler `configure` installs (and replaces when called again)."""


def configure(level: str, stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Log to `stream` (stderr) at `level` in the journal's form or the plain one; True when
    it is the journal."""
    journal = is_journal(stream, environ)
    handler = _Handler(stream)
    handler.setFormatter(JournalFormatter() if journal else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:  # called again
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return journal

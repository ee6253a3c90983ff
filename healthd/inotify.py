"""Linux inotify through ctypes, for the one file the kernel-log follower watches when it is
a regular file (a fixture tree, the lab): a write wakes the follower instead of a stat every
half second. None where inotify is missing (the caller then polls)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVE_SELF = 0x00000800
IN_DELETE_SELF = 0x00000400
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
FILE_CHANGES = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVE_SELF | IN_DELETE_SELF


class FileWatch:
    """An inotify descriptor watching one path; `fileno()` turns readable when it changes,
    `drain()` empties it, `rewatch()` follows a file replaced under the same name."""

    def __init__(self, fd: int, libc: ctypes.CDLL, path: Path) -> None:
        self._fd, self._libc, self.path = fd, libc, path

    @classmethod
    def open(cls, path: Path) -> FileWatch | None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        watch = cls(fd, libc, path)
        if not watch.rewatch():
            watch.close()
            return None
        return watch

    def rewatch(self) -> bool:
        return bool(
            self._libc.inotify_add_watch(self._fd, os.fsencode(self.path), FILE_CHANGES) >= 0
        )

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> None:
        try:
            while os.read(self._fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self._fd)

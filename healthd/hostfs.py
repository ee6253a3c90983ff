"""Readers of /sys, /proc and /dev below a configurable root, and bounded calls for
filesystems that may hang.

"Not present" and "failed" are kept apart: `read_text` returns None when the file does not
exist (the hardware is absent, a process exited) and raises OSError when it exists but
cannot be read, so a check can say NOT_APPLICABLE for the first and UNKNOWN for the second.

sysfs and procfs attributes are generated in memory and do not block on storage, so they
are read directly (with a size cap); anything that touches a mounted filesystem (statvfs, a
write probe) goes through `bounded_call`, because a hung NFS or Lustre server leaves the
caller in uninterruptible sleep that no signal or timeout can cut short.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Generic, Protocol, TypeVar

MAX_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class HostRoots:
    """The host as seen from `root` ("/" in production, a fixture tree in tests and in the
    lab)."""

    root: Path = Path("/")

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    def path(self, host_path: str | PurePosixPath) -> Path:
        """Where the host's absolute path `host_path` (e.g. a mount point) lives below root."""
        rel = PurePosixPath(host_path)
        parts = [p for p in rel.parts if p != "/"]
        if ".." in parts:
            raise ValueError(f"{host_path}: '..' is not allowed in a host path")
        return self.root.joinpath(*parts)


def read_text(root: Path, rel: str, *, max_bytes: int = MAX_READ_BYTES) -> str | None:
    """The text of root/rel, or None when it does not exist. Other errors raise."""
    try:
        with open(root / rel, "rb") as fh:
            data = fh.read(max_bytes)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return data.decode("utf-8", errors="replace")


def read_value(root: Path, rel: str) -> str | None:
    """A one-line sysfs attribute, stripped."""
    text = read_text(root, rel)
    return None if text is None else text.strip()


def read_int(root: Path, rel: str) -> int | None:
    """An integer attribute; a value that is not an integer raises ValueError."""
    text = read_value(root, rel)
    return None if text is None else int(text, 0)


def list_dir(root: Path, rel: str) -> list[str] | None:
    """Sorted entry names of root/rel, or None when it does not exist."""
    try:
        return sorted(os.listdir(root / rel))
    except (FileNotFoundError, NotADirectoryError):
        return None


def parse_range_list(text: str) -> frozenset[int]:
    """A kernel CPU/node list such as "0-3,8,10-11" (empty text is the empty set)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, sep, high = part.partition("-")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"bad range {part!r} in {text!r}")
        out.update(range(first, last + 1))
    return frozenset(out)


def format_range_list(values: frozenset[int] | set[int]) -> str:
    """The inverse of parse_range_list, for messages: {0,1,2,5} -> "0-2,5"."""
    items = sorted(values)
    spans: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        spans.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(spans)


# --- mounted filesystems -------------------------------------------------------------------


@dataclass(frozen=True)
class FsUsage:
    total_bytes: int
    avail_bytes: int
    total_inodes: int  # 0 when the filesystem does not count inodes
    avail_inodes: int


class MountOps(Protocol):
    """The operations on a mounted filesystem that can hang; tests inject slow fakes."""

    def usage(self, path: Path) -> FsUsage: ...

    def write_probe(self, path: Path) -> None: ...


@dataclass(frozen=True)
class OsMountOps:
    probe_name: str = field(
        default_factory=lambda: f".medic-probe.{socket.gethostname()}.{os.getpid()}"
    )

    def usage(self, path: Path) -> FsUsage:
        st = os.statvfs(path)
        return FsUsage(
            total_bytes=st.f_blocks * st.f_frsize,
            avail_bytes=st.f_bavail * st.f_frsize,
            total_inodes=st.f_files,
            avail_inodes=st.f_favail,
        )

    def write_probe(self, path: Path) -> None:
        # Named per host and process: home and Lustre are shared by every node.
        probe = path / self.probe_name
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"medic\n")
        finally:
            os.close(fd)
        os.unlink(probe)


T = TypeVar("T")


class CallTimedOut(TimeoutError):
    pass


class BoundedCall(Generic[T]):
    """`fn()` in a daemon thread. `wait(timeout)` returns its value, re-raises its
    exception, or raises CallTimedOut while the thread goes on; `alive` tells the caller
    not to start another call on the same thing while this one still hangs."""

    def __init__(self, fn: Callable[[], T], *, name: str, started_at: float) -> None:
        self.started_at = started_at
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()

    @property
    def alive(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float) -> T:
        if not self._done.wait(max(0.0, timeout)):
            raise CallTimedOut(f"{self._thread.name}: no answer after {timeout:.1f}s")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

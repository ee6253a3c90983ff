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

import contextlib
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Generic, Protocol, TypeVar

MAX_READ_BYTES = 1 << 20
READ_CHUNK = 1 << 16


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
    """The text of root/rel (at most `max_bytes`), or None when it does not exist. Other
    errors raise.

    Plain os.read in READ_CHUNK pieces: a buffered file object reading `max_bytes` at once
    allocated and freed a megabyte per attribute, 3x the cost of a sysfs read (the ib check
    reads a dozen attributes per port every run)."""
    try:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        chunks: list[bytes] = []
        size = 0
        while size < max_bytes:
            chunk = os.read(fd, min(READ_CHUNK, max_bytes - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def read_value(root: Path, rel: str) -> str | None:
    """A one-line sysfs attribute, stripped."""
    text = read_text(root, rel)
    return None if text is None else text.strip()


def read_int(root: Path, rel: str) -> int | None:
    """An integer attribute; a value that is not an integer raises ValueError naming the
    file and (the start of) what it holds."""
    text = read_value(root, rel)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        raise ValueError(f"{rel}: {_clip(text)} is not an integer") from None


def _clip(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def list_dir(root: Path, rel: str) -> list[str] | None:
    """Sorted entry names of root/rel, or None when it does not exist."""
    try:
        return sorted(os.listdir(root / rel))
    except (FileNotFoundError, NotADirectoryError):
        return None


# CPU and NUMA node ids: Linux builds with at most 8192 CPUs (NR_CPUS); a list reaching past
# this is not the kernel's, and expanding it would take the memory and time of a hang.
MAX_RANGE_ID = 1 << 16


def parse_range_list(text: str) -> frozenset[int]:
    """A kernel CPU/node list such as "0-3,8,10-11" (empty text is the empty set); anything
    else, or an id above MAX_RANGE_ID, raises ValueError with (the start of) the text."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, sep, high = part.partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise ValueError(f"{_clip(part)} in {_clip(text)} is not a range of ids") from None
        if not 0 <= first <= last:
            raise ValueError(f"bad range {_clip(part)} in {_clip(text)}")
        if last > MAX_RANGE_ID:
            raise ValueError(f"range {_clip(part)} reaches past id {MAX_RANGE_ID}")
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


# Creating a file where other users can write (a group-writable mount, /var/tmp): the name
# is unguessable, O_EXCL|O_NOFOLLOW never follows or reuses what someone planted there,
# O_NONBLOCK never waits on a FIFO, and everything happens relative to a directory fd that
# was itself opened without following a symlink, so the directory cannot be swapped.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


@contextlib.contextmanager
def private_file(directory: Path, prefix: str, flags: int = os.O_WRONLY) -> Iterator[int]:
    """A new file `<prefix>.<random hex>` in `directory`, mode 0600, as an fd; removed on
    exit. Raises OSError when `directory` is a symlink or not a directory (ELOOP, ENOTDIR),
    and never opens anything that already existed."""
    dir_fd = os.open(directory, _DIR_FLAGS)
    try:
        name = f"{prefix}.{secrets.token_hex(16)}"
        fd = os.open(name, flags | _CREATE_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # O_EXCL makes this impossible
                raise OSError(f"{directory / name}: not a regular file")
            yield fd
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class OsMountOps:
    probe_prefix: str = ".medic-probe"

    def usage(self, path: Path) -> FsUsage:
        st = os.statvfs(path)
        return FsUsage(
            total_bytes=st.f_blocks * st.f_frsize,
            avail_bytes=st.f_bavail * st.f_frsize,
            total_inodes=st.f_files,
            avail_inodes=st.f_favail,
        )

    def write_probe(self, path: Path) -> None:
        # A random name per probe: home and Lustre are shared by every node and writable
        # by users, so the name must be neither guessable nor reused (see private_file).
        with private_file(path, self.probe_prefix) as fd:
            os.write(fd, b"medic\n")


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

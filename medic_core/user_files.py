"""Reading and deleting inside a directory someone else controls: a job's checkpoint
directory, read by root for `medic ckpt latest`, `medic report --checkpoints` and pruned by
`medic ckpt prune` (docs/security.md, "Checkpoint directories").

The directory's owner can plant anything in it: a symlink to a root-only file, a FIFO that
blocks an open or a read forever, a hard link, a huge or sparse file. So, below the directory
named (which is the caller's choice and is opened as named):

* every name is opened relative to its directory's descriptor with O_NOFOLLOW (a symlink is
  refused, ELOOP) and O_NONBLOCK (a FIFO opens at once), and checked with fstat on what was
  opened: a regular file (a directory for a subdirectory), owned by the directory's owner
  (or by the caller itself when it is not root);
* a read is capped (`limit`), checked against the size before and the bytes read after;
* every open and read runs under a deadline (SIGALRM, in the main thread: a hung NFS or FUSE
  mount blocks a regular file's read as a FIFO would);
* a tree is removed only after every entry in it was verified (`remove_tree`).

Each refusal is an UnsafeFile whose message is one line: the path and why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType

READ_TIMEOUT = 30.0  # seconds one open or read of someone else's file may block (a hung mount)
MANIFEST_LIMIT = 64 << 20  # bytes: a manifest naming a million files is ~60 MB
SMALL_LIMIT = 64 << 10  # bytes: a resume mark is ~100
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_CHUNK = 1 << 20


class UnsafeFile(Exception):
    """A file or directory not opened, read or removed: `path: why`, one line."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise TimeoutError in a system call still blocked after `seconds` (SIGALRM; in the
    main thread only, elsewhere no deadline). An outer timer is suspended, then restored."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"no answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, outer)


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink, not followed"
    if exc.errno == errno.ENOTDIR:
        return "not a directory"
    return exc.strerror or str(exc)


class UserDir:
    """An open directory whose entries are opened without trusting them (the module's
    docstring). `owner`: the uid files in it must have, the top directory's owner."""

    def __init__(
        self, fd: int, path: Path, owner: int, *, timeout: float | None = READ_TIMEOUT
    ) -> None:
        me = os.geteuid()
        self.fd, self.path, self.owner = fd, path, owner
        # Someone else's directory is read under the deadline; a job's own is not (a slow
        # but working Lustre must not make a job start again from step 0).
        self.timeout = timeout if owner != me else None
        # Root trusts only the owner's files; anyone else may also read their own (a job
        # writing into a project directory another account owns).
        self.trusted = frozenset({owner} if me == 0 else {owner, me})

    @classmethod
    def open(cls, path: Path, *, timeout: float | None = READ_TIMEOUT) -> UserDir:
        """The directory as named (the caller chose it), its owner the owner of all below."""
        try:  # under the deadline when root opens it (a job opening its own is left alone)
            with deadline(timeout if os.geteuid() == 0 else None):
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK)
        except (OSError, TimeoutError) as exc:
            raise UnsafeFile(path, _why(exc) if isinstance(exc, OSError) else str(exc)) from None
        return cls(fd, path, os.fstat(fd).st_uid, timeout=timeout)

    def __enter__(self) -> UserDir:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _checked(self, fd: int, path: Path, want: int) -> os.stat_result:
        st = os.fstat(fd)
        if stat.S_IFMT(st.st_mode) != want:
            kind = "a regular file" if want == stat.S_IFREG else "a directory"
            raise UnsafeFile(path, f"not {kind}")
        if st.st_uid not in self.trusted:
            raise UnsafeFile(
                path, f"owned by uid {st.st_uid}, not by the directory's owner (uid {self.owner})"
            )
        return st

    def _open(self, name: str, flags: int, want: int) -> tuple[int, os.stat_result]:
        path = self.path / name
        if not name or "/" in name or name in (".", ".."):
            raise UnsafeFile(path, "not a plain name")
        try:
            with deadline(self.timeout):
                fd = os.open(name, flags, dir_fd=self.fd)
        except OSError as exc:
            raise UnsafeFile(path, _why(exc)) from None
        except TimeoutError as exc:
            raise UnsafeFile(path, str(exc)) from None
        try:
            return fd, self._checked(fd, path, want)
        except BaseException:
            os.close(fd)
            raise

    def names(self) -> list[str]:
        """The directory's entries (unverified names)."""
        try:
            with deadline(self.timeout):
                return os.listdir(self.fd)
        except OSError as exc:
            raise UnsafeFile(self.path, _why(exc)) from None
        except TimeoutError as exc:
            raise UnsafeFile(self.path, str(exc)) from None

    def subdir(self, name: str) -> UserDir:
        fd, _ = self._open(name, _DIR_FLAGS, stat.S_IFDIR)
        sub = UserDir(fd, self.path / name, self.owner)
        sub.timeout, sub.trusted = self.timeout, self.trusted
        return sub

    @contextlib.contextmanager
    def opened(self, relative: str) -> Iterator[tuple[int, os.stat_result]]:
        """A regular file below this directory (`a/b/c`: each directory on the way checked
        too), open for reading, and its verified stat."""
        *dirs, name = relative.split("/")
        with contextlib.ExitStack() as stack:
            here = self
            for part in dirs:
                here = stack.enter_context(here.subdir(part))
            fd, st = here._open(name, _FILE_FLAGS, stat.S_IFREG)
            stack.callback(os.close, fd)
            yield fd, st

    def read(self, relative: str, *, limit: int) -> bytes:
        """A regular file's bytes, at most `limit` of them (else UnsafeFile)."""
        path = self.path / relative
        with self.opened(relative) as (fd, st):
            if st.st_size > limit:
                raise UnsafeFile(path, f"larger than {limit} bytes")
            data = b"".join(self.chunks(fd, path, limit + 1))
        if len(data) > limit:  # grew since the stat
            raise UnsafeFile(path, f"larger than {limit} bytes")
        return data

    def chunks(self, fd: int, path: Path, limit: int | None = None) -> Iterator[bytes]:
        """An open file's bytes in chunks, each read under the deadline."""
        left = limit
        while left is None or left > 0:
            try:
                with deadline(self.timeout):
                    chunk = os.read(fd, _CHUNK if left is None else min(_CHUNK, left))
            except OSError as exc:
                raise UnsafeFile(path, _why(exc)) from None
            except TimeoutError as exc:
                raise UnsafeFile(path, str(exc)) from None
            if not chunk:
                return
            if left is not None:
                left -= len(chunk)
            yield chunk

    # ---- removal -------------------------------------------------------------------------

    def _verify_tree(self, name: str) -> None:
        """`name` and everything below it: real directories and files (a symlink inside is
        only unlinked, never followed), every one owned as this directory's files must be.
        One directory open at a time per level walked, closed once read."""
        top = self.subdir(name)
        pending = [top]
        try:
            while pending:
                here = pending.pop()
                try:
                    for entry in here.names():
                        try:
                            st = os.stat(entry, dir_fd=here.fd, follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if st.st_uid not in self.trusted:
                            raise UnsafeFile(
                                top.path,
                                f"holds {(here.path / entry).relative_to(top.path)}, owned by"
                                f" uid {st.st_uid}, not by the directory's owner"
                                f" (uid {self.owner})",
                            )
                        if stat.S_ISDIR(st.st_mode):
                            pending.append(here.subdir(entry))
                finally:
                    here.close()
        finally:
            for left in pending:
                left.close()

    def remove_tree(self, name: str, trash_prefix: str) -> None:
        """Remove directory `name` once it and everything in it is verified: renamed to
        `trash_prefix<name>.<random>` first (a reader never sees half of it), then removed
        without following anything. UnsafeFile (nothing removed, or the trash left and named)
        when it cannot."""
        path = self.path / name
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError as exc:
            raise UnsafeFile(path, _why(exc)) from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeFile(path, "a symlink, not followed and not removed")
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeFile(path, "not a directory, not removed")
        self._verify_tree(name)
        trash = name
        if not name.startswith(trash_prefix):  # an earlier prune's trash is removed in place
            trash = f"{trash_prefix}{name}.{secrets.token_hex(4)}"
            try:
                os.rename(name, trash, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except OSError as exc:
                raise UnsafeFile(path, f"not removed ({_why(exc)})") from None
        failed: list[str] = []
        shutil.rmtree(trash, dir_fd=self.fd, onerror=lambda *a: failed.append(str(a[2][1])))
        if failed:
            raise UnsafeFile(path, f"renamed to {trash} but not all removed ({failed[0]})")

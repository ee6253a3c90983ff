"""Committing a step, never torn: the job's files go into a fresh temporary directory, are
fsynced, the manifest is written and fsynced last (the completion marker), the directory is
renamed to `step-NNNNNNNNN` and its parent fsynced; then the ledger gets the commit. Also
committing a directory the job already wrote (`CheckpointDir.commit`), which never loses it.

Tests stop a commit (or a node-local tier's drain) at its points, as a kill would: `_fault`
is called with "<tier>:<point>"."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from slurm_hooks.checkpoint.layout import (
    DIR_ENV,
    FORMAT,
    JOB_ENV,
    MANIFEST,
    TMP_PREFIX,
    CheckpointError,
    FileEntry,
    StepDirectory,
    check_step,
    fsync_path,
    host,
    restart_count,
    step_name,
)
from slurm_hooks.checkpoint.ledger import COMMIT, LedgerRecord, append_ledger

_HASH_CHUNK = 1 << 20
_fault: Callable[[str], None] | None = None


def point(name: str) -> None:
    if _fault is not None:
        _fault(name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def staging(
    ckpt: StepDirectory,
    step: int,
    undo: Callable[[Path], str | None] | None = None,
    *,
    before_commit: Callable[[Path], None] | None = None,
    stamp: tuple[float, float | None] | None = None,
    expect: Mapping[str, FileEntry] | None = None,
) -> Iterator[Path]:
    """`CheckpointDir.writing` without a node-local tier, with `undo(tmp)` called on failure
    before the temporary directory is removed: it gives back what it must not lose and
    returns None, or says why it could not (then the directory is kept and the error names
    it). `before_commit(tmp)` may refuse the commit by raising; a drain passes the step's own
    `stamp` (time, started) and the files it must `expect` (the commit is refused when they
    differ)."""
    check_step(step)
    final = ckpt.root / step_name(step)
    if final.exists():
        raise CheckpointError(
            f"{final}: step {step} is already checkpointed; write a later step or remove {final}"
        )
    tmp = ckpt.root / f"{TMP_PREFIX}{step:09d}.{host()}.{os.getpid()}.{secrets.token_hex(4)}"
    started = time.time()  # the commit's duration, in its manifest (medic report)
    try:
        ckpt.root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:
        raise CheckpointError(
            f"{ckpt.root}: cannot create a checkpoint there ({exc.strerror or exc}); "
            f"point {DIR_ENV} (or --dir) at a directory you can write"
        ) from None
    try:
        yield tmp
        point(f"{ckpt._tier}:written")
        if before_commit is not None:
            before_commit(tmp)
        try:
            _commit(ckpt, tmp, final, step, started, stamp=stamp, expect=expect)
        except OSError as exc:  # a full or read-only file system, an I/O error
            where = exc.filename or tmp
            raise CheckpointError(
                f"{where}: cannot commit step {step} ({exc.strerror or exc}); free space "
                "or fix the file system, then write the step again"
            ) from None
    except BaseException as exc:
        kept = undo(tmp) if undo is not None else None
        if kept is None:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: as they are
            raise
        raise CheckpointError(f"{exc}; and {kept}") from exc


def _commit(
    ckpt: StepDirectory,
    tmp: Path,
    final: Path,
    step: int,
    started: float | None,
    *,
    stamp: tuple[float, float | None] | None = None,
    expect: Mapping[str, FileEntry] | None = None,
) -> None:
    if (tmp / MANIFEST).exists():
        raise CheckpointError(f"{tmp / MANIFEST}: name reserved for Medic's manifest")
    files: dict[str, dict[str, Any]] = {}
    for dirpath, dirnames, filenames in os.walk(tmp):
        here = Path(dirpath)
        for name in sorted(filenames):
            path = here / name
            if path.is_symlink() or not path.is_file():
                raise CheckpointError(
                    f"{path}: a checkpoint holds only regular files and directories; "
                    "copy the target instead of linking it"
                )
            fsync_path(path)
            entry: dict[str, Any] = {"size": path.stat().st_size}
            if ckpt.hash_files or expect is not None:
                entry["sha256"] = _sha256(path)
            files[path.relative_to(tmp).as_posix()] = entry
        for name in dirnames:
            if (here / name).is_symlink():
                raise CheckpointError(
                    f"{here / name}: a checkpoint holds only regular files and directories"
                )
        fsync_path(here)
    if expect is not None:
        got = {name: FileEntry(e["size"], e["sha256"]) for name, e in files.items()}
        if got != dict(expect):
            wrong = sorted(n for n in {*got, *expect} if got.get(n) != expect.get(n))
            raise CheckpointError(
                f"{tmp}: the copy of step {step} does not match its node-local manifest "
                f"({wrong[0]}); the step is not durable, its node-local copy is kept"
            )
    point(f"{ckpt._tier}:synced")
    job_id = ckpt._env.get(JOB_ENV)
    committed_at = time.time()
    if stamp is not None:  # a drained step keeps the times of its commit
        committed_at, started = stamp
    manifest = {
        "format": FORMAT,
        "step": step,
        "time": committed_at,
        "started": started,
        "job_id": job_id,
        "restart_count": restart_count(ckpt._env),
        "files": files,
    }
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    fsync_path(tmp)
    point(f"{ckpt._tier}:manifest")
    try:
        tmp.rename(final)
    except OSError as exc:
        raise CheckpointError(
            f"{final}: cannot commit step {step} ({exc.strerror}); another writer may "
            f"have committed it: write a later step"
        ) from exc
    fsync_path(ckpt.root)
    point(f"{ckpt._tier}:renamed")
    if not ckpt._ledger:
        return
    # After the rename is durable: the ledger never names a commit a crash could undo.
    record = LedgerRecord(COMMIT, committed_at, step, job_id, restart_count(ckpt._env), started)
    append_ledger(ckpt.root, record)


def commit_directory(ckpt: StepDirectory, src: Path, step: int, *, move: bool) -> None:
    """`CheckpointDir.commit` up to its commit's rename: `src` copied (or moved) into a
    temporary directory and committed; with `move`, what was moved goes back on failure."""
    if not src.is_dir():
        raise CheckpointError(f"{src}: not a directory; pass the directory to checkpoint")
    _check_source(src, move=move)
    entries = sorted(src.iterdir())
    moved: list[str] = []

    def put_back(tmp: Path) -> str | None:
        lost = []
        for name in reversed(moved):
            try:
                shutil.move(str(tmp / name), str(src / name))
            except OSError as exc:
                lost.append(f"{name} ({exc.strerror or exc})")
        if lost:
            return (
                f"could not move {', '.join(lost)} back to {src}: the files are in {tmp}; "
                f"move them back by hand before `prune` removes them"
            )
        return None

    try:
        with staging(ckpt, step, put_back if move else None) as tmp:
            for entry in entries:
                if move:
                    shutil.move(str(entry), str(tmp / entry.name))
                    moved.append(entry.name)
                elif entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, tmp / entry.name)
                else:
                    shutil.copy2(entry, tmp / entry.name)
    except (OSError, shutil.Error) as exc:
        what = "move" if move else "copy"
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CheckpointError(
            f"{src}: cannot {what} it into {ckpt.root} ({detail}); {src} is left as it "
            "was: free space or fix the permissions and commit again"
        ) from None
    if move:
        with contextlib.suppress(OSError):  # a file written into src meanwhile stays
            src.rmdir()


def _check_source(src: Path, *, move: bool) -> None:
    """Refuse `src` before anything is copied or moved: only regular files and
    directories (with a copy, a symlink to a regular file is copied as that file)."""

    def refuse(path: Path, what: str) -> CheckpointError:
        return CheckpointError(
            f"{path}: {what}; a checkpoint holds only regular files and directories: "
            f"copy the target in instead (nothing was {'moved' if move else 'copied'})"
        )

    if (src / MANIFEST).exists():
        raise CheckpointError(
            f"{src / MANIFEST}: name reserved for Medic's manifest; rename the file"
        )

    def on_error(exc: OSError) -> None:
        raise CheckpointError(
            f"{exc.filename}: cannot read it ({exc.strerror}); nothing was committed"
        )

    for dirpath, dirnames, filenames in os.walk(src, onerror=on_error):
        here = Path(dirpath)
        for name in dirnames:
            if (here / name).is_symlink():
                raise refuse(here / name, "a symlink to a directory")
        for name in filenames:
            path = here / name
            if path.is_symlink() and (move or not path.is_file()):
                raise refuse(path, "a symlink" if move else "a symlink to no regular file")
            if not path.is_file():
                raise refuse(path, "not a regular file")

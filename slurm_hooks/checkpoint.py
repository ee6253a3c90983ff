"""Checkpoints a job can resume from after Medic requeues it, never torn.

Commit protocol (`CheckpointDir.writing`):

1. the job writes its files into a fresh temporary directory next to the checkpoints,
   `.tmp-step-NNNNNNNNN.<host>.<pid>.<random>`;
2. on success every file and directory in it is fsynced, and the manifest
   `medic-manifest.json` (step, time, job id, restart count, every file with size and sha256)
   is written and fsynced last: it is the completion marker;
3. the directory is renamed to `step-NNNNNNNNN` (atomic within one filesystem) and the parent
   directory fsynced, so the rename itself survives a crash.

A process killed anywhere in between leaves at most a temporary directory, which `latest()`
never looks at and `prune()` removes; a `step-*` directory whose manifest is missing or does
not match its files (a crash without fsync, a hand copy) is skipped too.

The ledger, `.medic-ledger.jsonl`: one line per commit (after its rename is durable) and per
restarted run's resume mark, appended (O_APPEND, then fsync) and never rewritten; `prune()`
leaves it alone. `medic report` reads the resume step, lost work and ETTR from it, so a job
that keeps only its last checkpoints is reported as it ran. A line torn by a crash is
skipped by the reader (`parse_ledger`), and the records after it still count.

Tiers (`LocalTier`, opt-in: `local=` or MEDIC_CHECKPOINT_LOCAL): `writing(step)` commits the
step, as above, in a node-local directory; a background thread then drains it into the
durable directory (copy into a temporary directory there, commit only when every file's size
and sha256 match the node-local manifest). `latest()` takes the newest complete step of
either tier, the node-local copy (hash-verified) on a tie. docs/resilient-jobs.md, "Tiers".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from medic_core import heartbeat
from medic_core.user_files import MANIFEST_LIMIT, SMALL_LIMIT, UnsafeFile, UserDir
from slurm_hooks import local_tier

DIR_ENV = "MEDIC_CHECKPOINT_DIR"
RESTART_ENV = "SLURM_RESTART_COUNT"  # absent on a job's first run
JOB_ENV = "SLURM_JOB_ID"
MANIFEST = "medic-manifest.json"
FORMAT = 1
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-step-"
TRASH_PREFIX = f"{TMP_PREFIX}deleted."
STALE_AFTER = 3600.0  # seconds before an unfinished temporary directory counts as abandoned
# A restarted run's first look for its checkpoint: when it resumed and from which step, for
# `medic report` (`.resume-<job>.<restart count>.json`, written once, never in the way).
RESUME_PREFIX = ".resume-"
_RESUME_FILE = re.compile(r"\.resume-(.+)\.(\d+)\.json")
_STEP_DIR = re.compile(r"step-(\d{9,})")
_TMP_DIR = re.compile(r"\.tmp-step-(\d{9,})\.(.+)\.(\d+)\.[0-9a-f]+")
_HASH_CHUNK = 1 << 20
LEDGER = ".medic-ledger.jsonl"
# Every ledger line starts with this: a reader finds the record after a torn line by it (a
# string inside a record is JSON-escaped, so its quotes never match).
LEDGER_TAG = '{"medic_ledger":1,'
COMMIT, RESUME = "commit", "resume"
_LATEST_TIME = 1e11  # seconds since the epoch (the year 5138): a ledger time past it is no time
LEDGER_LIMIT = 64 << 20  # bytes of ledger read (~400,000 commits)
# The node-local tier (see "Tiers" below): its base directory (the job's own directory is
# `job-<SLURM_JOB_ID>` in it) and its cap in bytes (a number, or with K, M, G, T: binary).
LOCAL_ENV = "MEDIC_CHECKPOINT_LOCAL"
LOCAL_CAP_ENV = "MEDIC_CHECKPOINT_LOCAL_CAP"
LOCAL, DURABLE = "local", "durable"
TIERS = (LOCAL, "peer", DURABLE)  # a resume mark's tier: one of these (peer: not built)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Tests stop a commit or a drain here, as a kill would: called with "<tier>:<point>".
_fault: Callable[[str], None] | None = None
_monotonic = time.monotonic  # bound here: tests replace the module's `time` with a clock


def _point(name: str) -> None:
    if _fault is not None:
        _fault(name)


class CheckpointError(RuntimeError):
    """Bad input or an unusable checkpoint directory; the message names the path and the fix."""


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str | None


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    time: float
    job_id: str | None
    restart_count: int
    files: Mapping[str, FileEntry]
    started: float | None = None  # the commit began (its staging directory); older: None
    tier: str = DURABLE  # where latest() found it: LOCAL (this node) or DURABLE
    # latest()'s seconds to find and verify it; not part of what the checkpoint is
    read_s: float | None = field(default=None, compare=False)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())

    @property
    def duration(self) -> float | None:
        """Seconds from the staging directory's creation to the manifest's write: the
        job's writing and the helper's fsyncs (the rename after it takes milliseconds)."""
        return None if self.started is None else max(0.0, self.time - self.started)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "step": self.step,
            "time": self.time,
            "job_id": self.job_id,
            "restart_count": self.restart_count,
            "files": len(self.files),
            "bytes": self.size,
            "started": self.started,
            "duration_s": self.duration,
            "tier": self.tier,
            "read_s": self.read_s,
        }


@dataclass(frozen=True)
class Resume:
    """A restarted run looked up its checkpoint: at `time`, found `step` (None: none)."""

    job_id: str
    restart_count: int
    time: float
    step: int | None
    tier: str | None = None  # latest()'s: where it found the step (None: not recorded)
    reload_s: float | None = None  # latest()'s read_s: finding and verifying it


@dataclass(frozen=True)
class LedgerRecord:
    """One line of the ledger: a commit of `step`, or a restarted run's resume (from `step`;
    None: it found no checkpoint)."""

    kind: str  # COMMIT or RESUME
    time: float  # a commit's: its manifest's time; a resume's: when latest() looked
    step: int | None
    job_id: str | None
    restart_count: int
    started: float | None = None  # a commit's staging began (its duration)
    tier: str | None = None  # a resume's: the tier and seconds of its reload (Resume's)
    reload_s: float | None = None

    @property
    def duration(self) -> float | None:
        return None if self.started is None else max(0.0, self.time - self.started)

    def line(self) -> bytes:
        body = {"kind": self.kind, "time": self.time, "step": self.step, "job_id": self.job_id,
                "restart_count": self.restart_count, "started": self.started}  # fmt: skip
        if self.kind == RESUME:
            body |= {"tier": self.tier, "reload_s": self.reload_s}
        return (LEDGER_TAG + json.dumps(body, separators=(",", ":"))[1:] + "\n").encode()


def _ledger_record(text: str) -> LedgerRecord | None:
    """The record of one line (without its newline), or None when it is not one."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict) or raw.get("medic_ledger") != 1:
        return None
    kind, step, job_id, restarts = (
        raw.get("kind"), raw.get("step"), raw.get("job_id"), raw.get("restart_count")
    )  # fmt: skip
    at = _float_or_none(raw.get("time"))
    if kind not in (COMMIT, RESUME) or at is None or not 0 <= at < _LATEST_TIME:
        return None
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        return None
    if step is None and kind == COMMIT:
        return None
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        return None
    if job_id is not None and not isinstance(job_id, str):
        return None
    tier = raw.get("tier") if raw.get("tier") in TIERS else None
    reload_s = None if (took := _float_or_none(raw.get("reload_s"))) is None or took < 0 else took
    started = _float_or_none(raw.get("started"))
    return LedgerRecord(kind, at, step, job_id, restarts, started, tier, reload_s)


def parse_ledger(data: bytes) -> list[LedgerRecord]:
    """The ledger's records, in the order written. Never raises: a line that is not a record
    (a torn write, bytes that are not UTF-8) is skipped; a record written after a torn line
    (appended to its end, on the same line) is found by its tag; a last line without its
    newline counts when it is a whole record (the crash came between it and the newline)."""
    tag = LEDGER_TAG.encode()
    found = []
    for raw_line in data.split(b"\n"):
        starts = list(_positions(raw_line, tag))
        for start, end in zip(starts, [*starts[1:], len(raw_line)], strict=False):
            try:
                record = _ledger_record(raw_line[start:end].decode("utf-8"))
            except UnicodeDecodeError:
                record = None
            if record is not None:
                found.append(record)
    return found


def _positions(data: bytes, tag: bytes) -> Iterator[int]:
    at = data.find(tag)
    while at >= 0:
        yield at
        at = data.find(tag, at + 1)


def _float_or_none(value: Any) -> float | None:
    """A manifest's optional time: a finite number, else None (older manifests lack it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:09d}"


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How many times Slurm has restarted this job (0 on its first run)."""
    value = (os.environ if env is None else env).get(RESTART_ENV, "")
    return int(value) if value.isdigit() else 0


def _check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"checkpoint step {step!r}: expected an integer >= 0")
    return step


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _host() -> str:
    return socket.gethostname().split(".")[0]


def _pid_alive(pid: int) -> bool:
    try:
        with contextlib.suppress(PermissionError):  # someone else's process: alive
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _inside(name: str) -> bool:
    """A manifest's file name that stays inside the checkpoint: relative, no `..`, no NUL."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and "\0" not in name and ".." not in parts


@dataclass
class Pruned:
    """What `prune_report` did: paths removed, and paths kept with why."""

    removed: list[Path] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)


class CheckpointDir:
    """The checkpoints of one job: `root/step-NNNNNNNNN/` plus a manifest in each."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        hash_files: bool = True,
        env: Mapping[str, str] | None = None,
        local: str | os.PathLike[str] | Literal[False] | None = None,
        local_cap: int | None = None,
        background_drain: bool = True,
    ) -> None:
        """`local`: the node-local tier's directory for this job (None: from LOCAL_ENV, off
        without it; False: off); `local_cap`: its cap in bytes (None: LOCAL_CAP_ENV, else
        half its file system); `background_drain` False: steps drain only in `drain()`."""
        self._env: Mapping[str, str] = os.environ if env is None else env
        if root is None:
            root = self._env.get(DIR_ENV) or None
        if root is None:
            raise CheckpointError(
                f"no checkpoint directory: pass one, or set {DIR_ENV} in the job's environment"
            )
        self.root = Path(root).absolute()
        if self.root.exists() and not self.root.is_dir():
            raise CheckpointError(
                f"{self.root}: not a directory; point {DIR_ENV} (or --dir) at a directory"
            )
        # Hashing costs a second read of every file; sizes alone still catch truncation.
        self.hash_files = hash_files
        self._tier = DURABLE
        self._ledger = True
        self.local: LocalTier | None = None
        if local is None and self._env.get(LOCAL_ENV):
            job = self._env.get(JOB_ENV) or f"uid-{os.geteuid()}"
            if "/" in job or job in (".", ".."):
                raise CheckpointError(f"{JOB_ENV}={job!r}: not a job id; unset {LOCAL_ENV}")
            _own_dir(local := _shared_base(Path(self._env[LOCAL_ENV])) / f"job-{job}")
            # per durable directory: a rank moved to a node never takes another rank's steps
            local /= "d-" + hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
        if local is not None and local is not False:
            self.local = LocalTier(self, Path(local), local_cap, background_drain)

    # ---- writing -----------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self, step: int) -> Iterator[Path]:
        """Yield an empty directory to write step `step` into; commit it when the block ends
        without an exception, discard it otherwise. With a node-local tier the directory is
        there and the commit too; the step then drains to this directory in the background."""
        if self.local is not None:
            with self.local.writing(step) as tmp:
                yield tmp
            return
        with self._staging(step) as tmp:
            yield tmp

    @contextlib.contextmanager
    def _staging(
        self,
        step: int,
        undo: Callable[[Path], str | None] | None = None,
        *,
        before_commit: Callable[[Path], None] | None = None,
        stamp: tuple[float, float | None] | None = None,
        expect: Mapping[str, FileEntry] | None = None,
    ) -> Iterator[Path]:
        """`writing`, with `undo(tmp)` called on failure before the temporary directory is
        removed: it gives back what it must not lose and returns None, or says why it could
        not (then the directory is kept and the error names it). `before_commit(tmp)` may
        refuse the commit by raising; a drain passes the step's own `stamp` (time, started)
        and the files it must `expect` (the commit is refused when they differ)."""
        _check_step(step)
        final = self.root / step_name(step)
        if final.exists():
            raise CheckpointError(
                f"{final}: step {step} is already checkpointed; write a later step or "
                f"remove {final}"
            )
        tmp = self.root / f"{TMP_PREFIX}{step:09d}.{_host()}.{os.getpid()}.{secrets.token_hex(4)}"
        started = time.time()  # the commit's duration, in its manifest (medic report)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
        except OSError as exc:
            raise CheckpointError(
                f"{self.root}: cannot create a checkpoint there ({exc.strerror or exc}); "
                f"point {DIR_ENV} (or --dir) at a directory you can write"
            ) from None
        try:
            yield tmp
            _point(f"{self._tier}:written")
            if before_commit is not None:
                before_commit(tmp)
            try:
                self._commit(tmp, final, step, started, stamp=stamp, expect=expect)
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
        self,
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
                _fsync_path(path)
                entry: dict[str, Any] = {"size": path.stat().st_size}
                if self.hash_files or expect is not None:
                    entry["sha256"] = _sha256(path)
                files[path.relative_to(tmp).as_posix()] = entry
            for name in dirnames:
                if (here / name).is_symlink():
                    raise CheckpointError(
                        f"{here / name}: a checkpoint holds only regular files and directories"
                    )
            _fsync_path(here)
        if expect is not None:
            got = {name: FileEntry(e["size"], e["sha256"]) for name, e in files.items()}
            if got != dict(expect):
                wrong = sorted(n for n in {*got, *expect} if got.get(n) != expect.get(n))
                raise CheckpointError(
                    f"{tmp}: the copy of step {step} does not match its node-local manifest "
                    f"({wrong[0]}); the step is not durable, its node-local copy is kept"
                )
        _point(f"{self._tier}:synced")
        job_id = self._env.get(JOB_ENV)
        committed_at = time.time()
        if stamp is not None:  # a drained step keeps the times of its commit
            committed_at, started = stamp
        manifest = {
            "format": FORMAT,
            "step": step,
            "time": committed_at,
            "started": started,
            "job_id": job_id,
            "restart_count": restart_count(self._env),
            "files": files,
        }
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_path(tmp)
        _point(f"{self._tier}:manifest")
        try:
            tmp.rename(final)
        except OSError as exc:
            raise CheckpointError(
                f"{final}: cannot commit step {step} ({exc.strerror}); another writer may "
                f"have committed it: write a later step"
            ) from exc
        _fsync_path(self.root)
        _point(f"{self._tier}:renamed")
        if not self._ledger:
            return
        # After the rename is durable: the ledger never names a commit a crash could undo.
        record = LedgerRecord(COMMIT, committed_at, step, job_id, restart_count(self._env), started)
        self._append_ledger(record)

    def _append_ledger(self, record: LedgerRecord) -> bool:
        """Append one line to the ledger and fsync it (and the directory, when this created
        the file). Never follows a symlink and writes only to a regular file. A ledger that
        cannot be written costs the report its truth, not the job its checkpoint: one line
        on stderr, and False."""
        path = self.root / LEDGER
        # O_NONBLOCK: a FIFO in its place fails at once (ENXIO) instead of hanging the job.
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                created = True
            except FileExistsError:
                fd = os.open(path, flags)
                created = False
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(0, "not a regular file")
                line = record.line()
                while line:
                    line = line[os.write(fd, line) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _fsync_path(self.root)
        except OSError as exc:
            print(
                f"medic: {path}: cannot append to the checkpoint ledger"
                f" ({exc.strerror or exc}); medic report will miss this {record.kind}",
                file=sys.stderr,
            )
            return False
        return True

    def commit(self, src: Path, step: int, *, move: bool = False) -> Checkpoint:
        """Make the directory `src` checkpoint `step`, atomically: copied (or, with `move`,
        moved, which is a rename on the same filesystem) into a temporary directory first.

        A failed commit never loses `src`: everything is checked before the first file is
        touched (a symlink or a special file refuses the commit), and with `move` whatever
        was moved goes back to `src` when the commit fails later (a full disk, another
        writer); if even that fails, the error names the directory that holds the files."""
        if not src.is_dir():
            raise CheckpointError(f"{src}: not a directory; pass the directory to checkpoint")
        self._check_source(src, move=move)
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
            with self._staging(step, put_back if move else None) as tmp:
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
                f"{src}: cannot {what} it into {self.root} ({detail}); {src} is left as it "
                "was: free space or fix the permissions and commit again"
            ) from None
        if move:
            with contextlib.suppress(OSError):  # a file written into src meanwhile stays
                src.rmdir()
        found = self.load(self.root / step_name(step))
        if found is None:
            raise CheckpointError(
                f"{self.root / step_name(step)}: committed but unreadable; check the file system"
            )
        return found

    @staticmethod
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

    def drain(self, timeout: float | None = None) -> list[int]:
        """Wait (at most `timeout` seconds) until every step of the node-local tier is
        durable here: at the job's end, so its last step survives the node. Returns the
        node-local steps that are durable; [] without a node-local tier. CheckpointError,
        naming the steps, on a timeout or a step that cannot be drained."""
        return [] if self.local is None else self.local.drain(timeout)

    # ---- reading -----------------------------------------------------------------------

    def load(self, path: Path, *, verify_hashes: bool = False) -> Checkpoint | None:
        """The checkpoint at `path`, or None when it is incomplete or does not match its
        manifest. Sizes are always checked; hashes only with `verify_hashes`. Its manifest
        and files are opened as medic_core.user_files opens a user's files (root reads
        them for `medic report`): no symlink followed, no FIFO waited on, only regular files
        of the directory's owner, the manifest at most MANIFEST_LIMIT bytes."""
        match = _STEP_DIR.fullmatch(path.name)
        if match is None:
            return None
        try:
            with UserDir.open(path.parent) as top, top.subdir(path.name) as step_dir:
                return self._load_from(step_dir, path, int(match.group(1)), verify_hashes)
        except UnsafeFile:
            return None

    @staticmethod
    def _load_from(
        step_dir: UserDir, path: Path, step_named: int, verify_hashes: bool
    ) -> Checkpoint | None:
        try:
            raw = json.loads(step_dir.read(MANIFEST, limit=MANIFEST_LIMIT))
            step = int(raw["step"])
            entries = {
                name: FileEntry(int(e["size"]), e.get("sha256")) for name, e in raw["files"].items()
            }
            checkpoint = Checkpoint(path, step, float(raw["time"]), raw.get("job_id"),
                                    int(raw.get("restart_count", 0)), entries,
                                    _float_or_none(raw.get("started")))  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
            return None
        if step != step_named:
            return None
        for name, entry in entries.items():
            if not _inside(name):  # a manifest names its own files, nothing outside them
                return None
            with step_dir.opened(name) as (fd, st):
                if st.st_size != entry.size:
                    return None
                if verify_hashes and entry.sha256:
                    digest = hashlib.sha256()
                    for chunk in step_dir.chunks(fd, path / name):
                        digest.update(chunk)
                    if digest.hexdigest() != entry.sha256:
                        return None
        return checkpoint

    def checkpoints(self, *, verify_hashes: bool = False) -> list[Checkpoint]:
        """Complete checkpoints, oldest first."""
        found = []
        for path in self._step_dirs():
            checkpoint = self.load(path, verify_hashes=verify_hashes)
            if checkpoint is not None:
                found.append(checkpoint)
        return found

    def latest(self, *, verify_hashes: bool = False) -> Checkpoint | None:
        """The newest complete checkpoint, or None (a first run, or nothing usable yet).
        The first call of a restarted run marks when it resumed (see `resumes`).
        With a node-local tier: the newest step complete in either tier, the node-local copy
        when both have it (always verified with its hashes: a torn or altered copy there
        never wins); the result's `tier` says which, `read_s` how long finding it took."""
        began = _monotonic()
        found = None
        for path in reversed(self._step_dirs()):
            checkpoint = self.load(path, verify_hashes=verify_hashes)
            if checkpoint is not None:
                found = checkpoint
                break
        if self.local is not None:
            local = self.local.newest(at_least=None if found is None else found.step)
            found = local if local is not None else found
        if found is not None:
            found = replace(found, read_s=_monotonic() - began)
        self._mark_resume(found)
        return found

    def _mark_resume(self, found: Checkpoint | None) -> None:
        """Once per run after a restart: when the job resumed and from which step. Best
        effort: a directory the job cannot write, or a second look, changes nothing."""
        restarts = restart_count(self._env)
        job_id = self._env.get(JOB_ENV, "")
        if restarts < 1 or not job_id or "/" in job_id or not self.root.is_dir():
            return
        if os.geteuid() == 0 and self.root.stat().st_uid != 0:
            return  # root looking into a user's directory writes nothing there
        now = time.time()
        step, tier, read_s = (found.step, found.tier, found.read_s) if found else (None,) * 3
        mark = {"job_id": job_id, "restart_count": restarts, "time": now, "step": step,
                "tier": tier, "read_s": read_s}  # fmt: skip
        path = self.root / f"{RESUME_PREFIX}{job_id}.{restarts}.json"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError:
            return
        with contextlib.suppress(OSError), os.fdopen(fd, "w") as f:
            json.dump(mark, f)
        # The mark file made this the run's first look: the ledger gets it once too.
        self._append_ledger(LedgerRecord(RESUME, now, step, job_id, restarts, None, tier, read_s))

    def ledger(self) -> list[LedgerRecord]:
        """The ledger's records, oldest first ([] without one). Read as a user's file
        (medic_core.user_files: no symlink, no FIFO, the owner's, at most LEDGER_LIMIT
        bytes); unreadable: [] (the report then falls back to manifests and marks)."""
        try:
            with UserDir.open(self.root) as top:
                data = top.read(LEDGER, limit=LEDGER_LIMIT)
        except UnsafeFile:
            return []
        return parse_ledger(data)

    def history(self) -> tuple[list[LedgerRecord], list[LedgerRecord]]:
        """(commits, resumes), oldest first: the ledger's records, plus the commits whose
        manifests and the resumes whose mark files it lacks (a job from before the ledger, a
        ledger that could not be written). Pruned checkpoints stay in it."""
        records = self.ledger()
        commits = {(r.step, r.time): r for r in records if r.kind == COMMIT}
        resumes = {(r.job_id, r.restart_count): r for r in records if r.kind == RESUME}
        for c in self.checkpoints():
            commits.setdefault(
                (c.step, c.time),
                LedgerRecord(COMMIT, c.time, c.step, c.job_id, c.restart_count, c.started),
            )
        for m in self.resumes():
            mark = LedgerRecord(RESUME, m.time, m.step, m.job_id, m.restart_count, None, m.tier)
            resumes.setdefault((m.job_id, m.restart_count), replace(mark, reload_s=m.reload_s))
        return (
            sorted(commits.values(), key=lambda r: r.time),
            sorted(resumes.values(), key=lambda r: r.time),
        )

    def resumes(self) -> list[Resume]:
        """The resume marks of restarted runs, oldest first; unreadable ones are skipped."""
        try:
            top = UserDir.open(self.root)
        except UnsafeFile:
            return []
        found = []
        with top:
            try:
                names = top.names()
            except UnsafeFile:
                return []
            for name in names:
                if _RESUME_FILE.fullmatch(name):
                    found += self._resume_mark(top, name)
        return sorted(found, key=lambda r: r.time)

    @staticmethod
    def _resume_mark(top: UserDir, name: str) -> list[Resume]:
        """The mark file `name` (read as a user's file), or [] when it is not one."""
        try:
            raw = json.loads(top.read(name, limit=SMALL_LIMIT))
            step, tier = raw.get("step"), raw.get("tier")
            return [
                Resume(
                    job_id=str(raw["job_id"]),
                    restart_count=int(raw["restart_count"]),
                    time=float(raw["time"]),
                    step=None if step is None else int(step),
                    tier=tier if tier in TIERS else None,
                    reload_s=_float_or_none(raw.get("read_s")),
                )
            ]
        except (UnsafeFile, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return []

    def resume_step(self) -> int | None:
        """The step of the newest complete checkpoint: a job resumes after it; None: start."""
        latest = self.latest()
        return latest.step if latest is not None else None

    def _step_dirs(self) -> list[Path]:
        """`step-*` directories sorted by step."""
        if not self.root.is_dir():
            return []
        dirs = [p for p in self.root.iterdir() if _STEP_DIR.fullmatch(p.name)]
        return sorted(dirs, key=lambda p: int(p.name[len(STEP_PREFIX) :]))

    # ---- pruning -----------------------------------------------------------------------

    def prune(self, keep: int = 2, *, stale_after: float = STALE_AFTER) -> list[Path]:
        """Remove all but the `keep` newest complete checkpoints, `step-*` directories that
        are not complete, and temporary directories left by a writer that died (its PID is
        gone on this host) or idle for `stale_after` seconds. Returns what was removed
        (`prune_report` also says what was kept and why). A node-local tier is pruned to its
        `keep` newest steps too, but a step there goes only once it is durable."""
        return self.prune_report(keep, stale_after=stale_after).removed

    def prune_report(self, keep: int = 2, *, stale_after: float = STALE_AFTER) -> Pruned:
        """`prune`, saying what it did: each path it removed, and each it would have removed
        but kept, with why. A path is removed only once it and everything in it is verified
        (medic_core.user_files.UserDir.remove_tree: a real directory, nothing in it owned by
        anyone but the directory's owner, a symlink never followed): root pruning a user's
        directory removes nothing the user could not have removed."""
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise CheckpointError(
                f"prune keep={keep!r} in {self.root}: keep at least 1 (the latest complete "
                "checkpoint is never removed)"
            )
        report = Pruned()
        if self.local is not None:
            self.local.prune(keep, stale_after, report)
        if not self.root.is_dir():
            return report
        complete = {c.path for c in self.checkpoints()}
        ordered = [p for p in self._step_dirs() if p in complete]
        doomed = [p for p in self._step_dirs() if p not in complete]
        doomed += ordered[:-keep]
        doomed += [p for p in self.root.iterdir() if self._abandoned(p, stale_after)]
        try:
            top = UserDir.open(self.root)
        except UnsafeFile as exc:
            report.kept += [(path, exc.why) for path in sorted(doomed)]
            return report
        with top:
            for path in sorted(doomed):
                try:
                    # Renamed first, so a reader never sees a half-deleted step-* directory.
                    top.remove_tree(path.name, TRASH_PREFIX)
                except UnsafeFile as exc:
                    if not path.is_symlink() and not path.exists():
                        continue  # gone already (another prune)
                    report.kept.append((path, exc.why))
                else:
                    report.removed.append(path)
        return report

    @staticmethod
    def _abandoned(path: Path, stale_after: float) -> bool:
        if not path.name.startswith(TMP_PREFIX):
            return False
        if path.name.startswith(TRASH_PREFIX) or path.is_symlink():
            return True  # a symlink is never walked (it may lead to /): prune says it kept it
        match = _TMP_DIR.fullmatch(path.name)
        if match and match.group(2) == _host() and not _pid_alive(int(match.group(3))):
            return True
        try:
            newest = max(
                [path.stat().st_mtime]
                + [p.stat().st_mtime for p in path.rglob("*") if not p.is_symlink()]
            )
        except OSError:
            return False
        return time.time() - newest > stale_after


# ---- the node-local tier -------------------------------------------------------------------


def _parse_cap(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None or int(match.group(1)) == 0:
        raise CheckpointError(
            f"{LOCAL_CAP_ENV}={text!r}: expected a size in bytes above 0, such as 68719476736 "
            "or 64G (K, M, G, T: powers of 1024)"
        )
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def _shared_base(base: Path) -> Path:
    """The base directory every job on the node shares (like /tmp): created sticky and open
    to all when missing; an existing one must be a real directory (never a symlink someone
    planted), owned by root or this user, and sticky when others may write in it."""
    base = base.absolute()
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            base.mkdir()
            os.chmod(base, 0o1777, follow_symlinks=False)
        st = os.lstat(base)
    except OSError as exc:
        raise CheckpointError(
            f"{base}: cannot create the node-local checkpoint tier there "
            f"({exc.strerror or exc}); point {LOCAL_ENV} at a directory you can write"
        ) from None
    shared = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()) or shared:
        raise CheckpointError(
            f"{base}: not a safe base for the node-local checkpoint tier (a symlink, someone "
            f"else's, or open to all without the sticky bit); point {LOCAL_ENV} elsewhere"
        )
    return base


def _own_dir(path: Path) -> None:
    """The job's local tier directory: made 0700 when missing; it must be a real directory
    of this user that nobody else may write in (so nothing can be planted in it)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = os.lstat(path)
    except OSError as exc:
        raise CheckpointError(
            f"{path}: cannot create the node-local checkpoint tier ({exc.strerror or exc}); "
            f"point {LOCAL_ENV} (or local=) at a directory you can write"
        ) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise CheckpointError(
            f"{path}: the node-local checkpoint tier must be a real directory of uid "
            f"{os.geteuid()} that no one else may write (chmod go-w, or point {LOCAL_ENV} "
            "(or local=) elsewhere)"
        )


def _copy_file(src: Path, dst: Path) -> None:
    """Copy a node-local checkpoint file into a drain's fresh staging directory: never
    following a symlink on either side, never writing into a file that was there."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    source = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(source).st_mode):
            raise CheckpointError(f"{src}: not a regular file; the step cannot be drained")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        target = os.open(dst, flags, 0o644)
        try:
            while os.sendfile(target, source, None, 1 << 30) > 0:
                pass
        finally:
            os.close(target)
    finally:
        os.close(source)


def _tree_bytes(root: Path) -> int:
    """The bytes a local tier's cap counts: every file but Medic's own manifests."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name == MANIFEST:
                continue
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


class LocalTier:
    """A job's node-local checkpoint tier (`CheckpointDir(local=...)`): `root/step-*`
    committed as in the durable directory (no ledger), each step then drained to the
    durable directory: copied into a staging directory there and committed only when every
    copied file's size and sha256 match the node-local manifest. A step is durable when
    that commit's rename is; before, it lives only here."""

    def __init__(
        self, durable: CheckpointDir, root: Path, cap: int | None, background: bool
    ) -> None:
        self.durable = durable
        _own_dir(root.absolute())
        local_tier.register_job_dir(durable._env, root.absolute())
        self.dir = CheckpointDir(root, env=durable._env, local=False)
        self.dir._tier, self.dir._ledger = LOCAL, False
        self.root = self.dir.root
        if cap is None and durable._env.get(LOCAL_CAP_ENV):
            cap = _parse_cap(durable._env[LOCAL_CAP_ENV])
        elif cap is None:
            vfs = os.statvfs(self.root)
            cap = vfs.f_frsize * vfs.f_blocks // 2
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise CheckpointError(f"local_cap={cap!r}: expected a size in bytes above 0")
        self.cap = cap
        self.background = background
        self._lock = threading.Condition()
        self._queue: list[int] = []
        self._draining: int | None = None
        self._thread: threading.Thread | None = None
        self._looked_back = False  # steps a killed run left undrained are queued once
        self.failed: dict[int, str] = {}  # step -> why its last drain failed

    # ---- writing -----------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self, step: int) -> Iterator[Path]:
        _check_step(step)
        durable = self.durable.root / step_name(step)
        if durable.exists():
            raise CheckpointError(
                f"{durable}: step {step} is already checkpointed; write a later step or "
                f"remove {durable}"
            )
        complete = self.complete()
        expected = complete[-1].size if complete else 0
        self._evict(_tree_bytes(self.root) + expected - self.cap)  # room before it is written
        with self.dir._staging(step, before_commit=lambda tmp: self._fit(step, tmp)) as tmp:
            yield tmp
        self._submit(step)

    def _fit(self, step: int, tmp: Path) -> None:
        used = _tree_bytes(self.root)
        if used > self.cap:
            self._evict(used - self.cap)
            used = _tree_bytes(self.root)
        if used > self.cap:
            raise CheckpointError(
                f"{self.root}: step {step} ({_tree_bytes(tmp)} bytes) would fill the node-local "
                f"checkpoint tier to {used} bytes, over its cap of {self.cap} bytes "
                f"({LOCAL_CAP_ENV} or local_cap=); the step was not committed: raise the cap, "
                "or call drain() first so older steps are durable and can be evicted"
            )

    # ---- reading -----------------------------------------------------------------------

    def complete(self) -> list[Checkpoint]:
        """Complete node-local steps (manifest and sizes), oldest first."""
        return [replace(c, tier=LOCAL) for c in self.dir.checkpoints()]

    def newest(self, at_least: int | None) -> Checkpoint | None:
        """The newest node-local step, not older than `at_least`, that matches its manifest's
        hashes, or None."""
        for path in reversed(self.dir._step_dirs()):
            if at_least is not None and int(path.name[len(STEP_PREFIX) :]) < at_least:
                return None
            found = self.dir.load(path, verify_hashes=True)
            if found is not None:
                return replace(found, tier=LOCAL)
        return None

    def drained(self, checkpoint: Checkpoint) -> bool:
        """The durable directory holds this step, complete, with the same files and hashes."""
        durable = self.durable.load(self.durable.root / step_name(checkpoint.step))
        return durable is not None and dict(durable.files) == dict(checkpoint.files)

    # ---- draining ----------------------------------------------------------------------

    def _submit(self, step: int) -> None:
        with self._lock:
            self._look_back()
            self.failed.pop(step, None)
            if step not in self._queue and step != self._draining:
                self._queue.append(step)
            if self.background:
                self._start_locked()

    def _start_locked(self) -> None:
        """Start the drain thread when steps wait and none runs. Caller holds the lock."""
        if self._queue and self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="medic-checkpoint-drain", daemon=False
            )
            self._thread.start()  # not a daemon: the interpreter waits for it at exit

    def _look_back(self) -> None:
        """Queue complete node-local steps that are not durable (a run killed before their
        drain finished), once per process, oldest first. Caller holds the lock."""
        if self._looked_back:
            return
        self._looked_back = True
        for checkpoint in self.complete():
            if checkpoint.step not in self._queue and not self.drained(checkpoint):
                self._queue.append(checkpoint.step)

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        return
                    step = self._draining = self._queue.pop(0)
                self._drain_logged(step)
        finally:  # also when the thread dies: the next submit or drain() starts another
            with self._lock:
                self._thread = None
                self._lock.notify_all()

    def _drain_logged(self, step: int) -> None:
        try:
            self._drain_step(step)
        except (CheckpointError, OSError) as exc:
            why = str(exc) if isinstance(exc, CheckpointError) else f"{exc.strerror or exc}"
            print(f"medic: step {step} did not drain: {why}", file=sys.stderr)
            with self._lock:
                self.failed[step] = why
        finally:
            with self._lock:
                self._draining = None
                self._lock.notify_all()

    def _drain_step(self, step: int) -> None:
        path = self.root / step_name(step)
        checkpoint = self.dir.load(path)
        if checkpoint is None:
            raise CheckpointError(
                f"{path}: the node-local copy of step {step} is incomplete; it cannot be drained"
            )
        if self.drained(checkpoint):
            return
        stamp = (checkpoint.time, checkpoint.started)
        try:
            with self.durable._staging(step, stamp=stamp, expect=checkpoint.files) as tmp:
                for name in checkpoint.files:
                    _point("durable:copying")
                    _copy_file(path / name, tmp / name)
                _point("durable:copied")
        except CheckpointError:
            if self.drained(checkpoint):  # another process drained it first
                return
            raise

    def drain(self, timeout: float | None = None) -> list[int]:
        """Wait until every node-local step is durable (the ones a killed run left too);
        returns the node-local steps now durable. CheckpointError, naming the steps, when
        `timeout` seconds pass first or a step cannot be drained."""
        until = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._looked_back = True
            for checkpoint in self.complete():  # retry failed ones, pick up a killed run's
                step = checkpoint.step
                if step in self._queue or step == self._draining or self.drained(checkpoint):
                    continue
                self._queue.append(step)
            self._queue.sort()
            self.failed.clear()
        if self.background:
            with self._lock:
                while self._queue or self._draining is not None:
                    self._start_locked()
                    left = None if until is None else until - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._lock.wait(left)
        else:
            while self._queue and (until is None or time.monotonic() < until):
                with self._lock:
                    step = self._draining = self._queue.pop(0)
                self._drain_logged(step)
        with self._lock:
            pending = sorted(self._busy_locked())
            failed = dict(self.failed)
        if pending:
            raise CheckpointError(
                f"{self.root}: steps {pending} are not durable in {self.durable.root} after "
                f"{timeout} s; call drain() again with a longer timeout (they stay node-local)"
            )
        if failed:
            step = min(failed)
            raise CheckpointError(f"step {step} did not drain: {failed[step]}")
        return [c.step for c in self.complete() if self.drained(c)]

    # ---- pruning and eviction ----------------------------------------------------------

    def _busy(self) -> set[int]:
        with self._lock:
            return self._busy_locked()

    def _busy_locked(self) -> set[int]:
        return {*self._queue, *([self._draining] if self._draining is not None else [])}

    def _evict(self, need: int) -> None:
        """Free at least `need` bytes by removing durable steps, oldest first."""
        if need <= 0:
            return
        busy = self._busy()
        doomed = []
        for checkpoint in self.complete():
            if need <= 0:
                break
            if checkpoint.step not in busy and self.drained(checkpoint):
                doomed.append(checkpoint.path)
                need -= checkpoint.size
        self._remove(doomed, Pruned())

    def prune(self, keep: int, stale_after: float, report: Pruned) -> None:
        """Keep the `keep` newest complete steps and every one not durable yet; remove the
        rest, incomplete step directories and abandoned staging directories."""
        complete = self.complete()
        paths = {c.path for c in complete}
        doomed = [p for p in self.dir._step_dirs() if p not in paths]
        busy = self._busy()
        for checkpoint in complete[:-keep]:
            if checkpoint.step not in busy and self.drained(checkpoint):
                doomed.append(checkpoint.path)
            else:
                report.kept.append((checkpoint.path, f"not durable in {self.durable.root} yet"))
        doomed += [p for p in self.root.iterdir() if CheckpointDir._abandoned(p, stale_after)]
        self._remove(doomed, report)

    def _remove(self, doomed: list[Path], report: Pruned) -> None:
        if not doomed:
            return
        try:
            top = UserDir.open(self.root)
        except UnsafeFile as exc:
            report.kept += [(path, exc.why) for path in sorted(doomed)]
            return
        with top:
            for path in sorted(doomed):
                try:
                    top.remove_tree(path.name, TRASH_PREFIX)
                except UnsafeFile as exc:
                    if path.is_symlink() or path.exists():
                        report.kept.append((path, exc.why))
                else:
                    report.removed.append(path)


# ---- progress heartbeat --------------------------------------------------------------------


class Progress:
    """The job's progress heartbeat on this node (medic_core.heartbeat has the file): call
    `step(n)` once per training step; the node's medic-healthd reads it and requeues the job
    from its last checkpoint when it stops advancing (docs/operator-guide.md, "Hangs").

    `step` is three stores into a mapped page and a vDSO clock read: no syscall, well under
    a microsecond. Opening happens once, here; when the heartbeat cannot be used `why` says
    so and `step` does nothing: a heartbeat never stops a job. Outside a Slurm job (no
    SLURM_JOB_ID) that is silent; on a node without the heartbeat directory, or with a file
    someone else owns, one line goes to stderr.
    One process per node reports (rank 0 of the node, say); `path` and `env` are for tests."""

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
    ) -> None:
        env = os.environ if env is None else env
        self._map: mmap.mmap | None = None
        self._seq = 0
        self._pid = os.getpid()
        self.path: Path | None = None
        self.why = ""
        try:
            self.path = Path(path) if path is not None else _progress_path(env)
            if self.path is not None:
                self._open(self.path)
        except (OSError, ValueError) as exc:
            self.why = f"{self.path or 'heartbeat'}: {getattr(exc, 'strerror', None) or exc}"
        if self.path is None:
            self.why = f"no {JOB_ENV}: not a Slurm job, no heartbeat"
        elif self.why:
            print(f"medic: progress heartbeat off ({self.why})", file=sys.stderr)

    def _open(self, path: Path) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("not a regular file")
            if st.st_uid != os.geteuid():
                raise ValueError(f"owned by uid {st.st_uid}, not this job's user")
            old = os.pread(fd, heartbeat.SIZE, 0) if st.st_size == heartbeat.SIZE else b""
            seq = 0
            if old[:8] == heartbeat.MAGIC:  # another run of this job on this node: go on
                seq = heartbeat.SEQ.unpack_from(old, heartbeat.SEQ_AT)[0]
            os.ftruncate(fd, heartbeat.SIZE)
            self._map = mmap.mmap(fd, heartbeat.SIZE, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        # A new run starts with no step reported (ns 0); the sequence keeps rising.
        self._seq = seq + 2 - seq % 2
        self._map[:] = heartbeat.blank(self._pid)
        heartbeat.SEQ.pack_into(self._map, heartbeat.SEQ_AT, self._seq)

    @property
    def active(self) -> bool:
        return self._map is not None

    def step(self, n: int, busy: float | None = None) -> None:
        """Report step `n` (an integer >= 0, as the job counts its steps) and, optionally,
        `busy`: the seconds this node worked in the step before it waited on the others
        (in a collective). Stragglers are judged on it when the job reports it every step
        (in lockstep training every node steps at the slowest one's pace: the step time
        alone cannot tell which node is slow)."""
        m = self._map
        if m is None:
            return
        if n.__class__ is not int or not 0 <= n <= _MAX_STEP:  # before the record is touched
            raise CheckpointError(f"progress step {n!r}: expected an integer >= 0")
        if busy is not None and not 0 <= busy < 1e9:  # also refuses nan
            raise CheckpointError(f"progress busy {busy!r}: expected seconds >= 0")
        seq = self._seq
        _SEQ_PACK(m, 8, seq + 1)  # odd: being written
        _BODY_PACK(m, 16, n, time.monotonic_ns(), self._pid)
        if busy is not None:
            _BUSY_PACK(m, 40, int(busy * 1e9))
        self._seq = seq + 2
        _SEQ_PACK(m, 8, seq + 2)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


_SEQ_PACK = heartbeat.SEQ.pack_into
_MAX_STEP = heartbeat.MAX_STEP
_BODY_PACK = heartbeat.BODY.pack_into
_BUSY_PACK = heartbeat.BUSY.pack_into
_progress: Progress | None = None


def _progress_path(env: Mapping[str, str]) -> Path | None:
    job_id = env.get(JOB_ENV, "")
    if not job_id:
        return None
    node = env.get("SLURMD_NODENAME") or _host()
    directory = env.get(heartbeat.DIR_ENV) or heartbeat.DEFAULT_DIR
    return Path(directory) / heartbeat.file_name(job_id, node)


def progress(step: int, busy: float | None = None) -> None:
    """Report this job's step `step` on this node: the one call per step (see Progress;
    `busy`: the seconds this node worked in the step, for stragglers)."""
    global _progress
    beat = _progress
    if beat is None:
        beat = _progress = Progress()
    beat.step(step, busy)

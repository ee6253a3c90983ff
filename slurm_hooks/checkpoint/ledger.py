"""A job's checkpoint history, kept for `medic report`: the ledger (`.medic-ledger.jsonl`,
one line per commit and per restarted run's resume, appended and never rewritten) and the
resume marks (`.resume-<job>.<restart count>.json`, one per restarted run's first look);
reading both back, and the history they give together with the manifests."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from medic_core.user_files import SMALL_LIMIT, UnsafeFile, UserDir
from slurm_hooks.checkpoint.layout import (
    JOB_ENV,
    TIERS,
    Checkpoint,
    float_or_none,
    fsync_path,
    restart_count,
)

# A restarted run's first look for its checkpoint: when it resumed and from which step, for
# `medic report` (`.resume-<job>.<restart count>.json`, written once, never in the way).
RESUME_PREFIX = ".resume-"
_RESUME_FILE = re.compile(r"\.resume-(.+)\.(\d+)\.json")
LEDGER = ".medic-ledger.jsonl"
# Every ledger line starts with this: a reader finds the record after a torn line by it (a
# string inside a record is JSON-escaped, so its quotes never match).
LEDGER_TAG = '{"medic_ledger":1,'
COMMIT, RESUME = "commit", "resume"
_LATEST_TIME = 1e11  # seconds since the epoch (the year 5138): a ledger time past it is no time
LEDGER_LIMIT = 64 << 20  # bytes of ledger read (~400,000 commits)


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


# ---- the ledger ----------------------------------------------------------------------------


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
    at = float_or_none(raw.get("time"))
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
    reload_s = None if (took := float_or_none(raw.get("reload_s"))) is None or took < 0 else took
    started = float_or_none(raw.get("started"))
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


def append_ledger(root: Path, record: LedgerRecord) -> bool:
    """Append one line to the ledger in `root` and fsync it (and the directory, when this
    created the file). Never follows a symlink and writes only to a regular file. A ledger
    that cannot be written costs the report its truth, not the job its checkpoint: one line
    on stderr, and False."""
    path = root / LEDGER
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
            fsync_path(root)
    except OSError as exc:
        print(
            f"medic: {path}: cannot append to the checkpoint ledger"
            f" ({exc.strerror or exc}); medic report will miss this {record.kind}",
            file=sys.stderr,
        )
        return False
    return True


def read_ledger(root: Path) -> list[LedgerRecord]:
    """The ledger's records in `root`, oldest first ([] without one). Read as a user's file
    (medic_core.user_files: no symlink, no FIFO, the owner's, at most LEDGER_LIMIT bytes);
    unreadable: [] (the report then falls back to manifests and marks)."""
    try:
        with UserDir.open(root) as top:
            data = top.read(LEDGER, limit=LEDGER_LIMIT)
    except UnsafeFile:
        return []
    return parse_ledger(data)


# ---- resume marks --------------------------------------------------------------------------


def mark_resume(root: Path, env: Mapping[str, str], found: Checkpoint | None) -> None:
    """Once per run after a restart: when the job resumed and from which step. Best
    effort: a directory the job cannot write, or a second look, changes nothing."""
    restarts = restart_count(env)
    job_id = env.get(JOB_ENV, "")
    if restarts < 1 or not job_id or "/" in job_id or not root.is_dir():
        return
    if os.geteuid() == 0 and root.stat().st_uid != 0:
        return  # root looking into a user's directory writes nothing there
    now = time.time()
    step, tier, read_s = (found.step, found.tier, found.read_s) if found else (None,) * 3
    mark = {"job_id": job_id, "restart_count": restarts, "time": now, "step": step,
            "tier": tier, "read_s": read_s}  # fmt: skip
    path = root / f"{RESUME_PREFIX}{job_id}.{restarts}.json"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError:
        return
    with contextlib.suppress(OSError), os.fdopen(fd, "w") as f:
        json.dump(mark, f)
    # The mark file made this the run's first look: the ledger gets it once too.
    append_ledger(root, LedgerRecord(RESUME, now, step, job_id, restarts, None, tier, read_s))


def read_resumes(root: Path) -> list[Resume]:
    """The resume marks in `root`, oldest first; unreadable ones are skipped."""
    try:
        top = UserDir.open(root)
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
                found += _resume_mark(top, name)
    return sorted(found, key=lambda r: r.time)


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
                reload_s=float_or_none(raw.get("read_s")),
            )
        ]
    except (UnsafeFile, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return []


# ---- the history -------------------------------------------------------------------------


def merged_history(
    records: list[LedgerRecord], checkpoints: list[Checkpoint], marks: list[Resume]
) -> tuple[list[LedgerRecord], list[LedgerRecord]]:
    """(commits, resumes), oldest first: the ledger's `records`, plus the commits whose
    manifests (`checkpoints`) and the resumes whose `marks` it lacks."""
    commits = {(r.step, r.time): r for r in records if r.kind == COMMIT}
    resumes = {(r.job_id, r.restart_count): r for r in records if r.kind == RESUME}
    for c in checkpoints:
        commits.setdefault(
            (c.step, c.time),
            LedgerRecord(COMMIT, c.time, c.step, c.job_id, c.restart_count, c.started),
        )
    for m in marks:
        mark = LedgerRecord(RESUME, m.time, m.step, m.job_id, m.restart_count, None, m.tier)
        resumes.setdefault((m.job_id, m.restart_count), replace(mark, reload_s=m.reload_s))
    return (
        sorted(commits.values(), key=lambda r: r.time),
        sorted(resumes.values(), key=lambda r: r.time),
    )

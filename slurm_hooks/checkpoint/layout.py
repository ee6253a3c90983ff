"""What a checkpoint directory holds and the words for it: the names on disk, the
environment a job reads them from, a complete step as read back (`Checkpoint`), and the
one error every part raises (`CheckpointError`)."""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

DIR_ENV = "MEDIC_CHECKPOINT_DIR"
RESTART_ENV = "SLURM_RESTART_COUNT"  # absent on a job's first run
JOB_ENV = "SLURM_JOB_ID"
MANIFEST = "medic-manifest.json"
FORMAT = 1
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-step-"
TRASH_PREFIX = f"{TMP_PREFIX}deleted."
STALE_AFTER = 3600.0  # seconds before an unfinished temporary directory counts as abandoned
STEP_DIR = re.compile(r"step-(\d{9,})")
TMP_DIR = re.compile(r"\.tmp-step-(\d{9,})\.(.+)\.(\d+)\.[0-9a-f]+")
LOCAL, DURABLE = "local", "durable"
TIERS = (LOCAL, "peer", DURABLE)  # a resume mark's tier: one of these (peer: not built)


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


def float_or_none(value: Any) -> float | None:
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


def check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"checkpoint step {step!r}: expected an integer >= 0")
    return step


def step_dirs(root: Path) -> list[Path]:
    """`step-*` directories sorted by step."""
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if STEP_DIR.fullmatch(p.name)]
    return sorted(dirs, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def host() -> str:
    return socket.gethostname().split(".")[0]


def pid_alive(pid: int) -> bool:
    try:
        with contextlib.suppress(PermissionError):  # someone else's process: alive
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class StepDirectory(Protocol):
    """What committing (commit.py) and the node-local tier (node_local.py) need of a
    checkpoint directory (directory.CheckpointDir), named here so that neither imports the
    class that imports them."""

    root: Path
    hash_files: bool
    _env: Mapping[str, str]
    _tier: str  # the commit's fault points name it
    _ledger: bool  # whether its commits are written to the durable ledger

    def load(self, path: Path, *, verify_hashes: bool = False) -> Checkpoint | None: ...

    def checkpoints(self, *, verify_hashes: bool = False) -> list[Checkpoint]: ...

    def tier_dir(self, root: Path) -> StepDirectory:
        """A directory of the same kind at `root`, for a tier's own steps."""
        ...

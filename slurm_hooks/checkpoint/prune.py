"""Pruning a job's checkpoint directory: all but the newest complete steps, incomplete
`step-*` directories and the temporary directories of writers that died or went idle, each
removed only once it and everything in it is verified as the directory owner's."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from medic_core.user_files import UnsafeFile, UserDir
from slurm_hooks.checkpoint.layout import (
    TMP_DIR,
    TMP_PREFIX,
    TRASH_PREFIX,
    Checkpoint,
    CheckpointError,
    host,
    pid_alive,
    step_dirs,
)


@dataclass
class Pruned:
    """What `prune_report` did: paths removed, and paths kept with why."""

    removed: list[Path] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)


class LocalPruning(Protocol):
    def prune(self, keep: int, stale_after: float, report: Pruned) -> None: ...


class PrunedDirectory(Protocol):
    """What pruning needs of a checkpoint directory (directory.CheckpointDir), named here
    so that this module does not import the class that imports it."""

    @property
    def root(self) -> Path: ...

    @property
    def local(self) -> LocalPruning | None: ...

    def checkpoints(self, *, verify_hashes: bool = False) -> list[Checkpoint]: ...


def prune_report(ckpt: PrunedDirectory, keep: int, *, stale_after: float) -> Pruned:
    """`CheckpointDir.prune_report`: prune `ckpt` (its node-local tier first)."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise CheckpointError(
            f"prune keep={keep!r} in {ckpt.root}: keep at least 1 (the latest complete "
            "checkpoint is never removed)"
        )
    report = Pruned()
    if ckpt.local is not None:
        ckpt.local.prune(keep, stale_after, report)
    if not ckpt.root.is_dir():
        return report
    complete = {c.path for c in ckpt.checkpoints()}
    ordered = [p for p in step_dirs(ckpt.root) if p in complete]
    doomed = [p for p in step_dirs(ckpt.root) if p not in complete]
    doomed += ordered[:-keep]
    doomed += [p for p in ckpt.root.iterdir() if abandoned(p, stale_after)]
    try:
        top = UserDir.open(ckpt.root)
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


def abandoned(path: Path, stale_after: float) -> bool:
    """A temporary directory whose writer died (its PID is gone on this host) or that was
    idle for `stale_after` seconds; a deleted step's, or a symlink in a temporary's name."""
    if not path.name.startswith(TMP_PREFIX):
        return False
    if path.name.startswith(TRASH_PREFIX) or path.is_symlink():
        return True  # a symlink is never walked (it may lead to /): prune says it kept it
    match = TMP_DIR.fullmatch(path.name)
    if match and match.group(2) == host() and not pid_alive(int(match.group(3))):
        return True
    try:
        newest = max(
            [path.stat().st_mtime]
            + [p.stat().st_mtime for p in path.rglob("*") if not p.is_symlink()]
        )
    except OSError:
        return False
    return time.time() - newest > stale_after

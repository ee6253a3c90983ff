"""Reading a step back: its manifest and files opened as medic_core.user_files opens a
user's files (root reads them for `medic report`), the files checked against the manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from medic_core.user_files import MANIFEST_LIMIT, UnsafeFile, UserDir
from slurm_hooks.checkpoint.layout import (
    MANIFEST,
    STEP_DIR,
    Checkpoint,
    FileEntry,
    float_or_none,
)


def load_step(path: Path, *, verify_hashes: bool = False) -> Checkpoint | None:
    """The checkpoint at `path`, or None when it is incomplete or does not match its
    manifest (`CheckpointDir.load`)."""
    match = STEP_DIR.fullmatch(path.name)
    if match is None:
        return None
    try:
        with UserDir.open(path.parent) as top, top.subdir(path.name) as step_dir:
            return _load_from(step_dir, path, int(match.group(1)), verify_hashes)
    except UnsafeFile:
        return None


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
                                float_or_none(raw.get("started")))  # fmt: skip
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


def _inside(name: str) -> bool:
    """A manifest's file name that stays inside the checkpoint: relative, no `..`, no NUL."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and "\0" not in name and ".." not in parts

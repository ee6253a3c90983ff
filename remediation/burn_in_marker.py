"""Burn-in's pass as a file in the node's state dir, for the Prolog without the daemon.

The record of a node's burn-in lives in the store (remediation/burn_in_record.py), which a
prolog cannot afford to open. The node's daemon mirrors it into `<state_dir>/burn-in.passed`:
written (atomically: a temporary file renamed) whenever the record says passed or waived,
removed whenever it says otherwise or there is none, and brought in line at every daemon
start (before READY: a node whose record passed before this file existed gets it then).

The Prolog, when the daemon does not answer and `[remediation.burn_in] new_node` is on,
refuses a job unless this file is Medic's pass for this node (`refusal`): opened without
following a symlink and without blocking, a regular file owned by root (or by the user the
hook runs as) that no one else may write, in a directory no one else may write, at most
MAX_BYTES, naming this node. A node re-imaged loses the file and is burnt in again, which
is the point; a disk image copied from another node carries that node's name and is refused.
Anything that does not read is no pass: with burn-in on, the prolog fails closed.

Only the standard library here: the prolog imports this on its slow path.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MARKER = "burn-in.passed"
MAX_BYTES = 4096
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Marker:
    """What the file holds: whose pass, for what, when (the boot is for a human reading it)."""

    node: str
    reason: str  # new_node, after_rma, after_reboot; "waived" when new_node was switched off
    checks: tuple[str, ...]
    passed_at: float  # seconds since the epoch
    boot_id: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {
                "node": self.node,
                "reason": self.reason,
                "checks": list(self.checks),
                "passed_at": self.passed_at,
                "boot_id": self.boot_id,
            }
        )


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()[:64]
    except OSError:
        return ""


def marker_for(node: str, reason: str, checks: Sequence[str]) -> Marker:
    return Marker(node, reason, tuple(checks), time.time(), boot_id())


def write_marker(state_dir: Path, marker: Marker) -> None:
    """Replace the file in one rename: a reader sees the old file or the new, never half."""
    state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = state_dir / f".{MARKER}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644)
    try:
        os.write(fd, marker.to_json().encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, state_dir / MARKER)
    dir_fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_marker(state_dir: Path) -> None:
    (state_dir / MARKER).unlink(missing_ok=True)


def _trusted(st: os.stat_result) -> bool:
    """Owned by root or by us, and no one else may write it."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def refusal(state_dir: Path, node: str) -> str | None:
    """None when `state_dir` holds Medic's burn-in pass for `node`; else why not, one line
    (a job is refused with it)."""
    path = state_dir / MARKER
    never = f"no {path} (never burnt in here, or re-imaged since)"
    try:
        st = os.stat(state_dir)
    except OSError as exc:
        return never if exc.errno == errno.ENOENT else f"{state_dir} unreadable ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode) or not _trusted(st):
        return (
            f"state dir {state_dir} is writable by others or not root's: its {MARKER} not trusted"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return never
        if exc.errno == errno.ELOOP:
            return f"{path} is a symlink"
        return f"{path} unreadable ({exc.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file"
        if not _trusted(st):
            return f"{path} is writable by others or not root's"
        if st.st_size > MAX_BYTES:
            return f"{path} is larger than {MAX_BYTES} bytes"
        data = os.read(fd, MAX_BYTES + 1)
    except OSError as exc:
        return f"{path} unreadable ({exc.strerror})"
    finally:
        os.close(fd)
    try:
        held = json.loads(data)
    except (ValueError, RecursionError):
        return f"{path} is not Medic's (not JSON)"
    if not isinstance(held, dict) or held.get("node") != node:
        return f"{path} is not this node's pass (a copied disk image?)"
    return None

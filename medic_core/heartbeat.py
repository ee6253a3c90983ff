"""The progress heartbeat's file: one small file per job per node, written in place by the
job (slurm_hooks.checkpoint.Progress, through mmap) and read by the node's daemon as root
(healthd.progress). Shared here so both sides agree on every byte.

Where: `<dir>/<job id>.<node>`, `<dir>` being $MEDIC_PROGRESS_DIR in the job's environment or
DEFAULT_DIR (the daemon's `[healthd] progress_dir`; the daemon creates it, root's, mode 1733:
anyone may create a file there, nobody but root may list it, and the sticky bit keeps each
file its owner's). The node name is in the name because lab nodes share one host.

Layout, 64 bytes, little-endian:

    0   8  magic  b"MEDICHB" + format version byte
    8   8  seq    even when the record is whole; odd while the job writes it (a seqlock)
    16  8  step   the job's step, as it counts
    24  8  ns     CLOCK_MONOTONIC of the job when it reported that step (nanoseconds)
    32  4  pid    the writing process
    36  4  zero
    40  8  busy   nanoseconds this node worked in that step, before waiting on the others
                  (optional: 0 when the job does not say; stragglers compare it)
    48 16  zero

A step costs the job three stores into a mapped page and a vDSO clock read: no syscall.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

DIR_ENV = "MEDIC_PROGRESS_DIR"
DEFAULT_DIR = "/run/medic/progress"
VERSION = 1
MAGIC = b"MEDICHB" + bytes([VERSION])
SIZE = 64
MAX_STEP = (1 << 63) - 1
DIR_MODE = 0o1733

SEQ = struct.Struct("<Q")  # at 8
BODY = struct.Struct("<QQI")  # step, ns, pid at 16
RECORD = struct.Struct("<8sQQQI28x")
assert RECORD.size == SIZE
SEQ_AT, BODY_AT = 8, 16
BUSY = struct.Struct("<Q")  # at 40, inside RECORD's padding
BUSY_AT = 40

_JOB_ID = re.compile(r"[0-9]{1,20}", re.ASCII)
_NODE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}", re.ASCII)


class HeartbeatError(ValueError):
    """Bytes that are not a heartbeat record; the message says what is wrong."""


@dataclass(frozen=True)
class Beat:
    """One whole record."""

    seq: int
    step: int
    ns: int
    pid: int
    busy_ns: int = 0  # 0: not reported


def file_name(job_id: str, node: str) -> str:
    """`<job id>.<node>`; a job id or node name that could leave the directory (or is not
    what Slurm gives) raises ValueError."""
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"job id {job_id[:40]!r}: expected digits")
    if not _NODE.fullmatch(node):
        raise ValueError(f"node name {node[:40]!r}: expected letters, digits, '.', '_', '-'")
    return f"{job_id}.{node}"


def blank(pid: int) -> bytes:
    """A fresh record: step 0 not reported yet (seq 0, ns 0)."""
    return RECORD.pack(MAGIC, 0, 0, 0, pid & 0xFFFFFFFF)


def parse(data: bytes) -> Beat:
    """The record in `data` (exactly SIZE bytes); raises HeartbeatError. A record being
    written (odd seq) raises too: the reader tries again."""
    if len(data) != SIZE:
        raise HeartbeatError(f"{len(data)} bytes, expected {SIZE}")
    magic, seq, step, ns, pid = RECORD.unpack(data)
    if magic != MAGIC:
        raise HeartbeatError(f"not a Medic heartbeat (starts {magic[:8]!r})")
    if seq % 2:
        raise HeartbeatError("being written (odd sequence)")
    (busy,) = BUSY.unpack_from(data, BUSY_AT)
    if step > MAX_STEP or ns > MAX_STEP or busy > MAX_STEP:
        raise HeartbeatError("step or time out of range")
    return Beat(seq=seq, step=step, ns=ns, pid=pid, busy_ns=busy)

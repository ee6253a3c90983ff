"""The job's progress heartbeat on its node (medic_core.heartbeat has the file): `Progress`
writes it, `progress(step)` is the one call per training step."""

from __future__ import annotations

import mmap
import os
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from medic_core import heartbeat
from slurm_hooks.checkpoint.layout import JOB_ENV, CheckpointError, host


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
    node = env.get("SLURMD_NODENAME") or host()
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

"""Whether Slurm runs a job on this node, read locally (no slurmctld round trip).

Every running job step has a slurmstepd, and every slurmstepd listens on a socket in
slurmd's spool directory named `<node>_<jobid>.<stepid>` (Slurm's stepd_api). Listing that
directory is cheap, needs no daemon to answer, and keeps working when the controller is
unreachable; the node name in the file name keeps lab nodes that share a host apart.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from healthd.checks.gpu_common import JobState

_STEP_SOCKET = re.compile(r"^(?P<node>.+)_(?P<job>\d+)\.(?P<step>\d+)$")


class SpoolJobState:
    """A `JobStateProvider` over slurmd's spool directory."""

    def __init__(
        self,
        spool_dir: Path,
        node: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spool_dir = spool_dir
        self.node = node
        self._clock = clock
        self._idle_since: float | None = None

    def job_ids(self) -> tuple[str, ...] | None:
        """Job ids with a live step on this node; None when the spool cannot be read."""
        try:
            names = os.listdir(self.spool_dir)
        except OSError:
            return None
        jobs = set()
        for name in names:
            found = _STEP_SOCKET.match(name)
            if found is not None and found["node"] == self.node:
                jobs.add(found["job"])
        return tuple(sorted(jobs, key=int))

    def job_state(self) -> JobState:
        ids = self.job_ids()
        source = f"spool:{self.spool_dir}"
        if ids is None:
            return JobState(running=None, source=source)
        now = self._clock()
        if ids:
            self._idle_since = None
            return JobState(running=True, job_ids=ids, source=source)
        if self._idle_since is None:
            self._idle_since = now
        return JobState(running=False, idle_seconds=now - self._idle_since, source=source)

"""The lab names a process by pid and start time: a pid alone can be a new process's."""

from __future__ import annotations

import os
import sys

from cli.lab.cluster import process_start


def test_a_live_process_has_one_start_time() -> None:
    first = process_start(os.getpid())
    assert isinstance(first, int) and first > 0
    assert process_start(os.getpid()) == first


def test_an_exited_process_has_none_reaped_or_zombie() -> None:
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], dict(os.environ))
    started = process_start(pid)
    # None: it had exited already (a loaded machine) and process_start reaped the zombie.
    if started is not None:
        assert started > 0
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # a zombie now, not reaped
    assert process_start(pid) is None  # (reaps it: the lab's pid_alive reaps its own children)
    assert process_start(pid) is None


def test_no_such_pid() -> None:
    assert process_start(0) is None
    assert process_start(-1) is None

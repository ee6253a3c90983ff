"""The lab names a process by pid and start time: a pid alone can be a new process's."""

from __future__ import annotations

import os
import subprocess
import sys

from cli.lab.cluster import process_start


def test_a_live_process_has_one_start_time() -> None:
    first = process_start(os.getpid())
    assert isinstance(first, int) and first > 0
    assert process_start(os.getpid()) == first


def test_an_exited_process_has_none_reaped_or_zombie() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_start(child.pid)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie now, not reaped
    assert started is None or started > 0
    assert process_start(child.pid) is None
    child.wait()
    assert process_start(child.pid) is None


def test_no_such_pid() -> None:
    assert process_start(0) is None
    assert process_start(-1) is None

"""A second SQLite store opened in a process must not take the first one's locks away.

POSIX locks belong to the process: closing any descriptor of a file drops all of them. The
store once opened and closed the database and its -wal/-shm to set their mode, so a process
with a store open (a test with the CLI in-process, a command that opens the store twice)
lost SQLite's locks; the next process to connect took itself for the first, rebuilt the WAL
index, and the first process read a stale snapshot from then on (found by
tests/test_defects_lab.py: the daemon's episodes never showed to the test)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
from pathlib import Path

from cli.lab.cluster import pid_alive
from medic_core import proc
from medic_core.store import Severity, open_store
from tests.conftest import poll

WRITE = """
import datetime as dt, pathlib, sys, time
from medic_core.store import open_store
store = open_store(sys.argv[1])
store.add_event("n1", at=dt.datetime.now(dt.UTC), kind="admin", severity="INFO",
                source="test", message=sys.argv[2], evidence={})
print("written", flush=True)
deadline = time.monotonic() + 60
while sys.argv[3] == "stay" and time.monotonic() < deadline:  # a daemon, still connected
    time.sleep(0.05)
"""


def test_a_second_store_in_the_process_keeps_the_first_one_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    cwd = Path(__file__).parents[1]
    with open_store(url) as first:
        first.add_event(
            "n1", at=dt.datetime.now(dt.UTC), kind="admin", severity=Severity.INFO,
            source="test", message="mine", evidence={},
        )  # fmt: skip
        open_store(url).close()  # e.g. the CLI, in the same process
        # A hook connects as if it were the only one, then a daemon stays connected.
        proc.run(
            [sys.executable, "-c", WRITE, url, "hook", "exit"], timeout=60, cwd=cwd, check=True
        )
        log = tmp_path / "daemon.log"
        argv = [sys.executable, "-c", WRITE, url, "daemon", "stay"]
        daemon = proc.spawn(argv, log_path=log, cwd=cwd)
        try:
            poll("the daemon's write", lambda: "written" in log.read_text(), timeout=30)
            assert {e.message for e in first.events()} == {"mine", "hook", "daemon"}
        finally:
            os.kill(daemon, signal.SIGKILL)
            poll("the daemon gone", lambda: not pid_alive(daemon), timeout=10)

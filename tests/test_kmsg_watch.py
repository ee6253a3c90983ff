"""The kernel-log follower's thread: it sleeps until the log changes or it is stopped (no
timed polling where the kernel can tell it), and follows a file replaced under its name."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from healthd.kmsg_watch import KmsgWatcher
from tests.conftest import poll

XID = "4,1234,5678901,-;NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.\n"
SLOW_TICK = 3600.0  # were the follower polling on its tick, nothing would be seen in a test


class Woken:
    def __init__(self) -> None:
        self.names: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, names: Iterable[str]) -> None:
        with self._lock:
            self.names.extend(names)


def _watch(path: Path, woken: Woken) -> KmsgWatcher:
    watcher = KmsgWatcher(path, woken, tick=SLOW_TICK, min_gap=0.0)
    watcher.start()
    return watcher


def _asleep(watcher: KmsgWatcher) -> None:
    """Wait until the follower's thread sleeps in the kernel (state S: blocked in poll)."""

    def sleeping() -> bool:
        thread = watcher._thread
        if thread is None or thread.native_id is None:
            return False
        status = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        return status.rsplit(")", 1)[1].split()[0] == "S"

    poll("the follower asleep", sleeping, timeout=5)


def _stops_at_once(watcher: KmsgWatcher) -> None:
    begin = time.monotonic()
    watcher.stop(timeout=10)
    assert watcher._thread is not None and not watcher._thread.is_alive()
    assert time.monotonic() - begin < 5  # far below SLOW_TICK: woken, not timed out


def test_a_line_written_to_the_file_wakes_its_checks_without_a_poll(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    woken = Woken()
    watcher = _watch(kmsg, woken)
    try:
        # The follower takes its first look at the file's size when its thread starts.
        poll("the follower's thread", lambda: watcher._thread is not None, timeout=5)
        deadline = time.monotonic() + 10
        while "gpu_xid" not in woken.names:
            with kmsg.open("a") as f:  # again until seen: the thread may start after a write
                f.write(XID)
            assert time.monotonic() < deadline, "the XID line never woke gpu_xid"
            time.sleep(0.05)
        assert "kernel_log" in woken.names
    finally:
        _stops_at_once(watcher)


def test_a_file_replaced_under_its_name_is_still_followed(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    woken = Woken()
    watcher = _watch(kmsg, woken)
    try:
        deadline = time.monotonic() + 10
        while "gpu_xid" not in woken.names:
            fresh = tmp_path / "kmsg.new"
            fresh.write_text(XID)
            os.replace(fresh, kmsg)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        woken.names.clear()
        deadline = time.monotonic() + 10
        while "gpu_xid" not in woken.names:  # and written to after the replacement
            with kmsg.open("a") as f:
                f.write(XID)
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        _stops_at_once(watcher)


def test_stop_wakes_a_follower_waiting_on_a_quiet_file(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    watcher = _watch(kmsg, Woken())
    _asleep(watcher)
    _stops_at_once(watcher)


@pytest.mark.skipif(
    not (os.path.exists("/dev/kmsg") and os.access("/dev/kmsg", os.R_OK)),
    reason="needs a readable /dev/kmsg",
)
def test_stop_wakes_a_follower_waiting_on_the_device() -> None:
    path = Path("/dev/kmsg")
    assert stat.S_ISCHR(os.stat(path).st_mode)
    watcher = _watch(path, Woken())
    _asleep(watcher)
    _stops_at_once(watcher)


def test_without_inotify_the_file_is_polled_on_its_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel without inotify (or a seccomp filter refusing it): the follower falls back
    to looking at the file's size and mtime every `tick`, and still stops at once."""
    monkeypatch.setattr("healthd.kmsg_watch.FileWatch.open", classmethod(lambda cls, path: None))
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    woken = Woken()
    watcher = KmsgWatcher(kmsg, woken, tick=0.05, min_gap=0.0)
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while "gpu_xid" not in woken.names:
            with kmsg.open("a") as f:
                f.write(XID)
            assert time.monotonic() < deadline, "the XID line never woke gpu_xid"
            time.sleep(0.05)
    finally:
        _stops_at_once(watcher)

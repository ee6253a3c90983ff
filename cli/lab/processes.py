"""The lab's processes: whether one runs (by pid, and by pid and start time), waiting with
the lab's slack, stopping by PID, and finding a lab's stragglers by its tag or, on a Debian
root, by the lab files they hold."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cli.lab.debian_root import DebianRoot


class LabError(RuntimeError):
    """The lab could not do what was asked; the message says why and what to do."""


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; reaps it if it is our exited child, and treats zombies as gone."""
    if pid <= 0:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat field 22), or None if no
    live process has it. With the pid, names one process: pids wrap (32768 here) and a
    long test run reuses them within minutes."""
    if not pid_alive(pid):
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def slack() -> float:
    """How much longer than written every lab deadline is (MEDIC_LAB_SLACK, default 1).

    A deadline here says when to stop waiting for Slurm or a daemon, never how fast they
    must be (bench/ measures that): scripts/test runs six test workers, each with a lab of
    its own, on two cores, where a job that starts in 2 s alone took over 10 s."""
    text = os.environ.get("MEDIC_LAB_SLACK", "1")
    try:
        value = float(text)
    except ValueError:
        raise LabError(f"MEDIC_LAB_SLACK={text!r} is not a number: set it to 1 or more") from None
    if not 1 <= value <= 100:
        raise LabError(f"MEDIC_LAB_SLACK={text!r} is out of range: set it between 1 and 100")
    return value


def wait_for(
    what: str, predicate: Callable[[], bool], timeout: float, interval: float = 0.05
) -> None:
    timeout *= slack()
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def terminate(pids: list[int], timeout: float) -> None:
    """SIGTERM, then SIGKILL what is left after half the timeout."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        try:
            wait_for("processes to exit", lambda: not any(pid_alive(p) for p in pids), timeout / 2)
            return
        except LabError:
            continue


def tagged_pids(lab_root: Path, tag_env: str, root: DebianRoot | None) -> list[int]:
    """Processes carrying the lab's tag (`tag_env`=`lab_root` in their environment), and on
    a Debian root those in it that hold a file of this lab (26.05's slurmstepd blanks its
    environment for its title and outlives a killed slurmd)."""
    tag = f"{tag_env}={lab_root}".encode()
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if tag in environ.split(b"\0") or (root and holds_lab_file(entry, lab_root, root)):
            found.append(int(entry.name))
    return [p for p in found if pid_alive(p)]


def holds_lab_file(entry: Path, lab_root: Path, root: DebianRoot) -> bool:
    """`entry` (/proc/PID) runs in `root` with its cwd or an open file in the lab."""
    inside = f"{root.path}{lab_root}"  # the lab's directory as seen through the root
    try:
        if os.readlink(entry / "root") != str(root.path):
            return False
        links = [os.readlink(entry / "cwd")]
        links += [os.readlink(fd) for fd in (entry / "fd").iterdir()]
    except OSError:
        return False
    return any(link == inside or link.startswith(f"{inside}/") for link in links)


def health_check_running(pids: list[int]) -> bool:
    """One of `pids` (a lab's) is a HealthCheckProgram (slurmd runs it every
    HealthCheckInterval)."""
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"medic-healthcheck" in cmdline:
            return True
    return False


def write_script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)

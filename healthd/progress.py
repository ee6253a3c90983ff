"""Sensors of a job's progress, read as root from files and processes users control.

`read_beat` reads one job's heartbeat (medic_core.heartbeat) from the node's heartbeat
directory: the directory is opened without following a symlink and must be root's (the
daemon's), the file is opened relative to it with O_NOFOLLOW and O_NONBLOCK (a FIFO never
blocks the daemon), must be a regular file with one link and exactly heartbeat.SIZE bytes,
and is read with one bounded pread (never mapped: a file its owner truncates would kill a
mapping reader with SIGBUS). Whatever the bytes hold, the answer is a `BeatRead`, never an
exception.

`process_evidence` collects what a hung job's processes are doing: state, wchan and kernel
stack of each thread from /proc (below the daemon's host root, like every /proc read of
healthd), and `py-spy dump --nonblocking` when it is installed, under one timeout for all.
Everything is clipped: a command line or a stack is the user's text.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from healthd.nvml_client import GpuProcess, Utilization
from medic_core import heartbeat, proc

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
READ_TRIES = 4  # a record torn by the job's write is read again at once, this many times


@dataclass(frozen=True)
class BeatRead:
    """One look at a job's heartbeat: `beat` when a whole record was read, else `problem`
    ("" with no beat: the job never opened a heartbeat here)."""

    beat: heartbeat.Beat | None = None
    owner: int | None = None  # uid owning the file
    problem: str = ""


def prepare_dir(directory: Path) -> str:
    """Create the heartbeat directory (root's, mode 1733) or check the one there; "" when
    it is usable, else why not (hang detection then sees no job's progress)."""
    try:
        directory.mkdir(mode=0o755, parents=True)
    except FileExistsError:
        pass
    except OSError as exc:  # a read-only /run in a sandbox, a parent that is a file
        return f"{directory}: cannot create it ({exc.strerror or exc})"
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        return f"{directory}: {exc.strerror or exc} (a symlink is refused)"
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return f"{directory}: owned by uid {st.st_uid}, not by this daemon's user: left alone"
        if stat.S_IMODE(st.st_mode) != heartbeat.DIR_MODE:
            os.fchmod(fd, heartbeat.DIR_MODE)
    except OSError as exc:
        return f"{directory}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return ""


def read_beat(directory: Path, job_id: str, node: str) -> BeatRead:
    """Job `job_id`'s heartbeat on `node`, read safely (see the module's docstring)."""
    try:
        name = heartbeat.file_name(job_id, node)
    except ValueError as exc:
        return BeatRead(problem=str(exc))
    try:
        dir_fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        return BeatRead(problem=f"{directory}: {exc.strerror or exc}")
    try:
        if os.fstat(dir_fd).st_uid != os.geteuid():
            return BeatRead(problem=f"{directory}: not owned by this daemon's user")
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return BeatRead()
        except OSError as exc:  # ELOOP: a symlink
            return BeatRead(problem=f"{name}: {exc.strerror or exc}")
        try:
            return _read_open(fd, name)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def _read_open(fd: int, name: str) -> BeatRead:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return BeatRead(owner=st.st_uid, problem=f"{name}: not a regular file")
    if st.st_nlink != 1:
        return BeatRead(owner=st.st_uid, problem=f"{name}: {st.st_nlink} links, expected 1")
    if st.st_size != heartbeat.SIZE:
        return BeatRead(owner=st.st_uid, problem=f"{name}: {st.st_size} bytes, not a heartbeat")
    problem = ""
    last = b""
    for _ in range(READ_TRIES):
        try:
            data = os.pread(fd, heartbeat.SIZE, 0)
        except OSError as exc:
            return BeatRead(owner=st.st_uid, problem=f"{name}: {exc.strerror or exc}")
        try:
            beat = heartbeat.parse(data)
        except heartbeat.HeartbeatError as exc:
            problem = f"{name}: {exc}"
            last = b""
            continue
        if data == last:  # the same whole record twice in a row: not torn
            return BeatRead(beat=beat, owner=st.st_uid)
        last = data
    if last:
        return BeatRead(beat=heartbeat.parse(last), owner=st.st_uid)
    return BeatRead(owner=st.st_uid, problem=problem)


def remove_beat(directory: Path, job_id: str, node: str) -> None:
    """Remove a finished job's heartbeat file (only a regular file; never follows)."""
    try:
        name = heartbeat.file_name(job_id, node)
        dir_fd = os.open(directory, _DIR_FLAGS)
    except (ValueError, OSError):
        return
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# --- evidence --------------------------------------------------------------------------------

MAX_PROCESSES = 16
MAX_THREADS = 16
STACK_CHARS = 2000
PYSPY_CHARS = 8000


@dataclass(frozen=True)
class ProcessEvidence:
    pid: int
    state: str
    command: str
    threads: tuple[dict[str, str], ...] = ()  # tid, state, wchan, stack
    py_spy: str = ""
    problem: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "state": self.state,
            "command": self.command,
            "threads": list(self.threads),
            "py_spy": self.py_spy,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class Evidence:
    processes: tuple[ProcessEvidence, ...] = ()
    problems: tuple[str, ...] = field(default=())
    gpus: tuple[dict[str, Any], ...] = ()  # index, gpu_pct, memory_pct, job_pids (or problem)

    def to_json(self) -> dict[str, Any]:
        return {
            "processes": [p.to_json() for p in self.processes],
            "problems": list(self.problems),
            "gpus": list(self.gpus),
        }


class GpuReader(Protocol):
    """What `gpu_evidence` reads of NVML (healthd.nvml_client.PynvmlClient)."""

    def device_count(self) -> int: ...

    def utilization(self, index: int) -> Utilization: ...

    def processes(self, index: int) -> tuple[GpuProcess, ...]: ...


MAX_GPUS = 64


def gpu_evidence(client: GpuReader, pids: Collection[int]) -> tuple[dict[str, Any], ...]:
    """Each GPU's utilisation and which of `pids` run on it: a hung collective often spins
    at 100 %, a job stuck outside the GPU leaves it at 0. Every call has NVML's deadline
    (the client's); a GPU that does not answer says so in its entry."""
    try:
        count = min(client.device_count(), MAX_GPUS)
    except Exception as exc:
        return ({"problem": f"NVML: {exc}"[:200]},)
    found = []
    for index in range(count):
        try:
            rates = client.utilization(index)
            on_it = sorted({p.pid for p in client.processes(index)} & set(pids))
        except Exception as exc:
            found.append({"index": index, "problem": f"{exc}"[:200]})
            continue
        found.append(
            {"index": index, "gpu_pct": rates.gpu_pct, "memory_pct": rates.memory_pct,
             "job_pids": on_it}
        )  # fmt: skip
    return tuple(found)


def _read(path: Path, limit: int) -> str:
    """Text of a /proc file (bounded, never follows a symlink), or "" with the error."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError as exc:
        return f"<{exc.strerror or exc}>"
    try:
        return os.read(fd, limit).decode("utf-8", errors="replace")
    except OSError as exc:
        return f"<{exc.strerror or exc}>"
    finally:
        os.close(fd)


def _stat_fields(text: str) -> tuple[str, int] | None:
    """(state, ppid) of /proc/<pid>/stat; the command name in parentheses may hold anything,
    so the fields are taken after its last ')'."""
    rest = text[text.rfind(")") + 2 :].split()
    if len(rest) < 2 or not rest[1].isdigit():
        return None
    return rest[0], int(rest[1])


def job_processes(proc_root: Path, pid: int, uid: int) -> list[int]:
    """`pid` and its descendants that run as `uid` (the heartbeat file's owner: a pid a
    user wrote into the file never makes the daemon look at another user's process)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        fields = _stat_fields(_read(proc_root / name / "stat", 4096))
        if fields is not None:
            children.setdefault(fields[1], []).append(int(name))
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < MAX_PROCESSES:
        current = todo.pop(0)
        try:
            owner = os.stat(proc_root / str(current)).st_uid
        except OSError:
            continue
        if owner != uid:
            continue
        found.append(current)
        todo.extend(sorted(children.get(current, ())))
    return found


def process_evidence(proc_root: Path, pids: list[int], *, py_spy_timeout: float = 5.0) -> Evidence:
    """State, wchan and kernel stack of each thread of `pids`, and py-spy's dump of each
    when py-spy is installed: `--nonblocking` (it reads the process's memory and never
    ptrace-stops it, which medic-healthd's unit forbids), all of them within `py_spy_timeout`
    seconds together."""
    spy = shutil.which("py-spy")
    spy_deadline = time.monotonic() + py_spy_timeout
    out = []
    for pid in pids[:MAX_PROCESSES]:
        base = proc_root / str(pid)
        fields = _stat_fields(_read(base / "stat", 4096))
        if fields is None:
            out.append(ProcessEvidence(pid, "", "", problem="gone or unreadable"))
            continue
        command = _read(base / "cmdline", 512).replace("\0", " ").strip()[:200]
        threads = []
        try:
            # The main thread first: after PIDs wrap, other threads' ids may be lower.
            tids = sorted(
                (int(t) for t in os.listdir(base / "task") if t.isdigit()),
                key=lambda tid: (tid != pid, tid),
            )
        except OSError:
            tids = [pid]
        for tid in tids[:MAX_THREADS]:
            task = base / "task" / str(tid)
            state = _stat_fields(_read(task / "stat", 4096))
            threads.append(
                {
                    "tid": str(tid),
                    "state": state[0] if state else "?",
                    "wchan": _read(task / "wchan", 128).strip()[:64],
                    "stack": _read(task / "stack", STACK_CHARS)[:STACK_CHARS],
                }
            )
        dump = ""
        left = spy_deadline - time.monotonic()
        if spy is not None and left > 0:
            argv = [spy, "dump", "--nonblocking", "--pid", str(pid)]
            result = proc.run(argv, timeout=left)
            dump = (result.stdout if result.ok else result.describe_failure())[:PYSPY_CHARS]
        out.append(ProcessEvidence(pid, fields[0], command, tuple(threads), dump))
    return Evidence(tuple(out))

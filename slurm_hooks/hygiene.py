"""Post-job hygiene: what an ended job left on its node, cleaning it, and what survived.

Found, for job J of user U (uid N) on this node:
* processes of J: its cgroup (`/job_J/` in /proc/<pid>/cgroup, proctrack/cgroup), or its
  environment (SLURM_JOB_ID=J, this node's SLURMD_NODENAME if set, owned by N, and not a
  prolog's or epilog's: no SLURM_SCRIPT_CONTEXT), which is how a daemonised process that
  escaped proctrack/linuxproc is known;
* every process of N, only when Slurm shows no other job of U on the node and N is neither
  root nor below `[hygiene] min_uid` (`Scope.by_user`);
* U's files in POSIX shared memory (/dev/shm) and in the configured scratch directories,
  only when U has no other job here (a scratch template naming {job} is J's alone).

Never touched: pid 1, kernel threads, this process and its ancestors (slurmd), zombies (a
zombie has given back its memory, files and GPU contexts; only its parent can reap it),
another user's process or file, anything behind a symlink. A process is signalled through a
pidfd opened and then checked against the start time seen when it was found, so a pid reused
meanwhile is never signalled.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

MAX_PROC_READ = 1 << 20
PF_KTHREAD = 0x00200000
_CGROUP_JOB = re.compile(r"/job_(\d+)(?:/|$)")
_USER_NAME = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,63}$")
POLL = 0.02  # seconds between looks while processes are given time to go


@dataclass(frozen=True)
class JobOwner:
    job_id: str
    uid: int
    user: str
    node: str


@dataclass(frozen=True)
class Scope:
    """What the epilog may touch beyond the job's own processes."""

    job: JobOwner
    by_user: bool  # every process of the user: no other job of theirs here, not root
    user_files: bool  # the user's /dev/shm files and scratch: no other job of theirs here


@dataclass(frozen=True)
class ProcessLeft:
    pid: int
    start: int  # /proc/<pid>/stat starttime (clock ticks since boot): the pid's identity
    uid: int
    comm: str
    state: str  # R, S, D, T ... as the kernel shows it
    why: str  # "job cgroup", "job environment" or "user"


@dataclass(frozen=True)
class Leftovers:
    processes: tuple[ProcessLeft, ...] = ()
    shm: tuple[str, ...] = ()  # names in the shared-memory directory
    scratch: tuple[str, ...] = ()  # paths (below a scratch directory) of the user's entries

    @property
    def empty(self) -> bool:
        return not (self.processes or self.shm or self.scratch)

    def lines(self, gpu_pids: Iterable[int] = ()) -> list[str]:
        """What is left, one short phrase per kind, for a drain reason and the logs."""
        on_gpu = set(gpu_pids)
        out = []
        if self.processes:
            shown = ",".join(
                f"{p.pid}{'(gpu)' if p.pid in on_gpu else ''}:{p.comm}:{p.state}"
                for p in self.processes[:4]
            )
            more = f" +{len(self.processes) - 4}" if len(self.processes) > 4 else ""
            out.append(f"{len(self.processes)} processes {shown}{more}")
        if self.shm:
            out.append(f"{len(self.shm)} shm files")
        if self.scratch:
            out.append(f"{len(self.scratch)} scratch entries")
        return out


# -- reading /proc ----------------------------------------------------------------------


def _read(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_PROC_READ)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None


@dataclass(frozen=True)
class Stat:
    comm: str
    state: str
    ppid: int
    flags: int
    start: int


def read_stat(proc_root: Path, pid: int) -> Stat | None:
    """/proc/<pid>/stat, or None (gone, or not a stat line). The command name may hold
    spaces and parentheses: the fields follow the last ')'."""
    raw = _read(proc_root / str(pid) / "stat")
    if raw is None:
        return None
    text = raw.decode(errors="replace")
    head, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or "(" not in head or len(fields) < 20:
        return None
    try:
        return Stat(
            head.split("(", 1)[1][:32], fields[0], int(fields[1]), int(fields[6]), int(fields[19])
        )
    except ValueError:
        return None


def read_uid(proc_root: Path, pid: int) -> int | None:
    raw = _read(proc_root / str(pid) / "status")
    for line in (raw or b"").decode(errors="replace").splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return None


def read_environ(proc_root: Path, pid: int) -> dict[str, str]:
    raw = _read(proc_root / str(pid) / "environ") or b""
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"SLURM_JOB_ID", b"SLURMD_NODENAME", b"SLURM_SCRIPT_CONTEXT"):
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def cgroup_job(proc_root: Path, pid: int) -> str | None:
    raw = _read(proc_root / str(pid) / "cgroup") or b""
    found = _CGROUP_JOB.search(raw.decode(errors="replace"))
    return found.group(1) if found else None


def ancestors(proc_root: Path, pid: int) -> set[int]:
    """`pid` and the processes above it (the epilog, slurmd, ...): never cleaned."""
    seen = {pid}
    while pid > 1:
        st = read_stat(proc_root, pid)
        if st is None or st.ppid in seen:
            break
        pid = st.ppid
        seen.add(pid)
    return seen


def whose(proc_root: Path, pid: int, uid: int, scope: Scope) -> str:
    """Why the process is this job's leftover ("" when it is not)."""
    job = scope.job
    if cgroup_job(proc_root, pid) == job.job_id:
        return "job cgroup"
    if uid == job.uid:
        env = read_environ(proc_root, pid)
        if (
            env.get("SLURM_JOB_ID") == job.job_id
            and "SLURM_SCRIPT_CONTEXT" not in env
            and env.get("SLURMD_NODENAME", job.node) == job.node
        ):
            return "job environment"
        if scope.by_user:
            return "user"
    return ""


def find_processes(proc_root: Path, scope: Scope, spare: Iterable[int] = ()) -> list[ProcessLeft]:
    """The job's (and, with `scope.by_user`, the user's) live processes."""
    kept = {1, 2, *spare}
    found = []
    try:
        names = [e.name for e in os.scandir(proc_root) if e.name.isdigit()]
    except OSError:
        return []
    for name in names:
        pid = int(name)
        if pid in kept:
            continue
        st = read_stat(proc_root, pid)
        if st is None or st.flags & PF_KTHREAD or st.ppid == 2 or st.state in ("Z", "X"):
            continue
        uid = read_uid(proc_root, pid)
        if uid is None:
            continue
        why = whose(proc_root, pid, uid, scope)
        if why:
            found.append(ProcessLeft(pid, st.start, uid, st.comm, st.state, why))
    return sorted(found, key=lambda p: p.pid)


def alive(proc_root: Path, p: ProcessLeft) -> bool:
    """The same process (same start time) is still there and not a zombie."""
    st = read_stat(proc_root, p.pid)
    return st is not None and st.start == p.start and st.state not in ("Z", "X")


def as_now(proc_root: Path, p: ProcessLeft) -> ProcessLeft:
    """`p` with the state the kernel shows now (D: stuck in the kernel, no signal ends it)."""
    st = read_stat(proc_root, p.pid)
    return replace(p, state=st.state) if st is not None and st.start == p.start else p


Signaller = Callable[[ProcessLeft, int], bool]


def pidfd_signaller(proc_root: Path) -> Signaller:
    """Signal through a pidfd: opened first, then the start time checked, so the signal
    reaches the process found or nothing (a pid reused in between is left alone)."""

    def send(p: ProcessLeft, sig: int) -> bool:
        try:
            fd = os.pidfd_open(p.pid)
        except OSError:
            return False
        try:
            if not alive(proc_root, p):
                return False
            signal.pidfd_send_signal(fd, sig)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    return send


def end_processes(
    processes: Sequence[ProcessLeft],
    is_alive: Callable[[ProcessLeft], bool],
    send: Signaller,
    *,
    grace: float,
    kill_wait: float,
    deadline: float,
) -> list[ProcessLeft]:
    """SIGTERM, SIGKILL after `grace` to what is still there, then `kill_wait` for it to
    go; all within `deadline` (monotonic). Returns the processes still alive."""

    def wait(left: list[ProcessLeft], until: float) -> list[ProcessLeft]:
        while True:
            left = [p for p in left if is_alive(p)]
            if not left or time.monotonic() >= until:
                return left
            time.sleep(POLL)

    left = [p for p in processes if send(p, signal.SIGTERM) or is_alive(p)]
    left = wait(left, min(time.monotonic() + grace, deadline))
    for p in left:
        send(p, signal.SIGKILL)
    return wait(left, min(time.monotonic() + kill_wait, deadline))


# -- files: /dev/shm and scratch --------------------------------------------------------


def _dir_fd(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None


def _owned(st: os.stat_result, uid: int) -> bool:
    return st.st_uid == uid and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode))


def find_shm(shm_root: Path, uid: int) -> list[str]:
    """The user's files (and symlinks, never followed) in the shared-memory directory."""
    fd = _dir_fd(shm_root)
    if fd is None:
        return []
    try:
        found = []
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if _owned(st, uid):
                    found.append(entry.name)
        return sorted(found)
    finally:
        os.close(fd)


def remove_shm(shm_root: Path, names: Iterable[str], uid: int) -> list[str]:
    """Unlink each name still the user's (looked at again, relative to the directory
    opened without following a symlink; unlink never follows one). Returns what is left."""
    fd = _dir_fd(shm_root)
    names = list(names)
    if fd is None:
        return names
    left = []
    try:
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not _owned(st, uid):
                    continue  # not the user's any more: not ours to remove
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError:
                left.append(name)
        return left
    finally:
        os.close(fd)


def scratch_paths(templates: Iterable[str], job: JobOwner, user_files: bool) -> list[Path]:
    """The scratch directories of this job: a template with {job} always, the others only
    when the user has no other job here; none for a user name that could leave its place."""
    out = []
    for template in templates:
        if "{job}" not in template and not user_files:
            continue
        if "{user}" in template and not _USER_NAME.fullmatch(job.user or ""):
            continue
        path = template.replace("{user}", job.user).replace("{uid}", str(job.uid))
        out.append(Path(path.replace("{job}", job.job_id)))
    return out


def empty_owned(
    path: Path, uid: int, deadline: float, *, remove: bool = True
) -> tuple[list[str], list[str]]:
    """The user's entries below `path` (not `path` itself), depth first, through directory
    fds opened without following symlinks and never into another mount: with `remove`,
    removed. Another user's entries, and directories holding them, stay and are not listed.
    Returns (found, left)."""
    top = _dir_fd(path)
    if top is None:
        return [], []
    found: list[str] = []
    left: list[str] = []
    try:
        _walk(top, os.fstat(top).st_dev, str(path), uid, deadline, remove, found, left)
    finally:
        os.close(top)
    return found, left


def _walk(
    fd: int, dev: int, where: str, uid: int, deadline: float, remove: bool,
    found: list[str], left: list[str],
) -> bool:  # fmt: skip
    """True when the directory is empty afterwards."""
    empty = True
    with os.scandir(fd) as entries:
        items = list(entries)
    for entry in items:
        name = f"{where}/{entry.name}"
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if st.st_dev != dev:
                empty = False
                continue
            try:
                child = os.open(
                    entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    dir_fd=fd,
                )  # fmt: skip
            except OSError:
                empty = False
                continue
            try:
                same = os.fstat(child)
                clear = (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino) and _walk(
                    child, dev, name, uid, deadline, remove, found, left
                )
            finally:
                os.close(child)
            if st.st_uid != uid or not clear:
                empty = False
                continue
        elif st.st_uid != uid:
            empty = False
            continue
        found.append(name)
        if not remove:
            empty = False
            continue
        if time.monotonic() >= deadline:
            left.append(name)
            empty = False
            continue
        try:
            if stat.S_ISDIR(st.st_mode):
                os.rmdir(entry.name, dir_fd=fd)
            else:
                os.unlink(entry.name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError:
            left.append(name)
            empty = False
    return empty

"""The node-local checkpoint tier's lifecycle: its copies go when the job ends for good.

The job registers its node-local directory (slurm_hooks.checkpoint.LocalTier, through
`register`) in the node's heartbeat directory (`[healthd] progress_dir`, root's, mode 1733:
anyone may create a file, only root may list it, the sticky bit keeps each its owner's):
`<job id>.<node>.local-tier`, holding the directory's absolute path.

The Epilog (the compiled front execs `medic-epilog --local-tier` when that file exists; the
Python epilog checks itself) starts this module detached: Slurm shows the job COMPLETING
until every node's epilog is done, so whether it ends for good or was requeued is known only
after. `sweep` then waits for that (at most `wait` seconds), and removes the registered
directory of every job of this node that Slurm reports in a final state (COMPLETED, FAILED,
CANCELLED, ...) or no longer knows (purged after MinJobAge). A job still PENDING (requeued),
RUNNING, COMPLETING at the deadline, or a Slurm that does not answer: kept (a later epilog
on this node sweeps it again; a job requeued onto other nodes leaves its old nodes' copies
until then).

Root removes only what the job's user could: the registration must be owned by the job's
user (Slurm's user_name, when Slurm still knows the job), the directory must be named
`job-<that job id>`, be a real directory of that user, in a base that is a real directory
of root or that user (sticky when others may write in it); every path component is opened
with O_NOFOLLOW from `/` (a planted symlink anywhere on the way refuses the removal), and the
tree is removed through medic_core.user_files (everything in it verified as the user's, a
symlink inside only unlinked, never followed).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import pwd
import socket
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from medic_core import heartbeat
from medic_core.config import MedicConfig
from medic_core.slurm import FINAL_JOB_STATES, JobInfo, SlurmClient, SlurmError
from medic_core.user_files import UnsafeFile, UserDir

SUFFIX = ".local-tier"
TRASH_PREFIX = ".tmp-step-deleted."  # slurm_hooks.checkpoint's: a reader skips it
REGISTRATION_LIMIT = 4096  # bytes: one absolute path
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
WAIT = 600.0  # seconds the sweep waits for the ending job to leave COMPLETING
# Seconds between looks at slurmctld (there is no event to wait on): each is a whole-queue
# `squeue --json` (22.05 ignores --jobs), from every node of an ending job, so not often.
POLL = 5.0


def registration_name(job_id: str, node: str) -> str:
    if not job_id.isdigit() or not node or "/" in node or node.startswith("."):
        raise ValueError(f"job {job_id[:40]!r} on node {node[:64]!r}: not a Slurm job and node")
    return f"{job_id}.{node}{SUFFIX}"


def register(progress_dir: Path, job_id: str, node: str, local_dir: Path) -> str | None:
    """Write this job's registration (the job's side, as the job's user). None when done;
    else why not, one line (the job goes on: only the epilog's clean-up is lost)."""
    try:
        path = progress_dir / registration_name(job_id, node)
    except ValueError as exc:
        return str(exc)
    text = f"{local_dir.absolute()}\n".encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return f"{path}: not a regular file of uid {os.geteuid()}"
            os.ftruncate(fd, 0)
            os.write(fd, text)
        finally:
            os.close(fd)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None


def register_job_dir(env: Mapping[str, str], local_dir: Path) -> None:
    """The library's call for a job's node-local directory `job-<SLURM_JOB_ID>/d-<hash>`:
    register `job-<id>` for the epilog's sweep; a failure costs only that (one line)."""
    job_id = env.get("SLURM_JOB_ID", "")
    local_dir = local_dir.parent  # job-<id>/d-<the durable directory's hash>
    if not job_id or local_dir.name != f"job-{job_id}":
        return  # not a Slurm job's directory (a test, `local=` named by hand): not swept
    progress_dir = Path(env.get(heartbeat.DIR_ENV) or heartbeat.DEFAULT_DIR)
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    why = register(progress_dir, job_id, node, local_dir)
    if why is not None:
        print(f"medic: {why}; the epilog will not remove {local_dir}", file=sys.stderr)


@dataclass
class Swept:
    """What a sweep did: directories removed, and registrations kept with why."""

    removed: list[Path] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (registration, why)


def _open_nofollow(path: Path) -> int:
    """A directory's descriptor, every component from `/` opened with O_NOFOLLOW."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in path.parts[1:]:
            if part in (".", ".."):
                raise UnsafeFile(path, "not a plain path")
            try:
                below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                symlink = exc.errno in (errno.ELOOP, errno.ENOTDIR)
                why = "a symlink on the way (or no directory), not followed" if symlink else None
                why = why or exc.strerror
                raise UnsafeFile(path, str(why)) from None
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_job_dir(path: Path, job_id: str, uid: int) -> None:
    """Remove the node-local directory `path` of job `job_id`, run by user `uid`, under the
    rules of the module's docstring; UnsafeFile (one line) when it may not or cannot."""
    if not path.is_absolute() or path.name != f"job-{job_id}" or "\0" in str(path):
        raise UnsafeFile(path, f"not a node-local tier directory of job {job_id}")
    base_fd = _open_nofollow(path.parent)
    try:
        st = os.fstat(base_fd)
        open_to_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, uid) or open_to_others:
            raise UnsafeFile(path.parent, "not a base of root or the job's user (or not sticky)")
        try:
            fd = os.open(path.name, _DIR_FLAGS, dir_fd=base_fd)
        except FileNotFoundError:
            return  # gone already
        except OSError as exc:
            symlink = exc.errno in (errno.ELOOP, errno.ENOTDIR)
            why = "a symlink (or no directory), not followed" if symlink else exc.strerror
            raise UnsafeFile(path, str(why)) from None
        job_dir = UserDir(fd, path, os.fstat(fd).st_uid)
        with job_dir:
            if job_dir.owner != uid:
                raise UnsafeFile(path, f"owned by uid {job_dir.owner}, not the job's {uid}")
            for name in job_dir.names():
                info = os.stat(name, dir_fd=job_dir.fd, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    job_dir.remove_tree(name, TRASH_PREFIX)
                elif info.st_uid == uid or stat.S_ISLNK(info.st_mode):
                    os.unlink(name, dir_fd=job_dir.fd)  # a symlink itself, never its target
                else:
                    raise UnsafeFile(path / name, f"owned by uid {info.st_uid}, not removed")
        try:
            os.rmdir(path.name, dir_fd=base_fd)  # a symlink swapped in meanwhile: ENOTDIR
        except OSError as exc:
            raise UnsafeFile(path, f"emptied but not removed ({exc.strerror})") from None
    finally:
        os.close(base_fd)


def _read_registration(progress_dir: Path, dir_fd: int, name: str) -> tuple[Path, int]:
    path = progress_dir / name
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise UnsafeFile(path, exc.strerror or str(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > REGISTRATION_LIMIT:
            raise UnsafeFile(path, "not a small regular file")
        text = os.read(fd, REGISTRATION_LIMIT + 1).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    return Path(text), st.st_uid


def _uid_of(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _ended_for_good(job: JobInfo | None) -> bool:
    return job is None or job.state in FINAL_JOB_STATES


def sweep(
    client: SlurmClient,
    progress_dir: Path,
    node: str,
    ending: str | None = None,
    *,
    wait: float = WAIT,
    poll: float = POLL,
) -> Swept:
    """Remove the node-local directories of this node's jobs that ended for good, first
    waiting (at most `wait` s) for the job `ending` to leave COMPLETING."""
    done = Swept()
    deadline = time.monotonic() + wait
    while True:
        try:
            jobs = {j.job_id: j for j in client.jobs()}
        except SlurmError as exc:
            done.kept.append(("*", f"cannot read the jobs: {exc}"))
            return done
        job = jobs.get(ending or "")
        if job is None or job.state != "COMPLETING" or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    try:
        dir_fd = os.open(progress_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        done.kept.append(("*", f"{progress_dir}: {exc.strerror or exc}"))
        return done
    try:
        _sweep_dir(progress_dir, dir_fd, node, jobs, done)
    finally:
        os.close(dir_fd)
    return done


def _sweep_dir(
    progress_dir: Path, dir_fd: int, node: str, jobs: dict[str, JobInfo], done: Swept
) -> None:
    for name in sorted(os.listdir(dir_fd)):
        job_id, _, rest = name.partition(".")
        if rest != f"{node}{SUFFIX}" or not job_id.isdigit():
            continue
        job = jobs.get(job_id)
        if not _ended_for_good(job):
            state = job.state if job is not None else ""
            done.kept.append((name, f"job {job_id} is {state}: not ended for good"))
            continue
        try:
            path, owner = _read_registration(progress_dir, dir_fd, name)
            if job is not None and _uid_of(job.user) != owner:
                raise UnsafeFile(progress_dir / name, f"not written by the job's user {job.user}")
            remove_job_dir(path, job_id, owner)
        except UnsafeFile as exc:
            done.kept.append((name, str(exc)))
            continue
        done.removed.append(path)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)


def has_registration(progress_dir: Path, job_id: str, node: str) -> bool:
    try:
        return os.path.lexists(progress_dir / registration_name(job_id, node))
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    """`python -m slurm_hooks.local_tier --job J`: the epilog's detached sweep."""
    parser = argparse.ArgumentParser(prog="python -m slurm_hooks.local_tier")
    parser.add_argument("--job", default="")
    args = parser.parse_args(argv)
    from medic_core.config import ConfigError, load_config
    from medic_core.settings import HookSettings
    from remediation.actions import slurm_client

    try:
        config = load_config()
        client = slurm_client(config, HookSettings.from_config(config))
    except ConfigError as exc:
        print(f"medic local tier: {exc}", file=sys.stderr)
        return 2
    done = sweep(client, progress_dir_of(config), config.node_name, args.job or None)
    for path in done.removed:
        print(f"medic local tier: removed {path}")
    for name, why in done.kept:
        print(f"medic local tier: kept {name}: {why}")
    return 0


def progress_dir_of(config: MedicConfig) -> Path:
    """The heartbeat directory: $MEDIC_PROGRESS_DIR, else `[healthd] progress_dir`."""
    from medic_core.settings import DaemonSettings

    if os.environ.get(heartbeat.DIR_ENV):
        return Path(os.environ[heartbeat.DIR_ENV])
    return Path(DaemonSettings.from_config(config).progress_dir)


if __name__ == "__main__":
    sys.exit(main())

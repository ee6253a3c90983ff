"""Medic as production installs it, for the tests that run it as another user (issue 29).

A user other than root (`nobody`, the lab's intruder) cannot read a checkout under a 0700
directory (/root, a `mktemp -d`), nor the checkout's .venv, nor an interpreter under /root
(pyenv's). On a node Medic is a wheel in a venv every user can read, so these tests run it
from one: the wheel of this tree's packages, installed with its dependencies into
`/var/cache/medic-tests/<key>/venv` over a Python every user can run. `<key>` hashes what
goes into the wheel (the tracked files of the packages, pyproject.toml, README.md, LICENSE,
MANIFEST.in) and the interpreter, so a rerun and every pytest-xdist worker share one build
(an fcntl lock per key), and a change to a test does not rebuild it.

/var/cache/medic-tests is root's and nobody else may write it or any directory above it, so
root never builds, nor runs, what another user could have planted there. Builds unused for
a week are removed when a new one is made."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from medic_core import proc

REPO = Path(__file__).resolve().parents[1]
BASE = Path("/var/cache/medic-tests")
PACKAGES = ("medic_core", "healthd", "slurm_hooks", "remediation", "cli")
METADATA = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in")
READY = "ready"  # written last: a build without it is an interrupted one, made again
UNUSED_FOR = 7 * 24 * 3600.0
BUILD_TIMEOUT = 600.0
# Run as another user to prove the install is theirs to use: every package and dependency.
IMPORTS = (
    "import sys, click, sqlalchemy, psutil, pynvml, prometheus_client\n"
    "import medic_core.store, healthd.daemon, slurm_hooks.prolog, remediation.repair, cli.main\n"
    "assert cli.main.__file__.startswith(sys.prefix + '/'), cli.main.__file__\n"
    "print(sys.prefix)\n"
)


class InstallError(RuntimeError):
    """Medic cannot be installed where another user can read it; the message says why."""


@dataclass(frozen=True)
class Installed:
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def command(self, name: str) -> Path:
        """One of the wheel's console scripts (medic, medic-healthd, ...)."""
        return self.venv / "bin" / name


Builder = Callable[[Path, list[str], Path], None]


def wheel_sources(repo: Path) -> list[str]:
    """The files the wheel is built from, relative to `repo`: git's, tracked or not yet added
    but not ignored (the tests import the working tree, so the install holds what they
    import), or every file but caches in a tree that is not git's."""
    argv = ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    tracked = proc.run(argv, timeout=60)
    if tracked.ok:
        names = [n for n in tracked.stdout.split("\0") if n]
    else:
        names = [
            str(p.relative_to(repo))
            for top in PACKAGES
            for p in (repo / top).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
        names += METADATA
    wanted = [n for n in names if n in METADATA or n.split("/", 1)[0] in PACKAGES]
    return sorted(n for n in wanted if (repo / n).is_file())


def shared_python() -> Path:
    """A Python every user can run: this one's own interpreter if every directory above it
    is open to them (a pyenv under /root is not), else the system's."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [Path(sys.base_prefix) / "bin" / version, Path("/usr/bin") / version,
                  Path("/usr/bin/python3")]  # fmt: skip
    for candidate in candidates:
        real = candidate.resolve()
        if real.is_file() and all(open_to_others(p) for p in [real, *real.parents]):
            return candidate
    raise InstallError(
        f"no Python every user may run: {', '.join(map(str, candidates))} are missing or "
        "under a directory only root may enter; install Debian's python3"
    )


def open_to_others(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXOTH)


def content_key(repo: Path, names: list[str], python: Path) -> str:
    key = hashlib.sha256(proc.run([str(python), "-VV"], timeout=30).stdout.encode())
    key.update(str(python).encode() + b"\0")
    for name in names:
        key.update(name.encode() + b"\0" + (repo / name).read_bytes() + b"\0")
    return key.hexdigest()[:16]


def check_root_owned(path: Path, *, ancestor: bool = False) -> None:
    """`path` is a real directory of root's that no one else may write and everyone may
    enter; an ancestor may also be a sticky directory (/tmp), where others cannot replace
    root's entries."""
    try:
        st = path.lstat()
    except OSError as exc:
        raise InstallError(f"{path}: {exc.strerror}") from exc
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        why = "is a symlink" if stat.S_ISLNK(st.st_mode) else "is not a directory"
    elif st.st_uid != 0:
        why = f"is owned by uid {st.st_uid}, not root"
    elif mode & 0o022 and not (ancestor and mode & stat.S_ISVTX):
        why = f"may be written by users other than root (mode {mode:04o})"
    elif not mode & stat.S_IXOTH:
        why = f"may not be entered by other users (mode {mode:04o})"
    else:
        return
    raise InstallError(f"{path}: {why}; make it a root-owned directory of mode 0755")


def prepare_base(base: Path) -> None:
    for parent in reversed(base.parents):
        check_root_owned(parent, ancestor=True)
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o755)
        base.chmod(0o755)  # past the umask
    check_root_owned(base)


@contextlib.contextmanager
def locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """An fcntl lock on `path` (created if need be; never through a symlink)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def install(repo: Path = REPO, base: Path = BASE, build: Builder | None = None) -> Installed:
    """Medic of `repo`'s packages installed under `base`, built there first if need be."""
    prepare_base(base)
    python = shared_python()
    names = wheel_sources(repo)
    key = content_key(repo, names, python)
    target = base / key
    with locked(base / f"{key}.lock"):
        ready = target / READY
        if ready.is_file() and ready.read_text() == key:
            os.utime(ready)  # in use: not pruned
            return Installed(target / "venv")
        shutil.rmtree(target, ignore_errors=True)  # an interrupted build
        target.mkdir(mode=0o755)
        target.chmod(0o755)
        try:
            (build or build_venv)(repo, names, target)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        ready.write_text(key)
        ready.chmod(0o644)
    prune(base, keep=key)
    return Installed(target / "venv")


def prune(base: Path, keep: str, now: float | None = None) -> list[str]:
    """Remove the builds not used for UNUSED_FOR (their lock files stay: removing a lock
    another process holds open would let two builders in); the keys removed."""
    now = time.time() if now is None else now
    removed = []
    for entry in sorted(base.iterdir()):
        if entry.name == keep or entry.is_symlink() or not entry.is_dir():
            continue
        ready = entry / READY
        used = (ready if ready.exists() else entry).stat().st_mtime
        if now - used < UNUSED_FOR:
            continue
        with locked(base / f"{entry.name}.lock", wait=False) as mine:
            if mine:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
    return removed


def build_venv(repo: Path, names: list[str], target: Path) -> None:
    """The wheel of `names`, installed with its dependencies into `<target>/venv` (over
    shared_python()), every file readable by everyone and writable by root alone; then
    proven importable by `nobody`."""
    venv = target / "venv"
    with tempfile.TemporaryDirectory(prefix="medic-wheel-") as scratch:
        source, dist = Path(scratch) / "source", Path(scratch) / "dist"
        for name in names:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repo / name, source / name)
        steps = [
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist),
             str(source)],
            [str(shared_python()), "-m", "venv", "--without-pip", str(venv)],
        ]  # fmt: skip
        for argv in steps:
            run_step(argv)
        wheels = sorted(dist.glob("*.whl"))
        if len(wheels) != 1:
            raise InstallError(f"pip wheel {source}: made {len(wheels)} wheels, not one")
        [wheel] = wheels
        # The checkout's pip installs into the new venv, which needs none of its own.
        run_step([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                  "install", "-q", str(wheel)])  # fmt: skip
    open_to_everyone(target)
    prove_usable_by_another_user(Installed(venv))


def run_step(argv: list[str]) -> None:
    done = proc.run(argv, timeout=BUILD_TIMEOUT)
    if not done.ok:
        step = " ".join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv[:4]))
        raise InstallError(f"{step}: {done.describe_failure()}")


def open_to_everyone(top: Path) -> None:
    """Directories 0755, files 0644 (0755 if executable), whatever the umask was; symlinks
    are left alone (os.walk does not descend through them)."""
    for root, _dirs, files in os.walk(top):
        os.chmod(root, 0o755)
        for name in files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, 0o755 if mode & stat.S_IXUSR else 0o644)


def as_nobody(*argv: str) -> list[str]:
    nobody = pwd.getpwnam("nobody")
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
            "--clear-groups", "--", *argv]  # fmt: skip


def prove_usable_by_another_user(medic: Installed) -> None:
    done = proc.run(as_nobody(str(medic.python), "-I", "-c", IMPORTS), timeout=120, cwd=Path("/"))
    if not done.ok or done.stdout.strip() != str(medic.venv):
        raise InstallError(f"{medic.venv}: nobody cannot use it: {done.describe_failure()}")


_outcome: dict[Path, Installed | str] = {}


def installed_medic() -> Installed:
    """This tree's Medic, installed where every user can read it (built once per content,
    shared by every test process); a test that needs it fails with one line if it cannot be."""
    if REPO not in _outcome:
        try:
            _outcome[REPO] = install()
        except (InstallError, OSError) as exc:
            _outcome[REPO] = (
                f"cannot install Medic where another user can read it, as the tests that run "
                f"it as one need: {exc}"
            )
    outcome = _outcome[REPO]
    if isinstance(outcome, str):
        pytest.fail(" ".join(outcome.split()), pytrace=False)
    return outcome

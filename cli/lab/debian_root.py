"""A Debian root per Slurm release newer than the host's, built once from Debian's archive
and kept under a cache directory (env MEDIC_LAB_CACHE, default /var/cache/medic-lab).

<cache>/<suite>/root/           the root (debootstrap, Slurm, munge, Python, Medic's venv)
<cache>/<suite>/root/RECIPE     the hash of the recipe it was built from; another hash rebuilds
<cache>/<suite>.lock            held while building, and while mounting or unmounting
<cache>/<suite>/users           lab directories using the root's mounts, one a line

Labs enter the root with `unshare --root=ROOT --wd=CWD argv` (chroot and chdir, no new
namespace): /proc, /dev, /sys, /tmp, /var/tmp and the repository are mounted inside it at the
same paths as on the host, so every path a lab writes means the same file on both sides.
The mounts are shared by the labs using the root; the last one to go unmounts them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from medic_core import proc

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = "http://deb.debian.org/debian"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Slurm release -> the Debian suite whose archive carries it (measured 2026-11-28).
SUITES = {"24.11": "trixie", "26.05": "sid"}
HOST_RELEASE = "22.05"
PACKAGES = (
    "munge", "slurmctld", "slurmd", "slurm-client", "libslurm-dev", "python3", "python3-venv",
    "gcc", "libc6-dev", "ca-certificates", "util-linux", "procps",
)  # fmt: skip
VENV = Path("/opt/medic/venv")
# Present only inside a root: a process that finds it runs Slurm's binaries directly.
MARKER = Path("/etc/medic-lab-release")
# Mounted at the same path inside the root: the repository (Medic runs from source there)
# and the temporary directories labs and tests live in.
SHARED_DIRS = (Path("/tmp"), Path("/var/tmp"))
STEPS_VERSION = "1"  # bump when the build steps below change in a way the hash cannot see
DEBOOTSTRAP_TIMEOUT = 900.0
APT_TIMEOUT = 900.0
PIP_TIMEOUT = 600.0
MOUNT_TIMEOUT = 30.0
STRAY_GRACE = 5.0  # seconds a stray in a released root has between SIGTERM and SIGKILL
SETUP_GRACE = 300.0  # seconds a lab may take from taking the root to starting its munged


class RootError(RuntimeError):
    """The root could not be built or mounted; the message says why and what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("MEDIC_LAB_CACHE", "/var/cache/medic-lab"))


def runtime_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def console_scripts(pyproject: Path = REPO / "pyproject.toml") -> dict[str, str]:
    return dict(tomllib.loads(pyproject.read_text())["project"]["scripts"])


def recipe_hash(suite: str, requirements: list[str], scripts: dict[str, str]) -> str:
    text = "\n".join(
        [STEPS_VERSION, suite, ARCHIVE, *PACKAGES, "--", *requirements, "--"]
        + [f"{name}={target}" for name, target in sorted(scripts.items())]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def script_text(target: str) -> str:
    """A console script of the root's venv: Medic itself comes from PYTHONPATH (the repo)."""
    module, func = target.split(":")
    return f"#!{VENV}/bin/python3\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n"


def release_of_suite(suite: str) -> str:
    return next(release for release, name in SUITES.items() if name == suite)


@dataclass(frozen=True)
class DebianRoot:
    """The cached root for one Slurm release."""

    release: str
    cache: Path

    @classmethod
    def for_release(cls, release: str, cache: Path | None = None) -> DebianRoot:
        if release not in SUITES:
            known = ", ".join([HOST_RELEASE, *SUITES])
            raise RootError(f"no Debian root for Slurm {release!r}: use one of {known}")
        return cls(release=release, cache=cache or cache_dir())

    @property
    def suite(self) -> str:
        return SUITES[self.release]

    @property
    def dir(self) -> Path:
        return self.cache / self.suite

    @property
    def path(self) -> Path:
        return self.dir / "root"

    @property
    def lock_path(self) -> Path:
        return self.cache / f"{self.suite}.lock"

    @property
    def users_file(self) -> Path:
        return self.dir / "users"

    @property
    def venv_bin(self) -> Path:
        """The venv's bin directory as processes inside the root see it."""
        return VENV / "bin"

    def recipe(self) -> str:
        return recipe_hash(self.suite, runtime_requirements(), console_scripts())

    def is_current(self) -> bool:
        stamp = self.path / "RECIPE"
        return stamp.is_file() and stamp.read_text().strip() == self.recipe()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.cache.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    # ---- build -------------------------------------------------------------------------

    def ensure(self) -> Path:
        """The root, built first if missing or built from another recipe. Parallel callers
        (test workers) wait on the lock and find it built."""
        if self.is_current():
            return self.path
        if os.geteuid() != 0:
            raise RootError(f"building the Slurm {self.release} root needs root: run as root")
        with self.locked():
            if self.is_current():
                return self.path
            if self._users():
                raise RootError(
                    f"{self.path} is from an old recipe and labs still use it "
                    f"({', '.join(self._users())}): `medic lab down` them first"
                )
            self._unmount_all()
            self._build()
        return self.path

    def _build(self) -> None:
        new = self.dir / "root.new"
        self.dir.mkdir(parents=True, exist_ok=True)
        _remove_tree(new)
        env = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}
        _run(
            ["debootstrap", "--variant=minbase", self.suite, str(new), ARCHIVE],
            DEBOOTSTRAP_TIMEOUT,
            env,
            "debootstrap (apt-get install debootstrap)",
        )
        shutil.copyfile("/etc/resolv.conf", new / "etc/resolv.conf")
        certs = new / "usr/local/share/ca-certificates"
        certs.mkdir(parents=True, exist_ok=True)
        for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
            shutil.copyfile(crt, certs / crt.name)
        mounts = _system_mounts(new)
        try:
            for target, argv in mounts:
                target.mkdir(parents=True, exist_ok=True)
                _run(argv, MOUNT_TIMEOUT, env, "mount")
            inside = ["unshare", f"--root={new}", "--wd=/"]
            apt_env = {**env, "DEBIAN_FRONTEND": "noninteractive"}
            # The archive this machine reaches may serve a sid Release file past its
            # Valid-Until; its signature is still checked.
            update = ["apt-get", "update", "-qq", "-o", "Acquire::Check-Valid-Until=false"]
            _run([*inside, *update], APT_TIMEOUT, apt_env, "apt-get update")
            _run(
                [*inside, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
                APT_TIMEOUT,
                apt_env,
                "apt-get install",
            )
            _run([*inside, "update-ca-certificates"], MOUNT_TIMEOUT, env, "update-ca-certificates")
            _run([*inside, "python3", "-m", "venv", str(VENV)], PIP_TIMEOUT, env, "venv")
            pip_env = {**env, "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt", "HOME": "/root"}
            for key in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "NO_PROXY"):
                if key in os.environ:
                    pip_env[key] = os.environ[key]
            _run(
                [*inside, f"{VENV}/bin/pip", "install", "-q", *runtime_requirements()],
                PIP_TIMEOUT,
                pip_env,
                "pip install",
            )
        finally:
            for target in reversed([t for t, _ in mounts]):
                _umount(target)
        for name, entry_point in console_scripts().items():
            script = new / str(VENV).lstrip("/") / "bin" / name
            script.write_text(script_text(entry_point))
            script.chmod(0o755)
        (new / str(MARKER).lstrip("/")).write_text(f"{self.release}\n")
        (new / "RECIPE").write_text(f"{self.recipe()}\n")
        _remove_tree(self.path)
        new.rename(self.path)

    # ---- mounts, shared by the labs using the root -------------------------------------

    def _users(self) -> dict[str, float]:
        """Lab directory -> when it took the root (lines "EPOCH PATH"); a lab in its first
        minutes counts even before its lab.json names a live munged."""
        try:
            lines = self.users_file.read_text().splitlines()
        except FileNotFoundError:
            return {}
        users = {}
        for line in lines:
            since, _, path = line.partition(" ")
            try:
                taken = float(since)
            except ValueError:
                continue
            if path and (time.time() - taken < SETUP_GRACE or _in_use(Path(path))):
                users[path] = taken
        return users

    def _write_users(self, users: dict[str, float]) -> None:
        self.users_file.write_text("".join(f"{t:.0f} {p}\n" for p, t in users.items()))

    def _mounts(self) -> list[tuple[Path, list[str]]]:
        shared = []
        for source in (*SHARED_DIRS, REPO):
            target = self.path / str(source).lstrip("/")
            shared.append((target, ["mount", "--bind", "--make-rslave", str(source), str(target)]))
        # The root on itself first (private: nothing mounted in it shows on the host's /):
        # inside, `/` is then a mount point, which a daemon's sandbox needs (production.py).
        itself = (self.path, ["mount", "--bind", "--make-private", str(self.path), str(self.path)])
        return [itself, *_system_mounts(self.path), *shared]

    def acquire(self, lab_root: Path) -> None:
        """Mount what the root needs (once for all labs) and record `lab_root` as a user;
        a lab directory outside /tmp and /var/tmp gets a mount of its own."""
        self.ensure()
        env = {"PATH": SYSTEM_PATH}
        with self.locked():
            users = self._users()
            if not users:
                self._unmount_all()  # whatever a crashed lab left
                for target, argv in self._mounts():
                    target.mkdir(parents=True, exist_ok=True)
                    _run(argv, MOUNT_TIMEOUT, env, "mount")
            own = self._own_mount(lab_root)
            if own is not None and not _mounted(own):
                own.mkdir(parents=True, exist_ok=True)
                _run(["mount", "--bind", str(lab_root), str(own)], MOUNT_TIMEOUT, env, "mount")
            users[str(lab_root)] = time.time()
            self._write_users(users)

    def release_use(self, lab_root: Path) -> None:
        """Forget `lab_root`; unmount everything when no lab uses the root any more."""
        if not self.path.exists():
            return
        with self.locked():
            own = self._own_mount(lab_root)
            if own is not None:
                _umount(own)
            users = self._users()
            users.pop(str(lab_root), None)
            self._write_users(users)
            if not users:
                # With no lab left, whatever still runs in the root is a stray (a health
                # check or prolog slurmd started as it was stopped) and would keep a mount busy.
                self._stop_strays()
                self._unmount_all()

    def _own_mount(self, lab_root: Path) -> Path | None:
        if any(lab_root.is_relative_to(d) for d in (*SHARED_DIRS, REPO)):
            return None
        return self.path / str(lab_root).lstrip("/")

    def processes_inside(self) -> list[int]:
        """Processes whose root is this root (readlink /proc/PID/root)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.readlink(entry / "root") == str(self.path):
                    found.append(int(entry.name))
        return found

    def _stop_strays(self) -> None:
        """SIGTERM what runs in the root, SIGKILL what is left after STRAY_GRACE; a process
        gone, or only a zombie (it holds no mount), counts as stopped."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = self.processes_inside()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + STRAY_GRACE
            while self.processes_inside() and time.monotonic() < deadline:
                time.sleep(0.05)

    def _unmount_all(self) -> None:
        """Every mount inside the root, a crashed lab's own included; deepest first."""
        for point in sorted(self.mounts_left(), reverse=True):
            _umount(Path(point))

    def mounts_left(self) -> list[str]:
        """Mount points inside the root (from /proc/self/mountinfo)."""
        prefix = str(self.path) + "/"
        return [p for p in _mount_points() if p == str(self.path) or p.startswith(prefix)]

    def enter(self, argv: list[str], cwd: Path | None = None) -> list[str]:
        """`argv` run inside the root, in `cwd` (default /)."""
        return ["unshare", f"--root={self.path}", f"--wd={cwd or '/'}", *argv]


def _system_mounts(root: Path) -> list[tuple[Path, list[str]]]:
    """/proc, and /dev and /sys recursively (slurmd needs the cgroup filesystem under
    /sys/fs/cgroup, Python's multiprocessing /dev/shm); rslave so that unmounting inside
    never propagates back to the host."""
    proc_dir, dev, sys_dir = root / "proc", root / "dev", root / "sys"
    return [
        (proc_dir, ["mount", "-t", "proc", "proc", str(proc_dir)]),
        (dev, ["mount", "--rbind", "--make-rslave", "/dev", str(dev)]),
        (sys_dir, ["mount", "--rbind", "--make-rslave", "/sys", str(sys_dir)]),
    ]


def _remove_tree(tree: Path) -> None:
    """Delete a root, its mounts first: a build killed half-way leaves the host's /dev and
    /sys mounted in it, and deleting through them would delete the host's."""
    for point in sorted(_mount_points(), reverse=True):
        if point.startswith(f"{tree}/"):
            _umount(Path(point))
    left = [point for point in _mount_points() if point.startswith(f"{tree}/")]
    if left:
        raise RootError(f"{tree} still has mounts ({', '.join(left)}): unmount them first")
    shutil.rmtree(tree, ignore_errors=True)


def _run(argv: list[str], timeout: float, env: dict[str, str], what: str) -> None:
    result = proc.run(argv, timeout=timeout, env=env)
    if not result.ok:
        raise RootError(f"{what} failed: {result.describe_failure()}")


def _in_use(lab_root: Path) -> bool:
    """False for a lab that cannot come back to release its use: its directory is gone, or
    its munged (started first, stopped last) died without `medic lab down`."""
    try:
        state = json.loads((lab_root / "lab.json").read_text())
    except FileNotFoundError:
        return lab_root.exists()  # being set up: lab.json comes next
    except ValueError:
        return True
    pid = state.get("munged_pid", 0) if isinstance(state, dict) else 0
    return not isinstance(pid, int) or pid <= 0 or Path(f"/proc/{pid}").exists()


def _mount_points() -> list[str]:
    """Every mount point of this mount namespace. (os.path.ismount misses a bind mount of a
    directory of the same filesystem.)"""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4].replace("\\040", " ") for line in lines]


def _mounted(target: Path) -> bool:
    return str(target) in _mount_points()


def _umount(target: Path) -> None:
    if _mounted(target):
        _run(["umount", "-R", str(target)], MOUNT_TIMEOUT, {"PATH": SYSTEM_PATH}, "umount")


def main(argv: list[str] | None = None) -> int:
    """`python -m cli.lab.debian_root RELEASE`: build (or check) the cached root."""
    import argparse

    parser = argparse.ArgumentParser(prog="medic-lab-root")
    parser.add_argument("release", choices=sorted(SUITES))
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        path = DebianRoot.for_release(args.release).ensure()
    except RootError as exc:
        print(f"medic-lab-root: {exc}")
        return 1
    print(f"{path} ready in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

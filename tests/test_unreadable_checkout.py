"""A checkout no other user can read (issue 29): cloned into /root, or any directory of mode
0700, the tests that run Medic as another user still pass, because that user runs the
installed wheel (tests/installed.py), never the checkout or its .venv.

The proof runs the suite's unprivileged part (every test here that acts as another user but
needs no lab: NESTED) from a copy of this tree under a fresh 0700 directory, with the .venv
reached through it too, as `bash scripts/test` from /root/medic would. The lab's intruder
(tests/test_unprivileged_lab.py) uses the same install; its lab takes a minute to start, so
it is not run a second time here. A test file that acts as another user and is in neither
list fails test_every_test_acting_as_another_user_is_proven_from_an_unreadable_checkout."""

from __future__ import annotations

import ast
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from medic_core import proc
from tests import installed
from tests.installed import Installed, InstallError, installed_medic

REPO = Path(__file__).resolve().parents[1]
NESTED = [
    "tests/test_socket_permissions.py",
    "tests/test_store_permissions.py",
    "tests/test_config_hardening.py::test_an_unreadable_config_is_one_line",
    "tests/test_checkpoint.py::test_commit_into_a_directory_the_job_cannot_write_is_one_line",
    "tests/test_socket_matrix.py::test_each_peer_gets_what_the_matrix_grants_and_no_more",
    "tests/test_socket_matrix.py::test_job_summary_runs_only_the_daemons_post_job_checks",
    "tests/test_socket_matrix.py::test_the_socket_group_cannot_write_a_job_action",
    "tests/test_unreadable_checkout.py::test_another_user_runs_the_installed_medic_not_the_checkout",
]
NOT_NESTED = {
    "tests/test_unprivileged_lab.py": "its lab takes a minute to start; uses installed_medic()",
    "tests/pg.py": "runs PostgreSQL's own binaries as postgres, nothing of Medic's",
    "tests/installed.py": "the install itself, proven by nobody when it is built",
    "tests/test_unreadable_checkout.py": "this file",
}
# What a test runs as another user with (util-linux setpriv, runuser; os.setuid in a child).
ACTS_AS_ANOTHER_USER = ("--reuid", "runuser", "setuid(")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


# --- the install ----------------------------------------------------------------------------


@needs_root
def test_another_user_runs_the_installed_medic_not_the_checkout() -> None:
    medic = installed_medic()
    assert not medic.venv.is_relative_to(REPO) and not medic.venv.is_relative_to(sys.prefix)
    for directory in [medic.venv.parent, *medic.venv.parent.parents]:
        st = directory.lstat()
        assert st.st_uid == 0 and not stat.S_ISLNK(st.st_mode), directory
        assert stat.S_IMODE(st.st_mode) & 0o022 == 0 or st.st_mode & stat.S_ISVTX, directory
    done = proc.run(installed.as_nobody(str(medic.command("medic")), "--help"), timeout=60,
                    cwd=Path("/"))  # fmt: skip
    assert done.ok and "Usage: medic" in done.stdout, done.stdout + done.stderr
    shown = proc.run(
        installed.as_nobody(str(medic.python), "-I", "-c", "import cli; print(cli.__file__)"),
        timeout=60,
        cwd=Path("/"),
    )
    assert shown.stdout.startswith(f"{medic.venv}/lib/"), shown.stdout + shown.stderr


@pytest.fixture
def base() -> Iterator[Path]:
    """An install directory as /var/cache/medic-tests is, below a root-owned 0755 one."""
    top = Path(tempfile.mkdtemp(prefix="medic-installed-", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield top / "base"
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A tree of the packages' shape, not git's (the files walked, not listed by git)."""
    for name in [*installed.METADATA, "cli/main.py", "medic_core/store.py", "tests/test_x.py"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"# {name}\n")
    return tmp_path


class FakeBuild:
    """Stands in for build_venv: records its calls, makes a venv-shaped directory."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, repo: Path, names: list[str], target: Path) -> None:
        self.calls.append(names)
        (target / "venv" / "bin").mkdir(parents=True)
        if self.fail:
            raise InstallError("pip install: exit 1: no network")


needs_root_to_own = pytest.mark.skipif(os.geteuid() != 0, reason="the install dir is root's")


@needs_root_to_own
def test_a_build_is_made_once_and_reused_and_follows_the_packages_not_the_tests(
    repo: Path, base: Path
) -> None:
    build = FakeBuild()
    first = installed.install(repo, base, build)
    assert installed.install(repo, base, build) == first and len(build.calls) == 1
    assert build.calls[0] == sorted([*installed.METADATA, "cli/main.py", "medic_core/store.py"])
    assert stat.S_IMODE(base.stat().st_mode) == 0o755
    (repo / "tests" / "test_x.py").write_text("# changed\n")
    assert installed.install(repo, base, build) == first and len(build.calls) == 1
    (repo / "cli" / "main.py").write_text("# changed\n")
    assert installed.install(repo, base, build) != first and len(build.calls) == 2


@needs_root_to_own
def test_an_interrupted_or_failed_build_is_made_again(repo: Path, base: Path) -> None:
    with pytest.raises(InstallError, match="no network"):
        installed.install(repo, base, FakeBuild(fail=True))
    assert [p.name for p in base.iterdir() if p.is_dir()] == []  # nothing half-made kept
    build = FakeBuild()
    medic = installed.install(repo, base, build)
    (medic.venv.parent / installed.READY).unlink()  # as if killed before it was written
    (medic.venv / "left-over").write_text("")
    again = installed.install(repo, base, build)
    assert again == medic and len(build.calls) == 2 and not (medic.venv / "left-over").exists()


def plant_symlink(path: Path) -> None:
    path.symlink_to(path.parent)


def plant_users_dir(path: Path) -> None:
    path.mkdir(mode=0o755)
    os.chown(path, 65534, 65534)


def plant_open_dir(path: Path) -> None:
    path.mkdir()
    path.chmod(0o777)


def plant_closed_dir(path: Path) -> None:
    path.mkdir()
    path.chmod(0o700)


def plant_file(path: Path) -> None:
    path.write_text("")


@needs_root_to_own
@pytest.mark.parametrize(
    ("plant", "why"),
    [
        (plant_symlink, "is a symlink"),
        (plant_users_dir, "is owned by uid 65534, not root"),
        (plant_open_dir, r"may be written by users other than root \(mode 0777\)"),
        (plant_closed_dir, r"may not be entered by other users \(mode 0700\)"),
        (plant_file, "is not a directory"),
    ],
)
def test_an_install_directory_another_user_could_have_planted_is_refused(
    repo: Path, base: Path, plant: Callable[[Path], None], why: str
) -> None:
    plant(base)
    build = FakeBuild()
    with pytest.raises(InstallError, match=rf"^{re.escape(str(base))}: {why}; make it a root"):
        installed.install(repo, base, build)
    assert build.calls == []


@needs_root_to_own
def test_an_ancestor_others_may_write_is_refused_unless_sticky(repo: Path, base: Path) -> None:
    parent = base.parent / "shared"
    parent.mkdir()
    parent.chmod(0o777)
    with pytest.raises(InstallError, match=r"shared: may be written by users other than root"):
        installed.install(repo, parent / "base", FakeBuild())
    parent.chmod(0o1777)  # as /tmp: others cannot replace root's entries
    installed.install(repo, parent / "base", FakeBuild())


@needs_root_to_own
def test_builds_unused_for_a_week_are_removed_but_not_one_in_use(repo: Path, base: Path) -> None:
    medic = installed.install(repo, base, FakeBuild())
    keep = medic.venv.parent.name
    for name in ("old", "held", "recent"):
        (base / name / "venv").mkdir(parents=True)
        (base / name / installed.READY).write_text(name)
    week_ago = time.time() - installed.UNUSED_FOR - 60
    for name in ("old", "held"):
        os.utime(base / name / installed.READY, (week_ago, week_ago))
    with installed.locked(base / "held.lock"):
        assert installed.prune(base, keep, now=time.time()) == ["old"]
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == sorted([keep, "held", "recent"])


def test_a_test_needing_the_install_fails_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot(*_: object) -> Installed:
        raise InstallError("pip wheel: exit 1: ERROR: Could not find setuptools>=77\n(no net)")

    monkeypatch.setattr(installed, "install", cannot)
    monkeypatch.setattr(installed, "_outcome", {})
    for _ in range(2):  # the second test is told the same, without a second attempt
        with pytest.raises(pytest.fail.Exception) as failed:
            installed_medic()
        assert failed.value.pytrace is False
        assert str(failed.value) == (
            "cannot install Medic where another user can read it, as the tests that run it as "
            "one need: pip wheel: exit 1: ERROR: Could not find setuptools>=77 (no net)"
        )


# --- the proof ------------------------------------------------------------------------------


def test_every_test_acting_as_another_user_is_proven_from_an_unreadable_checkout() -> None:
    nested_files = {n.split("::")[0] for n in NESTED}
    for path in sorted((REPO / "tests").glob("*.py")):
        name = str(path.relative_to(REPO))
        text = path.read_text()
        if not any(marker in text for marker in ACTS_AS_ANOTHER_USER):
            continue
        assert name in nested_files or name in NOT_NESTED, (
            f"{name} runs something as another user: add its tests to NESTED (or say in "
            "NOT_NESTED why not) and run Medic there from installed_medic()"
        )
        if name in nested_files:
            assert "installed_medic()" in text, name
        # An argv that changes user never runs this interpreter (it may be under /root).
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.List | ast.Call):
                inner = list(ast.walk(node))
                if any(is_reuid(n) for n in inner):
                    assert not any(is_sys_executable(n) for n in inner), f"{name}:{node.lineno}"
    for node_id in NESTED:
        file, _, test = node_id.partition("::")
        assert (REPO / file).is_file(), node_id
        assert not test or f"def {test}(" in (REPO / file).read_text(), node_id


def is_reuid(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant) and isinstance(node.value, str) and "--reuid" in node.value
    )


def is_sys_executable(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "executable"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def copy_of_the_checkout(top: Path) -> Path:
    """The working tree's files (tracked, or new and not ignored) in `top`/medic, made a git
    repository as a clone is, with this .venv reached through it."""
    listed = proc.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        timeout=60,
        check=True,
    )
    clone = top / "medic"
    for name in filter(None, listed.stdout.split("\0")):
        if (REPO / name).is_file() and not (REPO / name).is_symlink():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    proc.run(["git", "init", "-q", str(clone)], timeout=60, check=True)
    proc.run(["git", "-C", str(clone), "add", "-A"], timeout=60, check=True)
    (clone / ".venv").symlink_to(sys.prefix)
    return clone


@needs_root
@pytest.mark.timeout(900)
@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs the checkout's .venv")
def test_the_unprivileged_tests_pass_from_a_checkout_under_a_0700_directory() -> None:
    medic = installed_medic()  # built (or found) before the clock of the nested run starts
    top = Path(tempfile.mkdtemp(prefix="medic-0700-"))
    try:
        assert stat.S_IMODE(top.stat().st_mode) == 0o700
        clone = copy_of_the_checkout(top)
        closed = proc.run(
            installed.as_nobody(str(medic.python), "-I", "-c",
                                "import sys; open(sys.argv[1])", str(clone / "pyproject.toml")),
            timeout=60, cwd=Path("/"),
        )  # fmt: skip
        assert closed.returncode == 1 and "PermissionError" in closed.stderr, closed.stderr
        unset = ("PYTEST_", "PYTHONDONTWRITEBYTECODE", "PYTHONSAFEPATH", "PYTHONPATH")
        env = {k: v for k, v in os.environ.items() if not k.startswith(unset)}
        python = clone / ".venv" / "bin" / Path(sys.executable).name
        started = time.monotonic()
        done = proc.run(
            [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=600",
             *NESTED],
            env=env, cwd=clone, timeout=800,
        )  # fmt: skip
        took = time.monotonic() - started
        summary = (done.stdout.strip().splitlines() or [""])[-1]
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
        assert re.fullmatch(r"\d+ passed in .*", summary), done.stdout[-6000:]
        # The copy's packages were the ones the tests imported (its bytecode was written).
        for package in ("cli", "medic_core", "healthd", "tests"):
            assert (clone / package / "__pycache__").is_dir(), package
        print(f"\nfrom {clone}: {summary} ({took:.1f}s with the pytest start)")
    finally:
        shutil.rmtree(top, ignore_errors=True)

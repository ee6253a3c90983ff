"""The cached Debian root of a newer Slurm release (cli/lab/debian_root.py) and how a lab on
it is entered, without building or mounting anything: recipes, users, paths, environments."""

from __future__ import annotations

import json
import os
import signal
import subprocess  # noqa: TID251  (Popen: a process that stays in the root while it is released)
import sys
import time
from pathlib import Path

import pytest

from cli.lab import debian_root
from cli.lab.cluster import Lab
from cli.lab.debian_root import DebianRoot, RootError, recipe_hash
from cli.lab.lab_env import LabState
from cli.lab.lab_files import enter_root_lines
from cli.lab.processes import holds_lab_file
from cli.lab.slurm_conf import LabPorts, LabSpec
from medic_core import proc
from medic_core.slurm import BIN_DIRS_ENV, DEFAULT_BIN_DIRS, CliSlurm

REQUIREMENTS = ["click>=8.1", "psutil>=5.9"]
SCRIPTS = {"medic": "cli.main:main"}


def test_the_recipe_hash_changes_with_what_goes_into_the_root() -> None:
    base = recipe_hash("trixie", REQUIREMENTS, SCRIPTS)
    assert base == recipe_hash("trixie", list(REQUIREMENTS), dict(SCRIPTS))
    assert base != recipe_hash("sid", REQUIREMENTS, SCRIPTS)
    assert base != recipe_hash("trixie", [*REQUIREMENTS, "SQLAlchemy>=2.0,<3"], SCRIPTS)
    assert base != recipe_hash("trixie", REQUIREMENTS, {**SCRIPTS, "medic-healthd": "x:main"})


def test_a_root_built_from_another_recipe_is_not_current(tmp_path: Path) -> None:
    root = DebianRoot.for_release("24.11", cache=tmp_path)
    assert not root.is_current()  # nothing built
    root.path.mkdir(parents=True)
    (root.path / "RECIPE").write_text("0123456789abcdef\n")
    assert not root.is_current()
    (root.path / "RECIPE").write_text(f"{root.recipe()}\n")
    assert root.is_current()


def test_an_unknown_release_is_refused_with_the_known_ones() -> None:
    with pytest.raises(RootError, match=r"no Debian root for Slurm '23\.02': use one of 22\.05"):
        DebianRoot.for_release("23.02")


def test_the_cache_directory_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEDIC_LAB_CACHE", str(tmp_path))
    assert DebianRoot.for_release("24.11").path == tmp_path / "trixie" / "root"


def test_console_scripts_run_medic_from_the_path_the_lab_gives() -> None:
    text = debian_root.script_text("healthd.daemon:main")
    assert text.startswith(f"#!{debian_root.VENV}/bin/python3\n")
    assert "from healthd.daemon import main" in text
    assert set(debian_root.console_scripts()) >= {"medic", "medic-healthd", "medic-prolog"}


def _lab_dir(tmp_path: Path, name: str, munged_pid: int) -> Path:
    lab = tmp_path / name
    lab.mkdir()
    (lab / "lab.json").write_text(json.dumps({"munged_pid": munged_pid}))
    return lab


def test_a_lab_that_died_without_down_no_longer_holds_the_mounts(tmp_path: Path) -> None:
    root = DebianRoot.for_release("24.11", cache=tmp_path / "cache")
    root.dir.mkdir(parents=True)
    alive = _lab_dir(tmp_path, "alive", os.getpid())
    dead = _lab_dir(tmp_path, "dead", 2**22 + 7)  # above pid_max: never a live process
    starting = _lab_dir(tmp_path, "starting", 0)  # lab.json written before munged starts
    old = time.time() - 2 * debian_root.SETUP_GRACE
    lines = [f"{old:.0f} {alive}", f"{old:.0f} {dead}", f"{old:.0f} {starting}",
             f"{old:.0f} {tmp_path / 'gone'}", "not-a-time /x", ""]  # fmt: skip
    root.users_file.write_text("\n".join(lines))
    assert set(root._users()) == {str(alive), str(starting)}
    # A lab that has just taken the root counts whatever its lab.json says (a reused dir).
    root.users_file.write_text(f"{time.time():.0f} {dead}\n")
    assert set(root._users()) == {str(dead)}


def test_only_a_lab_outside_the_shared_directories_gets_a_mount_of_its_own(tmp_path: Path) -> None:
    root = DebianRoot.for_release("24.11", cache=tmp_path)
    assert root._own_mount(Path("/tmp/lab")) is None
    assert root._own_mount(Path("/var/tmp/medic-lab")) is None
    assert root._own_mount(Path("/srv/lab")) == root.path / "srv/lab"


def _saved_lab(tmp_path: Path, release: str) -> Lab:
    lab = Lab(tmp_path / "lab")
    lab.root.mkdir()
    state = LabState(LabSpec(slurm=release), LabPorts(20000, 20001), "h", "/opt/medic/venv/bin")
    lab.layout.state_file.write_text(state.to_json())
    return Lab(lab.root)  # a fresh object reads the release from lab.json


def test_a_lab_on_a_debian_root_runs_its_processes_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEDIC_LAB_CACHE", str(tmp_path / "cache"))
    lab = _saved_lab(tmp_path, "24.11")
    assert lab.release() == "24.11"
    root = tmp_path / "cache" / "trixie" / "root"
    assert lab.in_root(["/usr/sbin/slurmd", "-D"]) == [
        "unshare", f"--root={root}", f"--wd={lab.root}", "/usr/sbin/slurmd", "-D",
    ]  # fmt: skip
    env = lab.process_env()
    assert env["PATH"].startswith(f"{lab.layout.slurm_bin}:")
    assert env[BIN_DIRS_ENV] == str(lab.layout.slurm_bin)
    assert env["PYTHONPATH"] == str(debian_root.REPO)
    assert f"export PATH={lab.layout.slurm_bin}:" in "\n".join(lab.export_lines())


def test_a_lab_on_the_hosts_slurm_runs_as_before(tmp_path: Path) -> None:
    lab = _saved_lab(tmp_path, "22.05")
    assert lab.in_root(["/usr/sbin/slurmd"]) == ["/usr/sbin/slurmd"]
    env = lab.process_env()
    assert BIN_DIRS_ENV not in env and "PYTHONPATH" not in lab.env()
    assert str(lab.layout.slurm_bin) not in env["PATH"]


def test_a_lab_json_of_before_the_release_field_is_the_hosts_slurm(tmp_path: Path) -> None:
    lab = _saved_lab(tmp_path, "22.05")
    raw = json.loads(lab.layout.state_file.read_text())
    del raw["spec"]["slurm"]
    lab.layout.state_file.write_text(json.dumps(raw))
    assert Lab(lab.root).release() == "22.05"


def test_medics_slurm_client_looks_in_the_environments_directories_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BIN_DIRS_ENV, f"{tmp_path / 'a'}::{tmp_path / 'b'}")
    assert CliSlurm(env={}).bin_dirs == (tmp_path / "a", tmp_path / "b", *DEFAULT_BIN_DIRS)
    monkeypatch.delenv(BIN_DIRS_ENV)
    assert CliSlurm(env={}).bin_dirs == DEFAULT_BIN_DIRS
    assert CliSlurm(env={}, bin_dirs=[tmp_path]).bin_dirs == (tmp_path,)


def _fake_proc_entry(tmp_path: Path, root: Path, cwd: str, fds: list[str]) -> Path:
    entry = tmp_path / "proc" / "4242"
    (entry / "fd").mkdir(parents=True)
    (entry / "root").symlink_to(root)
    (entry / "cwd").symlink_to(cwd)
    for number, target in enumerate(fds):
        (entry / "fd" / str(number)).symlink_to(target)
    return entry


def test_a_process_in_the_root_holding_a_file_of_the_lab_is_the_labs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """26.05's slurmstepd blanks its environment (no lab tag) and outlives a killed slurmd:
    down finds it by what it holds open, seen through the root."""
    monkeypatch.setenv("MEDIC_LAB_CACHE", str(tmp_path / "cache"))
    lab = _saved_lab(tmp_path, "26.05")
    root = lab.debian_root()
    assert root is not None
    inside = f"{root.path}{lab.root}"
    spool = _fake_proc_entry(tmp_path / "a", root.path, "/", [f"{inside}/nodes/n1/slurmd.log"])
    assert holds_lab_file(spool, lab.root, root)
    in_cwd = _fake_proc_entry(tmp_path / "b", root.path, inside, [])
    assert holds_lab_file(in_cwd, lab.root, root)
    # Another lab on the same root (a sibling whose name starts the same), or the host.
    sibling = _fake_proc_entry(tmp_path / "c", root.path, f"{inside}-2", [f"{inside}-2/x"])
    assert not holds_lab_file(sibling, lab.root, root)
    on_host = _fake_proc_entry(tmp_path / "d", Path("/"), str(lab.root), [str(lab.root)])
    assert not holds_lab_file(on_host, lab.root, root)
    assert not holds_lab_file(tmp_path / "proc" / "gone", lab.root, root)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")
def test_removing_a_root_never_deletes_through_a_mount_in_it(tmp_path: Path) -> None:
    """A build killed half-way leaves the host's /dev mounted in its root: the next build
    deletes that root after unmounting, not the host's files through it."""
    keep = tmp_path / "host-dev"
    keep.mkdir()
    (keep / "null").write_text("the host's\n")
    tree = tmp_path / "root.new"
    (tree / "dev").mkdir(parents=True)
    proc.run(["mount", "--bind", str(keep), str(tree / "dev")], timeout=10, check=True)
    try:
        debian_root._remove_tree(tree)
    finally:
        proc.run(["umount", str(tree / "dev")], timeout=10)
    assert not tree.exists()
    assert (keep / "null").read_text() == "the host's\n"


def test_a_wrapper_run_on_the_host_enters_the_root_in_the_callers_directory(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "unshare"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    root = DebianRoot(release="24.11", cache=tmp_path)  # its path: tmp_path/trixie/root
    script = tmp_path / "scontrol"
    script.write_text(f"#!/bin/sh\n{enter_root_lines(root, '/usr/bin/scontrol')}echo host\n")
    script.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    root.path.mkdir(parents=True)
    (tmp_path / "work").mkdir()
    inside = proc.run([str(script), "ping", "it's"], timeout=10, env=env, cwd=tmp_path / "work")
    # tmp_path/work has no twin in the root: / instead; the arguments pass as they are.
    assert inside.stdout == f"--root={root.path} --wd=/ /usr/bin/scontrol ping it's\n"
    at = root.path / str(tmp_path / "work").lstrip("/")
    at.mkdir(parents=True)
    inside = proc.run([str(script)], timeout=10, env=env, cwd=tmp_path / "work")
    assert inside.stdout == f"--root={root.path} --wd={tmp_path / 'work'} /usr/bin/scontrol\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts and chroot need root")
def test_the_last_lab_out_stops_what_still_runs_in_the_root_then_unmounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process slurmd started as it was stopped (a health check, a prolog) kept the root's
    /tmp busy, and `medic lab down` failed with "target is busy" (CI, Slurm 24.11)."""
    monkeypatch.setenv("MEDIC_LAB_CACHE", str(tmp_path / "cache"))
    root = DebianRoot.for_release("24.11")
    shared = tmp_path / "shared"
    shared.mkdir()
    inside = root.path / "tmp"
    inside.mkdir(parents=True)
    proc.run(["mount", "--bind", str(shared), str(inside)], timeout=10, check=True)
    stray = subprocess.Popen(
        [sys.executable, "-c", "import os, time; os.chroot(os.sys.argv[1]); os.chdir('/tmp');"
         " print('in', flush=True); time.sleep(600)", str(root.path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert stray.stdout is not None and stray.stdout.readline() == "in\n"
        assert root.processes_inside() == [stray.pid]
        assert not proc.run(["umount", str(inside)], timeout=10).ok  # busy, as in CI
        lab_root = tmp_path / "lab"
        lab_root.mkdir()
        root.users_file.parent.mkdir(parents=True, exist_ok=True)
        root.users_file.write_text(f"{time.time():.0f} {lab_root}\n")
        root.release_use(lab_root)
        assert stray.wait(timeout=30) == -signal.SIGTERM
        assert root.mounts_left() == []
    finally:
        stray.kill()
        stray.wait()
        proc.run(["umount", "-R", str(inside)], timeout=10)

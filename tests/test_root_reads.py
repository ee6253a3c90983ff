"""Root reading a user's checkpoint directory (issue 23, finding 3): `medic ckpt latest`,
`medic report --checkpoints` and `medic ckpt prune`, run as root on a directory a user owns,
open nothing through a symlink, never block on a FIFO, read only regular files the
directory's owner owns and no larger than a cap, and prune removes nothing it did not verify,
saying what it removed and what it kept and why (medic_core.user_files)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from cli.report_gather import checkpoint_marks
from medic_core import proc
from medic_core.store import open_store
from medic_core.user_files import MANIFEST_LIMIT, UnsafeFile, UserDir, deadline
from slurm_hooks.checkpoint import LEDGER, MANIFEST, CheckpointDir, LedgerRecord, step_name

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root reading a user's files")

VENV_BIN = Path(sys.executable).parent
USER, OTHER = 4242, 4343  # uids with no account: the directory's owner, and someone else
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root"}
DEADLINE = 30.0  # what the command may take in all; a FIFO blocked it forever


def _chown_tree(root: Path, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, uid)
    os.chown(root, uid, uid)


def _user_dir(tmp_path: Path, steps: tuple[int, ...] = (1, 2)) -> Path:
    """A user's checkpoint directory, written as the job writes it, owned by USER."""
    root = tmp_path / "home" / "ckpt"
    for step in steps:
        with CheckpointDir(root, env={"SLURM_JOB_ID": "7"}).writing(step) as tmp:
            (tmp / "weights").write_bytes(b"w" * 100)
    _chown_tree(root, USER)
    return root


def _root_only(tmp_path: Path, name: str, content: str) -> Path:
    """A file only root may read (the secret a planted symlink points at)."""
    secret_dir = tmp_path / "root-only"
    secret_dir.mkdir(mode=0o700, exist_ok=True)
    secret = secret_dir / name
    secret.write_text(content)
    secret.chmod(0o600)
    return secret


def _manifest(step: int) -> str:
    return json.dumps({"format": 1, "step": step, "time": 1e9, "files": {}})


def _plant(path: Path, how: str, target: Path | None = None) -> None:
    """Replace `path` with a symlink to `target` or a FIFO, as its owner could."""
    if path.is_dir():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    if how == "symlink":
        assert target is not None
        path.symlink_to(target)
    else:
        os.mkfifo(path)
    os.lchown(path, USER, USER)


def _medic(*args: str) -> proc.CommandResult:
    started = time.monotonic()
    done = proc.run([str(VENV_BIN / "medic"), *args], env=ENV, timeout=DEADLINE)
    assert not done.timed_out, f"medic {' '.join(args)}: still running after {DEADLINE} s"
    assert time.monotonic() - started < DEADLINE
    return done


# --- medic ckpt latest ----------------------------------------------------------------------


def test_latest_does_not_follow_a_symlinked_manifest_to_a_root_only_file(tmp_path: Path) -> None:
    root = _user_dir(tmp_path, steps=(1,))
    secret = _root_only(tmp_path, "manifest", _manifest(5))
    step5 = root / step_name(5)
    step5.mkdir()
    os.chown(step5, USER, USER)
    _plant(step5 / MANIFEST, "symlink", secret)
    done = _medic("ckpt", "latest", "--dir", str(root))
    # step 5 would be the newest: its manifest is root's file, which root does not read here.
    assert done.returncode == 0 and done.stdout.strip() == str(root / step_name(1)), done


@pytest.mark.parametrize("what", ["manifest", "step directory"])
def test_latest_ends_at_once_on_a_fifo(tmp_path: Path, what: str) -> None:
    root = _user_dir(tmp_path, steps=(1,))
    target = root / step_name(1) / MANIFEST if what == "manifest" else root / step_name(1)
    _plant(target, "fifo")
    done = _medic("ckpt", "latest", "--dir", str(root))
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"no complete checkpoint in {root}"
    ], done


def test_a_checkpoint_whose_file_is_a_symlink_to_root_only_data_is_not_complete(
    tmp_path: Path,
) -> None:
    """The manifest's sizes were checked through symlinks (is_file, stat): a file that is a
    link to root's data of the right size passed, and --verify hashed root's file."""
    root = _user_dir(tmp_path, steps=(1,))
    secret = _root_only(tmp_path, "weights", "w" * 100)
    _plant(root / step_name(1) / "weights", "symlink", secret)
    done = _medic("ckpt", "latest", "--dir", str(root), "--verify")
    assert done.returncode == 1, done


def test_files_of_another_user_or_too_large_are_not_read(tmp_path: Path) -> None:
    root = _user_dir(tmp_path, steps=(1, 2, 3))
    os.lchown(root / step_name(3) / MANIFEST, OTHER, OTHER)  # someone else's manifest
    with (root / step_name(2) / MANIFEST).open("r+b") as f:  # sparse: no disk used
        f.truncate(MANIFEST_LIMIT + 1)
    done = _medic("ckpt", "latest", "--dir", str(root))
    assert done.returncode == 0 and done.stdout.strip() == str(root / step_name(1)), done


def test_root_reads_a_users_own_checkpoints(tmp_path: Path) -> None:
    root = _user_dir(tmp_path, steps=(1, 2))
    done = _medic("ckpt", "latest", "--dir", str(root), "--verify", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["step"] == 2, done
    assert not list(root.glob(".resume-*"))  # root wrote nothing into the user's directory


# --- medic report --checkpoints ---------------------------------------------------------------


def test_the_report_does_not_follow_symlinked_ledger_marks_or_manifests(tmp_path: Path) -> None:
    root = _user_dir(tmp_path, steps=(1,))
    ledger_line = LedgerRecord("commit", 2e9, 99, "7", 0).line().decode()
    _plant(root / LEDGER, "symlink", _root_only(tmp_path, "ledger", ledger_line))
    mark = json.dumps({"job_id": "7", "restart_count": 1, "time": 2e9, "step": 99})
    _plant(root / ".resume-7.1.json", "symlink", _root_only(tmp_path, "mark", mark))
    step9 = root / step_name(9)
    step9.mkdir()
    os.chown(step9, USER, USER)
    _plant(step9 / MANIFEST, "symlink", _root_only(tmp_path, "manifest", _manifest(9)))
    marks = checkpoint_marks([f"7={root}"])
    assert [(m.kind, m.step) for m in marks] == [("commit", 1)]


def test_the_report_ends_at_once_on_fifos(tmp_path: Path) -> None:
    root = _user_dir(tmp_path, steps=(1,))
    _plant(root / step_name(1) / MANIFEST, "fifo")
    _plant(root / ".resume-7.1.json", "fifo")
    _plant(root / LEDGER, "fifo")
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    open_store(url).close()
    done = _medic("report", "--store", url, "--since", "1h", "--checkpoints", f"7={root}")
    assert done.returncode == 0, done


# --- medic ckpt prune -----------------------------------------------------------------------


def test_prune_as_root_removes_only_what_it_verified_and_says_so(tmp_path: Path) -> None:
    root = _user_dir(tmp_path, steps=(1, 2, 3, 4))
    victim = tmp_path / "root-data"
    victim.mkdir()
    (victim / "keep-me").write_text("root's")
    _plant(root / step_name(5), "symlink", victim)  # a "torn" step-* that is a link
    trash = root / ".tmp-step-deleted.step-000000006.abcd"
    _plant(trash, "symlink", victim)  # what the old prune left behind
    os.lchown(root / step_name(1) / "weights", 0, 0)  # a root file inside the user's step
    done = _medic("ckpt", "prune", "--keep", "1", "--dir", str(root))
    assert done.returncode == 0, done
    lines = done.stdout.strip().splitlines()
    assert lines == [
        f"kept {trash}: a symlink, not followed and not removed",
        f"kept {root / step_name(1)}: holds weights, owned by uid 0, not by the directory's"
        f" owner (uid {USER})",
        f"removed {root / step_name(2)}",
        f"removed {root / step_name(3)}",
        f"kept {root / step_name(5)}: a symlink, not followed and not removed",
    ], done
    assert (victim / "keep-me").read_text() == "root's"
    assert (root / step_name(5)).is_symlink() and trash.is_symlink()  # left where they were
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == [
        step_name(1), step_name(4), step_name(5)
    ]  # fmt: skip


# --- the helper's deadline --------------------------------------------------------------------


def test_a_read_that_blocks_is_ended_by_the_deadline(tmp_path: Path) -> None:
    """A regular file on a hung NFS or FUSE mount blocks a read as a FIFO would; the helper
    reads under a deadline (SIGALRM in the main thread). A pipe with no writer stands in."""
    read_end, write_end = os.pipe()
    handler, (outer, _) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError), deadline(0.3):
            os.read(read_end, 1)
        assert time.monotonic() - started < 5
        # An outer timer (pytest-timeout's, if any) and its handler are given back.
        assert signal.getsignal(signal.SIGALRM) == handler
        assert abs(signal.getitimer(signal.ITIMER_REAL)[0] - outer) < 5
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_helper_refuses_each_kind_of_planted_file(tmp_path: Path) -> None:
    root = tmp_path / "dir"
    root.mkdir()
    (root / "ok").write_text("fine")
    (root / "big").write_text("x" * 100)
    (root / "other").write_text("theirs")
    os.chown(root / "other", OTHER, OTHER)
    (root / "link").symlink_to(root / "ok")
    os.mkfifo(root / "fifo")
    (root / "sub").mkdir()
    _chown_tree(root, USER)
    os.chown(root / "other", OTHER, OTHER)
    with UserDir.open(root) as d:
        assert d.read("ok", limit=10) == b"fine"
        problems = {}
        for name in ("big", "other", "link", "fifo", "sub", "missing"):
            with pytest.raises(UnsafeFile) as caught:
                d.read(name, limit=10)
            problems[name] = str(caught.value)
    assert problems == {
        "big": f"{root}/big: larger than 10 bytes",
        "other": f"{root}/other: owned by uid {OTHER}, not by the directory's owner (uid {USER})",
        "link": f"{root}/link: a symlink, not followed",
        "fifo": f"{root}/fifo: not a regular file",
        "sub": f"{root}/sub: not a regular file",
        "missing": f"{root}/missing: No such file or directory",
    }

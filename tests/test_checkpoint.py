"""The checkpoint commit protocol: a job resumes from the last complete checkpoint, and a
writer killed at any moment (a real process, SIGKILL) leaves nothing `latest()` would use."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.ckpt import ckpt
from medic_core import proc
from slurm_hooks.checkpoint import (
    LEDGER,
    MANIFEST,
    TMP_PREFIX,
    CheckpointDir,
    CheckpointError,
    restart_count,
    step_name,
)
from tests.conftest import poll
from tests.installed import installed_medic

REPO = Path(__file__).resolve().parents[1]

# A miniature training loop: resume after the newest complete checkpoint, then write one
# checkpoint per step, forever. With BLOCK_IN_STEP set it stops inside that step's write
# (after writing part of it) and waits to be killed.
TRAINER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from slurm_hooks.checkpoint import CheckpointDir

    ckpt = CheckpointDir(sys.argv[1])
    block_in = int(os.environ.get("BLOCK_IN_STEP", "-1"))
    last = ckpt.resume_step()
    step = 0 if last is None else last + 1
    while True:
        with ckpt.writing(step) as tmp:
            (tmp / "weights.bin").write_bytes(os.urandom(256 * 1024))
            if step == block_in:
                Path(sys.argv[2]).write_text(str(tmp))
                signal.pause()
            (tmp / "opt").mkdir()
            (tmp / "opt" / "state.json").write_text('{"step": %d}' % step)
        step += 1
    """
)


def _files(ckpt: CheckpointDir) -> list[str]:
    """What the directory holds besides the ledger (tests/test_report_truth.py has it)."""
    return sorted(p.name for p in ckpt.root.iterdir() if p.name != LEDGER)


def _write(ckpt: CheckpointDir, step: int, payload: bytes = b"x") -> None:
    with ckpt.writing(step) as tmp:
        (tmp / "model.bin").write_bytes(payload)


def _start_trainer(root: Path, log: Path, block_in: int = -1, marker: Path | None = None) -> int:
    script = log.with_suffix(".py")
    script.write_text(TRAINER)
    env = dict(os.environ, PYTHONPATH=str(REPO), BLOCK_IN_STEP=str(block_in))
    argv = [sys.executable, str(script), str(root), str(marker or log.with_suffix(".marker"))]
    return proc.spawn(argv, log_path=log, env=env)


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    # Reap it (it is our child), so its PID no longer looks alive.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def test_commit_writes_manifest_and_renames_into_place(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2"}
    ckpt = CheckpointDir(tmp_path / "ck", env=env)
    assert ckpt.latest() is None and ckpt.resume_step() is None
    with ckpt.writing(123) as tmp:
        (tmp / "model.bin").write_bytes(b"weights")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "rng.json").write_text("{}")
        assert tmp.parent == ckpt.root and tmp.name.startswith(TMP_PREFIX)
    assert _files(ckpt) == ["step-000000123"]
    latest = ckpt.latest(verify_hashes=True)
    assert latest is not None
    assert latest.path == ckpt.root / "step-000000123"
    assert (latest.step, latest.job_id, latest.restart_count) == (123, "4242", 2)
    assert abs(latest.time - time.time()) < 60
    assert latest.files["model.bin"].size == 7
    assert latest.files["model.bin"].sha256 == hashlib.sha256(b"weights").hexdigest()
    assert set(latest.files) == {"model.bin", "sub/rng.json"}
    assert ckpt.resume_step() == 123


def test_failed_block_leaves_nothing_behind(tmp_path: Path) -> None:
    ckpt = CheckpointDir(tmp_path)
    _write(ckpt, 1)
    with pytest.raises(RuntimeError, match="boom"), ckpt.writing(2) as tmp:
        (tmp / "model.bin").write_bytes(b"half")
        raise RuntimeError("boom")
    assert _files(ckpt) == ["step-000000001"]
    assert ckpt.resume_step() == 1


def test_latest_skips_torn_and_mismatched_checkpoints(tmp_path: Path) -> None:
    ckpt = CheckpointDir(tmp_path)
    _write(ckpt, 1, b"good")
    _write(ckpt, 2, b"truncated later")
    _write(ckpt, 3, b"same size")
    (tmp_path / step_name(4)).mkdir()  # no manifest: a torn or hand-made directory
    (tmp_path / step_name(4) / "model.bin").write_bytes(b"x")
    (tmp_path / step_name(2) / "model.bin").write_bytes(b"short")
    # Corrupted, same size: only a hash check sees it.
    (tmp_path / step_name(3) / "model.bin").write_bytes(b"same SIZE")
    latest = ckpt.latest()
    assert latest is not None and latest.step == 3
    verified = ckpt.latest(verify_hashes=True)
    assert verified is not None and verified.step == 1
    # A manifest that names another step, or is not JSON, is not complete either.
    manifest = tmp_path / step_name(3) / MANIFEST
    manifest.write_text(manifest.read_text().replace('"step": 3', '"step": 7'))
    (tmp_path / step_name(1) / MANIFEST).write_text("{not json")
    assert ckpt.latest() is None


def test_writer_killed_mid_write_leaves_previous_checkpoint_latest(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    ckpt = CheckpointDir(root)
    _write(ckpt, 0)
    marker = tmp_path / "in-step-1"
    pid = _start_trainer(root, tmp_path / "trainer.log", block_in=1, marker=marker)
    poll("the trainer to be inside step 1's write", marker.exists, timeout=15)
    _kill(pid)
    torn = Path(marker.read_text())
    assert torn.is_dir() and (torn / "weights.bin").exists()
    latest = ckpt.latest()
    assert latest is not None and latest.step == 0
    # The writer's PID is gone on this host: its temporary directory goes at once.
    assert ckpt.prune(keep=1) == [torn]
    assert _files(ckpt) == ["step-000000000"]


def test_trainer_killed_at_arbitrary_moments_always_resumes_from_a_complete_step(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ck"
    ckpt = CheckpointDir(root)
    steps_seen: list[int] = []
    for run in range(3):
        before = ckpt.resume_step()
        target = (before or 0) + 3 + run
        pid = _start_trainer(root, tmp_path / f"trainer{run}.log")

        def reached(target: int = target) -> bool:
            return (ckpt.resume_step() or 0) >= target

        poll(f"run {run} to checkpoint step {target}", reached, timeout=30)
        _kill(pid)
        step_dirs = [p for p in root.iterdir() if p.name.startswith("step-")]
        # Every step-* directory is complete: a kill never leaves a torn one in place.
        assert all(ckpt.load(p, verify_hashes=True) for p in step_dirs)
        latest = ckpt.latest(verify_hashes=True)
        assert latest is not None and latest.step >= target
        assert json.loads((latest.path / "opt" / "state.json").read_text()) == {"step": latest.step}
        steps_seen.append(latest.step)
        ckpt.prune(keep=2)
        assert not [p for p in root.iterdir() if p.name.startswith(TMP_PREFIX)]
    assert steps_seen == sorted(steps_seen)
    # Each run resumed after the previous one's last step: the steps form one sequence.
    assert [c.step for c in ckpt.checkpoints()] == [steps_seen[-1] - 1, steps_seen[-1]]


def test_prune_keeps_newest_and_removes_stale_temporaries(tmp_path: Path) -> None:
    ckpt = CheckpointDir(tmp_path)
    for step in (1, 2, 3, 10):
        _write(ckpt, step)
    live = tmp_path / f"{TMP_PREFIX}000000011.{os.uname().nodename.split('.')[0]}.{os.getpid()}.ab"
    live.mkdir()
    old = tmp_path / f"{TMP_PREFIX}000000009.otherhost.1.cd"
    old.mkdir()
    (old / "model.bin").write_bytes(b"x")
    an_hour_ago = time.time() - 7200
    for path in (old / "model.bin", old):
        os.utime(path, (an_hour_ago, an_hour_ago))
    (tmp_path / step_name(20)).mkdir()  # incomplete: removed, never counted as latest
    removed = ckpt.prune(keep=2)
    assert removed == sorted(
        [tmp_path / step_name(1), tmp_path / step_name(2), old, tmp_path / step_name(20)]
    )
    assert _files(ckpt) == [live.name, "step-000000003", "step-000000010"]
    assert ckpt.prune(keep=1) == [tmp_path / step_name(3)]
    assert ckpt.resume_step() == 10
    with pytest.raises(CheckpointError, match="keep at least 1"):
        ckpt.prune(keep=0)


def test_bad_input_gives_one_line_errors_naming_path_and_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEDIC_CHECKPOINT_DIR", raising=False)
    with pytest.raises(CheckpointError, match="set MEDIC_CHECKPOINT_DIR"):
        CheckpointDir()
    monkeypatch.setenv("MEDIC_CHECKPOINT_DIR", str(tmp_path / "from-env"))
    assert CheckpointDir().root == tmp_path / "from-env"
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(CheckpointError, match=f"{a_file}: not a directory"):
        CheckpointDir(a_file)
    ckpt = CheckpointDir(tmp_path / "ck")
    _write(ckpt, 5)
    with pytest.raises(CheckpointError, match="step 5 is already checkpointed; write a later"):
        _write(ckpt, 5)
    with pytest.raises(CheckpointError, match="expected an integer >= 0"):
        _write(ckpt, -1)
    with pytest.raises(CheckpointError, match="only regular files"), ckpt.writing(6) as tmp:
        (tmp / "link").symlink_to(a_file)
    with pytest.raises(CheckpointError, match="reserved"), ckpt.writing(7) as tmp:
        (tmp / MANIFEST).write_text("{}")
    assert ckpt.resume_step() == 5
    assert not [p for p in ckpt.root.iterdir() if p.name.startswith(TMP_PREFIX)]


def test_restart_count_is_zero_on_the_first_run() -> None:
    assert restart_count({}) == 0
    assert restart_count({"SLURM_RESTART_COUNT": "3"}) == 3


def test_cli_commit_latest_prune(tmp_path: Path) -> None:
    runner = CliRunner()
    root = tmp_path / "ck"
    result = runner.invoke(ckpt, ["latest", "--dir", str(root)])
    assert result.exit_code == 1 and "no complete checkpoint in" in result.output
    for step in (1, 2, 3):
        src = tmp_path / f"src{step}"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "w.bin").write_bytes(b"w" * step)
        args = ["commit", str(src), "--step", str(step), "--dir", str(root)]
        result = runner.invoke(ckpt, [*args, "--move"] if step == 3 else args)
        assert result.exit_code == 0, result.output
        assert result.output.strip() == str(root / step_name(step))
    assert (tmp_path / "src1" / "sub" / "w.bin").exists()  # copied
    assert not (tmp_path / "src3").exists()  # moved
    result = runner.invoke(ckpt, ["latest", "--json"], env={"MEDIC_CHECKPOINT_DIR": str(root)})
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert (info["step"], info["files"], info["bytes"]) == (3, 1, 3)
    result = runner.invoke(ckpt, ["latest", "--verify", "--dir", str(root)])
    assert result.output.strip() == str(root / step_name(3))
    result = runner.invoke(ckpt, ["prune", "--keep", "1", "--dir", str(root)])
    assert result.exit_code == 0
    assert result.output.splitlines() == [
        f"removed {root / step_name(1)}",
        f"removed {root / step_name(2)}",
    ]
    result = runner.invoke(
        ckpt, ["commit", str(tmp_path / "src1"), "--step", "3", "--dir", str(root)]
    )
    assert result.exit_code == 1
    assert "step 3 is already checkpointed" in result.output
    result = runner.invoke(ckpt, ["latest"], env={"MEDIC_CHECKPOINT_DIR": ""})
    assert result.exit_code == 1 and "set MEDIC_CHECKPOINT_DIR" in result.output


# --- a failed commit never loses the source (hardening item 7) ----------------------------------


def _job_files(src: Path) -> dict[str, bytes]:
    (src / "optim").mkdir(parents=True)
    files = {"model.pt": b"m" * 4096, "optim/state.pt": b"o" * 1024, "optim/step.txt": b"41"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    return files


def _tree(src: Path) -> dict[str, bytes]:
    return {
        p.relative_to(src).as_posix(): p.read_bytes()
        for p in src.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


@pytest.mark.parametrize("where", ["link", "optim/link", "linked_dir"])
@pytest.mark.parametrize("move", [True, False])
def test_a_symlink_in_the_source_refuses_the_commit_and_touches_nothing(
    tmp_path: Path, where: str, move: bool
) -> None:
    """`medic ckpt commit DIR --step N --move` with a symlink inside DIR printed an error and
    left DIR empty: the model and optimizer files were gone (moved into the temporary
    directory, which the failed commit then removed)."""
    src, root = tmp_path / "src", tmp_path / "ck"
    files = _job_files(src)
    target = tmp_path / ("elsewhere" if where == "linked_dir" else "elsewhere.bin")
    if where == "linked_dir":
        target.mkdir()
    else:
        target.write_bytes(b"t")
    if move or where == "linked_dir":
        (src / where).symlink_to(target)
    else:
        (src / where).symlink_to(tmp_path / "dangling")  # a copy follows links: a dead one
    args = ["commit", str(src), "--step", "5", "--dir", str(root)]
    result = CliRunner().invoke(ckpt, [*args, "--move"] if move else args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {src / where}: "), result.output
    assert "nothing was " in lines[0]
    assert _tree(src) == files  # every byte still there
    assert (src / where).is_symlink()
    assert not root.exists() or not list(root.iterdir())


def test_a_copy_follows_a_symlink_to_a_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = _job_files(src)
    (tmp_path / "shared.bin").write_bytes(b"s" * 10)
    (src / "shared.bin").symlink_to(tmp_path / "shared.bin")
    made = CheckpointDir(tmp_path / "ck").commit(src, 1)
    assert set(made.files) == {*files, "shared.bin"}
    assert not (made.path / "shared.bin").is_symlink()


COMMIT_WITH_A_FULL_DISK = """
import resource, signal, sys
sys.dont_write_bytecode = True  # a .pyc written under the limit would be cut short for all
from cli.main import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))  # the manifest no longer fits
sys.argv = ["medic", "ckpt", "commit", sys.argv[1], "--step", "7", "--dir", sys.argv[2], "--move"]
main()
"""


def test_a_move_that_fails_at_the_manifest_puts_every_file_back(tmp_path: Path) -> None:
    """A real write failure after the files were moved (the manifest cannot be written, as
    on a full disk): they go back to SRC and the error is one line."""
    src, root = tmp_path / "src", tmp_path / "ck"
    files = _job_files(src)
    done = proc.run(
        [sys.executable, "-c", COMMIT_WITH_A_FULL_DISK, str(src), str(root)],
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "cannot commit step 7 (File too large)" in lines[0]
    assert _tree(src) == files
    assert list(root.iterdir()) == []  # no step, no temporary directory left
    made = CheckpointDir(root).commit(src, 7, move=True)  # and it can be committed again
    assert set(made.files) == set(files) and not src.exists()


def test_a_move_that_loses_the_race_for_its_step_puts_every_file_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits the same step while ours moves its files in: the rename
    fails, and the files go back."""
    import shutil

    src, root = tmp_path / "src", tmp_path / "ck"
    files = _job_files(src)
    other = tmp_path / "other"
    other.mkdir()
    (other / "w").write_bytes(b"theirs")
    real_move = shutil.move

    def move_then_lose(a: str, b: str) -> object:
        moved = real_move(a, b)
        if not (root / step_name(3)).exists():
            CheckpointDir(root).commit(other, 3)  # the other writer wins the step
        return moved

    monkeypatch.setattr(shutil, "move", move_then_lose)
    with pytest.raises(CheckpointError, match="another writer may have committed it"):
        CheckpointDir(root).commit(src, 3, move=True)
    monkeypatch.undo()
    assert _tree(src) == files
    assert _files(CheckpointDir(root)) == [step_name(3)]
    assert CheckpointDir(root).load(root / step_name(3)) is not None


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="needs root and setpriv"
)
def test_commit_into_a_directory_the_job_cannot_write_is_one_line() -> None:
    """As an unprivileged user (root writes anywhere): PermissionError was a traceback.
    The user runs the installed wheel's `medic` (tests/installed.py), as on a node."""
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="medic-ckpt-"))
    try:
        work.chmod(0o755)
        src = work / "src"
        files = _job_files(src)
        for path in [src, *src.rglob("*")]:
            os.chown(path, 65534, 65534)
        root = work / "root-only"
        root.mkdir(mode=0o755)
        argv = [
            "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            str(installed_medic().command("medic")),
            "ckpt", "commit", str(src), "--step", "1", "--dir", str(root),
        ]  # fmt: skip
        for move in ([], ["--move"]):
            done = proc.run([*argv, *move], timeout=60, cwd=work, env={"PATH": "/usr/bin:/bin"})
            assert done.returncode == 1, done.stderr
            assert done.stderr.strip() == (
                f"Error: {root}: cannot create a checkpoint there (Permission denied); point "
                "MEDIC_CHECKPOINT_DIR (or --dir) at a directory you can write"
            )
            assert _tree(src) == files
    finally:
        shutil.rmtree(work, ignore_errors=True)

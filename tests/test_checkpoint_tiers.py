"""The node-local checkpoint tier (slurm_hooks/checkpoint/node_local.py, LocalTier): commit
locally, drain to the durable directory in the background, resume from the newest verified
copy."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from slurm_hooks.checkpoint import (
    DURABLE,
    LOCAL,
    LOCAL_CAP_ENV,
    LOCAL_ENV,
    MANIFEST,
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    step_name,
)
from slurm_hooks.checkpoint import commit as commit_points
from tests.conftest import poll

COMMIT_POINTS = ["local:written", "local:synced", "local:manifest", "local:renamed"]
DRAIN_POINTS = [
    "durable:copying",
    "durable:copied",
    "durable:written",
    "durable:synced",
    "durable:manifest",
    "durable:renamed",
]


# The library registers a job's node-local directory in the heartbeat directory: not in this
# machine's real one (a missing directory: one line on stderr, the job goes on).
PROGRESS = {"MEDIC_PROGRESS_DIR": "/nonexistent/medic-progress"}


class Crash(BaseException):
    """Stands for the process dying at an injected point (not an Exception: nothing that
    handles errors catches it)."""


@pytest.fixture
def fault() -> Iterator[Callable[[Callable[[str], None] | None], None]]:
    def set_fault(hook: Callable[[str], None] | None) -> None:
        commit_points._fault = hook

    yield set_fault
    commit_points._fault = None


def tiers(tmp_path: Path, **kwargs: object) -> CheckpointDir:
    return CheckpointDir(tmp_path / "durable", local=tmp_path / "local", env={}, **kwargs)  # type: ignore[arg-type]


def write(ckpt: CheckpointDir, step: int, size: int = 1000) -> None:
    with ckpt.writing(step) as tmp:
        (tmp / "model.bin").write_bytes(bytes([step % 256]) * size)
        (tmp / "optim").mkdir()
        (tmp / "optim" / "state.bin").write_bytes(b"o" * 10 + str(step).encode())


def verified(found: Checkpoint) -> bool:
    """`found` matches its manifest's sizes and sha256, read afresh."""
    reader = CheckpointDir(found.path.parent, local=False, env={})
    return reader.load(found.path, verify_hashes=True) is not None


def durable_steps(tmp_path: Path) -> list[int]:
    reader = CheckpointDir(tmp_path / "durable", local=False, env={})
    return [c.step for c in reader.checkpoints(verify_hashes=True)]


def local_steps(tmp_path: Path) -> list[int]:
    reader = CheckpointDir(tmp_path / "local", local=False, env={})
    return [c.step for c in reader.checkpoints(verify_hashes=True)]


# ---- commit, drain, resume -----------------------------------------------------------------


def test_commit_drains_in_background_and_latest_prefers_local(tmp_path: Path) -> None:
    ckpt = tiers(tmp_path)
    for step in range(3):
        write(ckpt, step)
    assert ckpt.drain(timeout=30) == [0, 1, 2]
    assert durable_steps(tmp_path) == [0, 1, 2] and local_steps(tmp_path) == [0, 1, 2]
    found = ckpt.latest()
    assert found is not None and found.step == 2 and found.tier == LOCAL
    assert found.path == tmp_path / "local" / step_name(2)
    assert found.read_s is not None and found.read_s >= 0
    assert found.to_json()["tier"] == LOCAL
    # The drained copy keeps its commit's times, and the ledger names it once durable.
    durable = CheckpointDir(tmp_path / "durable", local=False, env={})
    assert durable.load(tmp_path / "durable" / step_name(2)).time == found.time  # type: ignore[union-attr]
    assert [r.step for r in durable.ledger()] == [0, 1, 2]
    assert not list((tmp_path / "local").glob(".medic-ledger*"))


def test_requeued_to_another_node_resumes_from_durable(tmp_path: Path) -> None:
    write(ckpt := tiers(tmp_path), 5)
    ckpt.drain(timeout=30)
    elsewhere = CheckpointDir(tmp_path / "durable", local=tmp_path / "other-node", env={})
    found = elsewhere.latest()
    assert found is not None and (found.step, found.tier) == (5, DURABLE) and verified(found)


def test_the_stall_is_the_local_write_only(tmp_path: Path, fault: Callable[..., None]) -> None:
    release = threading.Event()
    fault(lambda point: release.wait(30) if point == "durable:copied" else None)
    ckpt = tiers(tmp_path)
    write(ckpt, 1)  # returns while its drain is held
    assert local_steps(tmp_path) == [1] and durable_steps(tmp_path) == []
    found = ckpt.latest()
    assert found is not None and (found.step, found.tier) == (1, LOCAL)
    with pytest.raises(CheckpointError, match=r"steps \[1\] are not durable") as exc:
        ckpt.drain(timeout=0.2)
    assert "\n" not in str(exc.value)
    release.set()
    assert ckpt.drain(timeout=30) == [1]
    assert durable_steps(tmp_path) == [1]


def test_a_step_is_refused_when_either_tier_has_it(tmp_path: Path) -> None:
    ckpt = tiers(tmp_path, background_drain=False)
    write(ckpt, 1)
    with pytest.raises(CheckpointError, match="already checkpointed"):
        write(ckpt, 1)
    ckpt.drain()
    shutil.rmtree(tmp_path / "local" / step_name(1))
    with pytest.raises(CheckpointError, match="already checkpointed"):
        write(ckpt, 1)


def test_a_second_drainer_of_the_same_step_is_no_error(tmp_path: Path) -> None:
    first = tiers(tmp_path, background_drain=False)
    write(first, 3)
    second = tiers(tmp_path, background_drain=False)  # the job's epilog step, say
    assert second.drain() == [3]
    assert first.drain() == [3]
    assert durable_steps(tmp_path) == [3]


def test_without_a_local_tier_nothing_changes(tmp_path: Path) -> None:
    ckpt = CheckpointDir(tmp_path / "durable", env={})
    assert ckpt.local is None and ckpt.drain() == []
    write(ckpt, 0)
    found = ckpt.latest()
    assert found is not None and found.tier == DURABLE and durable_steps(tmp_path) == [0]


# ---- torn copies -----------------------------------------------------------------------


def _truncate(path: Path) -> None:
    with open(path / "model.bin", "r+b") as f:
        f.truncate(10)


def _drop_manifest(path: Path) -> None:
    (path / MANIFEST).unlink(missing_ok=True)


def _flip_a_byte(path: Path) -> None:
    data = bytearray((path / "model.bin").read_bytes())
    data[0] ^= 0xFF
    (path / "model.bin").write_bytes(bytes(data))


@pytest.mark.parametrize("tear", [_truncate, _drop_manifest, _flip_a_byte])
def test_a_torn_local_copy_loses_to_a_complete_durable_one(
    tmp_path: Path, tear: Callable[[Path], None]
) -> None:
    ckpt = tiers(tmp_path)
    write(ckpt, 7)
    ckpt.drain(timeout=30)
    tear(tmp_path / "local" / step_name(7))
    found = tiers(tmp_path).latest()
    assert found is not None and (found.step, found.tier) == (7, DURABLE) and verified(found)


def test_a_torn_newer_local_step_falls_back_to_the_older_complete_one(tmp_path: Path) -> None:
    ckpt = tiers(tmp_path, background_drain=False)
    write(ckpt, 1)
    write(ckpt, 2)
    _flip_a_byte(tmp_path / "local" / step_name(2))
    found = ckpt.latest()
    assert found is not None and (found.step, found.tier) == (1, LOCAL)
    with pytest.raises(CheckpointError, match="does not match its node-local manifest"):
        ckpt.drain()  # the altered step never becomes durable
    assert durable_steps(tmp_path) == [1]


# ---- a kill at each step of the commit and of the drain -----------------------------------


@pytest.mark.parametrize("point", COMMIT_POINTS + DRAIN_POINTS)
def test_a_kill_at_any_point_never_leaves_an_unverified_latest(tmp_path: Path, point: str) -> None:
    """A child process commits step 0 and drains it, then commits step 1 and is SIGKILLed at
    `point` (the second time it passes `durable:copying`: between two files)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            passes = {"n": 0}

            def die(at: str) -> None:
                if at == point:
                    passes["n"] += 1
                    if at != "durable:copying" or passes["n"] == 2:
                        os.kill(os.getpid(), signal.SIGKILL)

            ckpt = tiers(tmp_path)
            write(ckpt, 0)
            ckpt.drain(timeout=30)
            passes["n"] = 0
            commit_points._fault = die
            write(ckpt, 1)
            ckpt.drain(timeout=30)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    after = tiers(tmp_path, background_drain=False)
    found = after.latest()
    assert found is not None and verified(found)
    assert found.step >= max(durable_steps(tmp_path))
    assert found.step == (0 if point in COMMIT_POINTS[:3] else 1)
    # The restarted run drains what the killed one left, and prune clears its debris.
    after.drain()
    assert durable_steps(tmp_path)[-1] == found.step
    after.prune(keep=1, stale_after=0)
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == [step_name(found.step)]


# ---- the cap ---------------------------------------------------------------------------


def test_a_write_over_the_cap_fails_naming_cap_and_setting(tmp_path: Path) -> None:
    ckpt = tiers(tmp_path, local_cap=3100, background_drain=False)  # three 1,011-byte steps
    for step in range(3):
        write(ckpt, step)
    with pytest.raises(CheckpointError) as exc:
        write(ckpt, 3)  # nothing is durable yet: nothing may be evicted
    message = str(exc.value)
    assert "3100" in message and LOCAL_CAP_ENV in message and "\n" not in message
    assert local_steps(tmp_path) == [0, 1, 2]
    assert not [p for p in (tmp_path / "local").iterdir() if p.name.startswith(".tmp")]
    assert ckpt.latest().step == 2  # type: ignore[union-attr]
    ckpt.drain()
    write(ckpt, 3)  # now the oldest durable step makes room
    assert local_steps(tmp_path) == [1, 2, 3]
    assert durable_steps(tmp_path) == [0, 1, 2]


def test_the_cap_from_the_environment(tmp_path: Path) -> None:
    env = {LOCAL_ENV: str(tmp_path / "shm"), LOCAL_CAP_ENV: "2K", "SLURM_JOB_ID": "77", **PROGRESS}
    ckpt = CheckpointDir(tmp_path / "durable", env=env)
    assert ckpt.local is not None and ckpt.local.cap == 2048
    assert ckpt.local.root.parent == tmp_path / "shm" / "job-77"
    assert stat.S_IMODE((tmp_path / "shm").stat().st_mode) == 0o1777
    assert stat.S_IMODE((tmp_path / "shm" / "job-77").stat().st_mode) & 0o077 == 0
    for bad in ("lots", "0", "-5G", "1.5G"):
        with pytest.raises(CheckpointError, match=LOCAL_CAP_ENV) as exc:
            CheckpointDir(tmp_path / "durable", env={**env, LOCAL_CAP_ENV: bad})
        assert "\n" not in str(exc.value)


def test_a_planted_or_open_local_directory_is_refused(tmp_path: Path) -> None:
    env = {LOCAL_ENV: str(tmp_path / "shm"), "SLURM_JOB_ID": "9", **PROGRESS}
    (tmp_path / "shm").mkdir(mode=0o1777)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "shm" / "job-9").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="must be a real directory"):
        CheckpointDir(tmp_path / "durable", env=env)
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(CheckpointError, match="no one else may write"):
        CheckpointDir(tmp_path / "durable", local=tmp_path / "open", env={})
    os.symlink(tmp_path / "elsewhere", tmp_path / "linked-base")
    with pytest.raises(CheckpointError, match="not a safe base"):
        CheckpointDir(tmp_path / "durable", env={**env, LOCAL_ENV: str(tmp_path / "linked-base")})
    os.chmod(tmp_path / "shm", 0o777)  # open to all, not sticky
    with pytest.raises(CheckpointError, match="not a safe base"):
        CheckpointDir(tmp_path / "durable", env={**env, "SLURM_JOB_ID": "10"})


# ---- prune -----------------------------------------------------------------------------


def test_prune_keeps_the_newest_durable_step_and_every_undrained_one(tmp_path: Path) -> None:
    ckpt = tiers(tmp_path, background_drain=False)
    write(ckpt, 0)
    write(ckpt, 1)
    ckpt.drain()
    write(ckpt, 2)
    write(ckpt, 3)  # 2 and 3 are node-local only
    report = ckpt.prune_report(keep=1)
    assert durable_steps(tmp_path) == [1]  # the newest durable step stays
    assert local_steps(tmp_path) == [2, 3]  # 2 is not durable: kept though keep=1
    assert (tmp_path / "local" / step_name(2), f"not durable in {tmp_path / 'durable'} yet") in (
        report.kept
    )
    ckpt.drain()
    ckpt.prune(keep=1)
    assert durable_steps(tmp_path) == [3] and local_steps(tmp_path) == [3]


# ---- random histories ------------------------------------------------------------------


class TierHistory(RuleBasedStateMachine):
    """Writes, drains, crashes at any injected point, torn local copies, restarts and prunes,
    in any order. Invariant: latest() is a complete step that matches its hashes, never
    older than the newest step a drain reported durable, and the local tier keeps its cap."""

    CAP = 5000

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="medic-tiers-"))
        self.next_step = 0
        self.newest_durable = -1
        self.ckpt = self._open()

    def _open(self) -> CheckpointDir:
        return CheckpointDir(
            self.tmp / "durable",
            local=self.tmp / "local",
            local_cap=self.CAP,
            background_drain=False,
            env={},
        )

    @rule(size=st.integers(0, 2000))
    def write(self, size: int) -> None:
        self.next_step += 1
        try:
            write(self.ckpt, self.next_step, size)
        except CheckpointError as exc:
            assert "over its cap" in str(exc)

    @rule()
    def drain(self) -> None:
        try:
            durable = self.ckpt.drain()
        except CheckpointError:
            return  # a torn node-local step cannot drain; the invariant still holds
        if durable:
            self.newest_durable = max(self.newest_durable, *durable)

    @rule(point=st.sampled_from(COMMIT_POINTS + DRAIN_POINTS))
    def crash(self, point: str) -> None:
        def die(at: str) -> None:
            if at == point:
                raise Crash(point)

        commit_points._fault = die
        try:
            if point.startswith("local"):
                self.next_step += 1
                write(self.ckpt, self.next_step)
            else:
                self.ckpt.drain()
        except (Crash, CheckpointError):
            pass
        finally:
            commit_points._fault = None
        self.ckpt = self._open()  # the job restarts

    @rule(which=st.integers(0, 100), drop_manifest=st.booleans())
    def tear_local(self, which: int, drop_manifest: bool) -> None:
        steps = sorted((self.tmp / "local").glob("step-*"))
        if steps:
            (_drop_manifest if drop_manifest else _truncate)(steps[which % len(steps)])

    @rule(keep=st.integers(1, 3))
    def prune(self, keep: int) -> None:
        self.ckpt.prune(keep=keep)

    @invariant()
    def latest_is_verified_and_not_older_than_durable(self) -> None:
        found = self.ckpt.latest()
        if self.newest_durable >= 0:
            assert found is not None and found.step >= self.newest_durable
        if found is not None:
            assert verified(found)
        local = self.tmp / "local"
        used = sum(p.stat().st_size for p in local.rglob("*") if p.is_file() and p.name != MANIFEST)
        assert used <= self.CAP

    def teardown(self) -> None:
        commit_points._fault = None
        shutil.rmtree(self.tmp, ignore_errors=True)


TierHistory.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_tier_history = TierHistory.TestCase


def test_poll_waits_for_a_background_drain(tmp_path: Path) -> None:
    ckpt = tiers(tmp_path)
    write(ckpt, 4)
    poll("step 4 durable", lambda: durable_steps(tmp_path) == [4])
    assert ckpt.drain(timeout=30) == [4]

"""The node-local tier's lifecycle (slurm_hooks.local_tier): the epilog's sweep removes a
job's node-local copies when it ends for good, never on a requeue, and root removes nothing
a planted symlink or someone else's file points it at."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from medic_core import proc
from slurm_hooks import local_tier
from slurm_hooks.checkpoint import LOCAL_ENV, CheckpointDir
from slurm_hooks.native.build import build_hook
from tests.conftest import poll
from tests.fakes import FakeSlurm, SlurmJob

NODE = "n1"
NOBODY = 65534


def slurm(**states: str) -> FakeSlurm:
    fake = FakeSlurm()
    for job_id, state in states.items():
        fake.jobs_[job_id[1:]] = SlurmJob(job_id[1:], state=state, user="root")
    return fake


def job_dir(tmp_path: Path, job_id: str, node: str = NODE) -> Path:
    """A job's node-local directory with a step in it, registered as the library does."""
    env = {
        LOCAL_ENV: str(tmp_path / "shm"),
        "SLURM_JOB_ID": job_id,
        "SLURMD_NODENAME": node,
        "MEDIC_PROGRESS_DIR": str(progress(tmp_path)),
    }
    ckpt = CheckpointDir(tmp_path / "durable" / job_id, env=env, background_drain=False)
    assert ckpt.local is not None
    with ckpt.writing(1) as tmp:
        (tmp / "model.bin").write_bytes(b"x" * 100)
    ckpt.drain(30)
    return ckpt.local.root.parent


def progress(tmp_path: Path) -> Path:
    path = tmp_path / "progress"
    path.mkdir(mode=0o1733, exist_ok=True)
    return path


def sweep(tmp_path: Path, client: FakeSlurm, ending: str | None = None) -> local_tier.Swept:
    return local_tier.sweep(client, progress(tmp_path), NODE, ending, wait=0.0, poll=0.01)


def test_each_durable_directory_has_its_own_local_directory(tmp_path: Path) -> None:
    """Two ranks of one job, each with its durable directory: rank 1 requeued onto the node
    where rank 0 wrote finds none of rank 0's steps (it resumes from its own durable)."""
    env = {LOCAL_ENV: str(tmp_path / "shm"), "SLURM_JOB_ID": "40"}
    env["MEDIC_PROGRESS_DIR"] = str(progress(tmp_path))
    rank0 = CheckpointDir(tmp_path / "rank-0", env=env, background_drain=False)
    with rank0.writing(7) as tmp:
        (tmp / "w").write_text("rank 0")
    rank0.drain(30)
    rank1 = CheckpointDir(tmp_path / "rank-1", env=env, background_drain=False)
    with rank1.writing(6) as tmp:
        (tmp / "w").write_text("rank 1")
    rank1.drain(30)
    assert rank0.local is not None and rank1.local is not None
    assert rank0.local.root != rank1.local.root
    assert rank0.local.root.parent == rank1.local.root.parent == tmp_path / "shm" / "job-40"
    found = CheckpointDir(tmp_path / "rank-1", env=env).latest()
    assert found is not None and (found.path / "w").read_text() == "rank 1"


def test_the_library_registers_its_job_directory(tmp_path: Path) -> None:
    root = job_dir(tmp_path, "41")
    registration = progress(tmp_path) / f"41.{NODE}.local-tier"
    assert registration.read_text().strip() == str(root)
    assert root.name == "job-41" and local_tier.has_registration(progress(tmp_path), "41", NODE)


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", None])
def test_a_job_ended_for_good_loses_its_local_copies(tmp_path: Path, state: str | None) -> None:
    root = job_dir(tmp_path, "42")
    client = slurm(j42=state) if state else slurm()  # None: purged, Slurm no longer knows it
    done = sweep(tmp_path, client, "42")
    assert done.removed == [root] and not root.exists()
    assert not local_tier.has_registration(progress(tmp_path), "42", NODE)
    assert (tmp_path / "durable" / "42" / "step-000000001").is_dir()  # durable untouched


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "COMPLETING", "REQUEUE_HOLD"])
def test_a_requeued_or_live_job_keeps_them(tmp_path: Path, state: str) -> None:
    root = job_dir(tmp_path, "43")
    done = sweep(tmp_path, slurm(j43=state), "43")
    assert done.removed == [] and list(root.glob("d-*/step-000000001"))
    assert local_tier.has_registration(progress(tmp_path), "43", NODE)


def test_the_sweep_waits_for_the_ending_job_to_leave_completing(tmp_path: Path) -> None:
    root = job_dir(tmp_path, "44")
    client = slurm(j44="COMPLETING")
    looks = []

    def jobs(ids: object = None) -> list[object]:
        looks.append(1)
        if len(looks) == 3:
            client.jobs_["44"].state = "COMPLETED"
        return [j.info() for j in client.jobs_.values()]

    client.jobs = jobs  # type: ignore[method-assign]
    done = local_tier.sweep(client, progress(tmp_path), NODE, "44", wait=30, poll=0.01)
    assert done.removed == [root] and len(looks) == 3


def test_slurm_not_answering_keeps_everything(tmp_path: Path) -> None:
    root = job_dir(tmp_path, "45")
    client = slurm(j45="COMPLETED")
    client.fail("jobs")
    done = sweep(tmp_path, client, "45")
    assert done.removed == [] and root.is_dir() and "cannot read the jobs" in done.kept[0][1]


def test_other_nodes_and_old_runs_here_are_swept_by_any_epilog(tmp_path: Path) -> None:
    old = job_dir(tmp_path, "46")  # requeued away from this node earlier, since ended
    other = job_dir(tmp_path, "47", node="n2")  # another lab node on the same host
    live = job_dir(tmp_path, "48")
    done = sweep(tmp_path, slurm(j46="COMPLETED", j47="COMPLETED", j48="RUNNING"))
    assert done.removed == [old] and other.is_dir() and live.is_dir()


# ---- hostile input: root must remove nothing the job's user could not -------------------------


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.mkdir(exist_ok=True)
    (path / "precious").write_text("keep me")
    return path


def test_a_symlink_inside_the_job_directory_is_unlinked_not_followed(tmp_path: Path) -> None:
    root = job_dir(tmp_path, "50")
    (root / "escape").symlink_to(victim(tmp_path))
    [step] = root.glob("d-*/step-000000001")
    (step / "escape").symlink_to(victim(tmp_path))
    done = sweep(tmp_path, slurm(j50="COMPLETED"))
    assert done.removed == [root] and (victim(tmp_path) / "precious").exists()


def test_the_job_directory_swapped_for_a_symlink_is_refused(tmp_path: Path) -> None:
    root = job_dir(tmp_path, "51")
    os.rename(root, tmp_path / "moved")
    root.symlink_to(victim(tmp_path))
    done = sweep(tmp_path, slurm(j51="COMPLETED"))
    assert done.removed == [] and "symlink" in done.kept[0][1]
    assert (victim(tmp_path) / "precious").exists() and root.is_symlink()


def test_a_symlink_anywhere_on_the_registered_path_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "job-52").mkdir(parents=True)
    (elsewhere / "job-52" / "precious").write_text("keep me")
    (tmp_path / "link").symlink_to(elsewhere)
    local_tier.register(progress(tmp_path), "52", NODE, tmp_path / "link" / "job-52")
    done = sweep(tmp_path, slurm(j52="COMPLETED"))
    assert done.removed == [] and "a symlink on the way" in done.kept[0][1]
    assert (elsewhere / "job-52" / "precious").exists()


@pytest.mark.parametrize("name", ["job-999", "not-a-job", "job-53/.."])
def test_a_registration_naming_another_directory_is_refused(tmp_path: Path, name: str) -> None:
    target = tmp_path / "shm" / "job-999"
    target.mkdir(parents=True)
    local_tier.register(progress(tmp_path), "53", NODE, tmp_path / "shm" / name)
    done = sweep(tmp_path, slurm(j53="COMPLETED"))
    assert done.removed == [] and target.is_dir()


def test_someone_elses_directory_or_file_is_refused(tmp_path: Path) -> None:
    root = job_dir(tmp_path, "54")
    os.chown(root, NOBODY, NOBODY)  # the job's user (root here) does not own it
    assert sweep(tmp_path, slurm(j54="COMPLETED")).removed == [] and root.is_dir()
    os.chown(root, 0, 0)
    planted = root / "planted"
    planted.write_text("someone else's")
    os.chown(planted, NOBODY, NOBODY)
    done = sweep(tmp_path, slurm(j54="COMPLETED"))
    assert done.removed == [] and planted.exists() and "owned by uid 65534" in done.kept[0][1]


def test_a_registration_by_another_user_than_the_jobs_is_refused(tmp_path: Path) -> None:
    root = job_dir(tmp_path, "55")
    os.chown(progress(tmp_path) / f"55.{NODE}.local-tier", NOBODY, NOBODY)
    done = sweep(tmp_path, slurm(j55="COMPLETED"))
    assert (
        done.removed == [] and root.is_dir() and "not written by the job's user" in str(done.kept)
    )


def test_a_base_open_to_all_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    root = job_dir(tmp_path, "56")
    os.chmod(root.parent, 0o777)
    done = sweep(tmp_path, slurm(j56="COMPLETED"))
    assert done.removed == [] and root.is_dir() and "not sticky" in done.kept[0][1]


# ---- the epilog -------------------------------------------------------------------------------


def test_the_compiled_front_hands_a_registered_job_to_the_python_epilog(tmp_path: Path) -> None:
    stand_in = tmp_path / "python-epilog"
    stand_in.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/handed-over\n')
    stand_in.chmod(0o755)
    front = build_hook(tmp_path / "bin", prolog=tmp_path / "python-prolog", epilog=stand_in)
    env = {
        "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
        "SLURM_JOB_ID": "60",
        "SLURMD_NODENAME": NODE,
        "MEDIC_SOCKET": str(tmp_path / "absent.sock"),
        "MEDIC_PROGRESS_DIR": str(progress(tmp_path)),
    }
    assert proc.run([str(front)], env=env, timeout=30).returncode == 0
    assert not (tmp_path / "handed-over").exists()  # nothing registered: no Python at all
    job_dir(tmp_path, "60")
    assert proc.run([str(front)], env=env, timeout=30).returncode == 0
    poll("the hand-over", (tmp_path / "handed-over").exists)
    assert (tmp_path / "handed-over").read_text().strip() == "--local-tier"


def test_the_python_epilog_starts_the_sweep_only_for_a_registered_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_hooks import epilog

    started: list[list[str]] = []
    monkeypatch.setattr(epilog.proc, "spawn", lambda argv, **kw: started.append(argv) or 1)
    conf = tmp_path / "medic.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n')
    for key, value in {
        "MEDIC_CONFIG": str(conf),
        "SLURM_JOB_ID": "61",
        "SLURMD_NODENAME": NODE,
        "MEDIC_PROGRESS_DIR": str(progress(tmp_path)),
        "MEDIC_SOCKET": str(tmp_path / "absent.sock"),
    }.items():
        monkeypatch.setenv(key, value)
    assert epilog.main(["--local-tier"]) == 0 and started == []
    job_dir(tmp_path, "61")
    assert epilog.main(["--local-tier"]) == 0
    assert started and started[0][1:] == ["-m", "slurm_hooks.local_tier", "--job", "61"]

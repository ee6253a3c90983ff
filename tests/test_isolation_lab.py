"""Single-GPU isolation on the lab's real slurmctld and slurmd 22.05: an XID on GPU 5 takes
that GPU out of n1's GRES, a 4-GPU job still starts there and never sees it, an 8-GPU job
cannot land there, and after the GPU's reset and re-qualification n1 offers 8 again."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab import isolate as lab_isolate
from cli.lab.cluster import Lab
from cli.lab.slurm_conf import with_check_options
from healthd.checks import registry
from medic_core.drain_book import DrainBook
from medic_core.drain_reason import format_reason
from medic_core.settings import IsolationSettings
from medic_core.slurm import CliSlurm
from medic_core.store import Store, open_store
from remediation import episodes as ep
from remediation.isolation import APPLIED, RESTORED, RESTORING, gres_count, recorded
from remediation.isolator import Isolator
from tests.conftest import poll


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


@pytest.fixture
def isolated_lab(lab: Lab) -> Iterator[Lab]:
    """The lab, given back with every node's 8 GPUs whatever the test left."""
    try:
        yield lab
    finally:
        keep_file = lab.layout.etc / "gres-keep.json"
        if keep_file.exists() and json.loads(keep_file.read_text()):
            for node in json.loads(keep_file.read_text()):
                lab_isolate.apply(lab, node, None)
            lab.reset()


def job_fields(lab: Lab, job_id: str) -> dict[str, str]:
    line = lab.slurm(["scontrol", "-d", "show", "job", "-o", job_id]).stdout
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


def allocated_files(lab: Lab, job_id: str, files: list[int]) -> list[int]:
    """The /dev/nvidiaN numbers of the job's GPUs: its GRES index list (scontrol show job
    -d: GRES=gpu:4(IDX:0-3)) through the node's File= list."""
    gres = job_fields(lab, job_id)["GRES"]
    indexes = lab_isolate.parse_keep(gres.split("IDX:")[1].split(")")[0], len(files))
    assert indexes is not None
    return [files[i] for i in indexes]


def test_an_xid_on_gpu5_leaves_seven_gpus_schedulable(
    isolated_lab: Lab, store: Store, tmp_path: Path
) -> None:
    lab = isolated_lab
    slurm = CliSlurm(env=lab.env(), timeout=15)
    python = str(Path(sys.executable))
    settings = IsolationSettings(
        enabled=True,
        apply=(python, "-m", "cli.lab.isolate", "--lab-root", str(lab.root),
               "--node", "{node}", "--keep", "{keep}"),
        settle_timeout=20.0,
    )  # fmt: skip
    episodes = ep.EpisodeStore(store)
    # What the fault path leaves behind an XID 94 on GPU 5: the GPU faulted (the lab's
    # NVML says so until it is reset), n1 drained with Medic's reason, an episode open.
    lab.inject("n1", 5, ["xid=94"])
    reason = format_reason("gpu.xid.94", "gpu5")
    DrainBook.of(store).record_drain("n1", reason, actor="daemon")  # Medic's drain, recorded
    slurm.drain("n1", reason)
    episode = episodes.open_episode(
        "n1", state=ep.WAITING_IDLE, fault_class="gpu.xid.94", target="5", check="gpu_xid",
        recommendation="gpu_reset", rung=1, message="XID 94 on GPU 5", evidence={},
    )  # fmt: skip
    isolator = Isolator("n1", episodes, slurm, settings)

    isolated = isolator.isolate(episode, gpus_total=8)
    assert isolated is not None
    record = recorded(isolated.evidence)
    assert record is not None and (record.gpus, record.state) == ((5,), APPLIED)
    node = slurm.node("n1")
    assert node is not None and gres_count(node.gres) == 7 and not node.drained

    # Jobs start on n1 and are never given GPU 5's device file: Slurm's GPU index i on n1
    # is the i-th file of its gres.conf File= list (nvidia0-4, nvidia6, nvidia7).
    files = [0, 1, 2, 3, 4, 6, 7]
    script = 'echo "CVD=$CUDA_VISIBLE_DEVICES JG=$SLURM_JOB_GPUS"; sleep 60'
    out = tmp_path / "seven.out"
    seven = lab.slurm(
        ["sbatch", "--parsable", "-w", "n1", "--gres=gpu:7", "-o", str(out), "--wrap", script]
    ).stdout.strip()
    poll("the 7-GPU job's output", lambda: out.exists() and "CVD=" in out.read_text())
    assert job_fields(lab, seven)["NodeList"] == "n1"
    assert allocated_files(lab, seven, files) == files
    # 22.05 numbers CUDA_VISIBLE_DEVICES and SLURM_JOB_GPUS by Slurm's index, 0-6: right
    # only where task/cgroup (ConstrainDevices=yes) leaves the job these 7 device files.
    assert out.read_text().split()[:2] == ["CVD=0,1,2,3,4,5,6", "JG=0,1,2,3,4,5,6"]
    lab.slurm(["scancel", seven])
    poll("n1 idle", lambda: not slurm.jobs_on("n1"))
    four = lab.slurm(
        ["sbatch", "--parsable", "-w", "n1", "--gres=gpu:4", "--wrap", script]
    ).stdout.strip()
    poll("the 4-GPU job running", lambda: job_fields(lab, four)["JobState"] == "RUNNING")
    assert job_fields(lab, four)["NodeList"] == "n1"
    four_files = allocated_files(lab, four, files)
    assert len(four_files) == 4 and 5 not in four_files

    # An 8-GPU job cannot land on n1: Slurm refuses it outright.
    eight = lab.slurm(["sbatch", "-w", "n1", "--gres=gpu:8", "--wrap", "true"], check=False)
    assert eight.returncode != 0
    assert "Requested node configuration is not available" in eight.stderr

    # The GPU's repair: the ladder's reset (the lab's stand-in for nvidia-smi -r).
    reset = lab.slurm(
        [python, "-m", "cli.lab.repair", "--lab-root", str(lab.root), "gpu-reset",
         "--node", "n1", "--gpu", "5"]
    )  # fmt: skip
    assert reset.returncode == 0
    # Re-qualified: back to 8 drains n1 first (a count change kills running jobs).
    restoring = isolator.restore(isolated, jobs_running=bool(slurm.jobs_on("n1")))
    assert recorded(restoring.evidence).state == RESTORING  # type: ignore[union-attr]
    node = slurm.node("n1")
    assert node is not None and node.drained and node.reason.startswith("medic:")
    assert job_fields(lab, four)["JobState"] == "RUNNING"  # drained, not killed
    lab.slurm(["scancel", four])
    poll("n1 idle", lambda: not slurm.jobs_on("n1"))
    restored = isolator.restore(restoring, jobs_running=False)
    assert recorded(restored.evidence).state == RESTORED  # type: ignore[union-attr]
    node = slurm.node("n1")
    assert node is not None and gres_count(node.gres) == 8 and not node.drained
    whole = lab.slurm(
        ["sbatch", "--parsable", "-w", "n1", "--gres=gpu:8", "--wrap", "sleep 30"]
    ).stdout.strip()
    poll("the 8-GPU job on n1", lambda: job_fields(lab, whole)["JobState"] == "RUNNING")
    assert "gpu:8(IDX:0-7)" in job_fields(lab, whole)["GRES"]


def daemon_config(lab: Lab, tmp_path: Path) -> Path:
    """The lab's medic.toml, every check every 2 s, isolation on with the lab's apply command.
    gpu_processes is off: the test holds GPU 5's reset with an injected process on it."""
    special = {"gpu_count": "expected_count = 8\n", "gpu_processes": "enabled = false\n"}
    options = {s.name: f"interval = 2\n{special.get(s.name, '')}" for s in registry()}
    apply = [sys.executable, "-m", "cli.lab.isolate", "--lab-root", str(lab.root),
             "--node", "{node}", "--keep", "{keep}"]  # fmt: skip
    extra = (
        "\n[remediation.isolation]\nenabled = true\nsettle_timeout = 20.0\n"
        f"apply = {json.dumps(apply)}\n"
    )
    path = tmp_path / "medic.toml"
    path.write_text(with_check_options(lab.layout.medic_conf.read_text(), options) + extra)
    return path


def test_the_daemon_isolates_gpu5_after_an_xid_and_gives_it_back_after_its_reset(
    isolated_lab: Lab, store: Store, tmp_path: Path
) -> None:
    """Through the daemon's own fault path: XID 95 injected on GPU 5 of n1, the ladder
    isolates it (n1 offers gpu:7, a 4-GPU job starts there without GPU 5, the prolog lets it
    in despite GPU 5's standing fault), then resets the GPU, re-qualifies it and restores
    gpu:8 once the job has ended."""
    lab = isolated_lab
    slurm = CliSlurm(env=lab.env(), timeout=15)
    episodes = ep.EpisodeStore(store)
    lab.start_healthd("n1", config=daemon_config(lab, tmp_path))
    poll("first round", lambda: bool(store.conditions("n1", type="gpu_count")), timeout=20)
    # A process on GPU 5 holds its reset ("only when no process holds it") until released.
    lab.inject("n1", 5, ["process=4242:64", "xid=95"])

    def state() -> str:
        found = episodes.find(node="n1")
        record = recorded(found[-1].evidence) if found else None
        return record.state if record else "none"

    def offers(count: int) -> bool:
        node = slurm.node("n1")
        return node is not None and gres_count(node.gres) == count and not node.drained

    poll("GPU 5 isolated, n1 back with 7", lambda: state() == APPLIED and offers(7), timeout=40)
    files = [0, 1, 2, 3, 4, 6, 7]
    four = lab.slurm(
        ["sbatch", "--parsable", "-w", "n1", "--gres=gpu:4", "--wrap", "sleep 120"]
    ).stdout.strip()
    poll("the 4-GPU job running", lambda: job_fields(lab, four)["JobState"] == "RUNNING")
    four_files = allocated_files(lab, four, files)
    assert len(four_files) == 4 and 5 not in four_files

    def gate() -> list[bool]:  # the prolog's decision for the job, as the daemon recorded it
        return [(e.evidence["allow"], e.evidence["status"])
                for e in store.events("n1", kind="gate")
                if e.target == f"job:{four}"]  # fmt: skip

    poll("the prolog's decision recorded", lambda: bool(gate()), timeout=20)  # 5 s linger
    assert gate() == [(True, "CRITICAL")]  # GPU 5's XID still stands: left out
    eight = lab.slurm(["sbatch", "-w", "n1", "--gres=gpu:8", "--wrap", "true"], check=False)
    assert "Requested node configuration is not available" in eight.stderr

    lab.inject("n1", 5, ["process=none"])  # the reset may run now
    poll("reset, re-qualified, draining to restore", lambda: state() == RESTORING, timeout=30)
    assert job_fields(lab, four)["JobState"] == "RUNNING"  # drained, not killed
    lab.slurm(["scancel", four])
    poll("n1 back with 8", lambda: state() == RESTORED and offers(8), timeout=40)
    # The record says RESTORED a moment before the episode's own state is written.
    poll("the episode resolved", lambda: episodes.find(node="n1")[-1].state == ep.RESOLVED)
    last = episodes.find(node="n1")[-1]
    assert last.state == ep.RESOLVED, last.message
    steps = episodes.steps(last.id)
    assert [s.action for s in steps] == ["gpu_reset"] and steps[-1].state == "done"

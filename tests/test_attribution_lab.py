"""Attribution on the lab (issue 22): one 8-GPU node shared by two resilient jobs, each
holding four GPUs (`--gres=gpu:4`), the node's real medic-healthd answering XIDs injected
into the simulated GPUs. A fault on a GPU requeues only the job that holds that GPU; a fault
whose repair takes the whole node (XID 79: reboot) requeues both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import Lab
from medic_core.slurm import parse_jobs
from medic_core.store import Store, open_store
from remediation import episodes as ep
from remediation import tickets
from tests.conftest import poll
from tests.test_defects_lab import admin_comment, in_service, job_actions, only_on, submit
from tests.test_remediation import fast_config, wait_closed

pytestmark = pytest.mark.lab


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def gpus_of(lab: Lab, job_id: str, node: str) -> frozenset[int]:
    """The GPU indices Slurm gave the job on `node`, as Medic reads them (squeue --json)."""
    out = lab.slurm(["squeue", "--json", "-j", job_id]).stdout
    [info] = [j for j in parse_jobs(out) if j.job_id == job_id]
    return info.gpus_by_node.get(node, frozenset())


def state(lab: Lab, job_id: str) -> str:
    out = lab.slurm(["squeue", "--json", "-j", job_id]).stdout
    return next(j for j in parse_jobs(out) if j.job_id == job_id).state


def four_gpu_job(lab: Lab, tmp_path: Path, name: str) -> tuple[str, Path]:
    """A resilient job on n1 holding four GPUs; `marks` gets one line per run of its script."""
    marks = tmp_path / f"{name}.runs"
    job_id = submit(
        lab, "--resilient=3", "--gres=gpu:4", only_on(lab, "n1"), f"--job-name={name}",
        "--wrap", f"echo run >> {marks}; sleep 600",
    )  # fmt: skip
    return job_id, marks


def runs(marks: Path) -> int:
    return len(marks.read_text().splitlines()) if marks.exists() else 0


def test_a_gpu_fault_requeues_only_the_job_holding_that_gpu(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    lab.start_healthd("n1")
    first, first_runs = four_gpu_job(lab, tmp_path, "first")
    second, second_runs = four_gpu_job(lab, tmp_path, "second")
    poll("both jobs run", lambda: runs(first_runs) == 1 and runs(second_runs) == 1, timeout=60)
    low, high = gpus_of(lab, first, "n1"), gpus_of(lab, second, "n1")
    assert len(low) == len(high) == 4 and not low & high, (low, high)

    # XID 13 (RESTART_APP, an application's fault) on a GPU of the second job: only it
    # restarts, nothing is drained, no episode opens.
    lab.inject("n1", max(high), ["xid=13"])
    poll("the second job requeued", lambda: "requeued" in job_actions(store, "n1", second),
         timeout=20)  # fmt: skip
    assert "requeued off n1 (gpu.xid.13)" in admin_comment(lab, second)
    assert job_actions(store, "n1", first) == [] and "requeued" not in admin_comment(lab, first)
    assert state(lab, first) == "RUNNING" and runs(first_runs) == 1
    assert in_service(lab, "n1")
    assert ep.EpisodeStore(store).find(node="n1") == []
    poll("the second job runs again", lambda: runs(second_runs) == 2, timeout=60)

    # XID 94 (a contained memory error: RESTART_APP) on the first job's second GPU, with
    # the row remap it leaves pending: only the first job restarts; the GPU is reset (the
    # remap applied) while the second job runs on, and the node is given back.
    gpu = sorted(gpus_of(lab, first, "n1"))[1]
    lab.inject("n1", gpu, ["xid=94", "remap.uncorrectable=1", "remap.pending=1"])
    poll("the first job requeued", lambda: "requeued" in job_actions(store, "n1", first),
         timeout=20)  # fmt: skip
    assert "requeued off n1 (gpu.xid.94)" in admin_comment(lab, first)
    assert state(lab, second) == "RUNNING" and runs(second_runs) == 2
    episode = wait_closed(store, "n1", timeout=60)
    assert (episode.state, episode.fault_class, episode.target) == (
        ep.RESOLVED, "gpu.remap.pending", str(gpu),
    )  # fmt: skip
    steps = ep.EpisodeStore(store).steps(episode.id)
    assert [(s.action, s.state) for s in steps] == [("gpu_reset", "done")]
    assert steps[0].argv[-1] == str(gpu) or str(gpu) in " ".join(steps[0].argv)
    assert state(lab, second) == "RUNNING" and runs(second_runs) == 2  # never stopped
    poll("n1 back in service", lambda: in_service(lab, "n1"), timeout=20)
    poll("the first job runs again", lambda: runs(first_runs) == 2, timeout=60)

    # XID 79 (fallen off the bus: NVIDIA's RESTART_BM) takes the node: both jobs requeued.
    low = gpus_of(lab, first, "n1")
    before = {j: len(job_actions(store, "n1", j)) for j in (first, second)}
    lab.inject("n1", min(low), ["xid=79"])
    poll(
        "both jobs requeued",
        lambda: all(len(job_actions(store, "n1", j)) > before[j] for j in (first, second)),
        timeout=20,
    )
    assert "requeued off n1 (gpu.xid.79)" in admin_comment(lab, first)
    assert "requeued off n1 (gpu.xid.79)" in admin_comment(lab, second)
    poll("n1 drained", lambda: not in_service(lab, "n1"), timeout=10)


def test_a_link_flap_never_counts_toward_a_gpus_rma(lab: Lab, store: Store, tmp_path: Path) -> None:
    """A fresh node, the lemon rule at its tightest (2 episodes): an InfiniBand port goes
    down and comes back by itself (an episode, no repair), then GPU 2 reports a double-bit
    ECC error. The link is another component of another family: the DBE starts at the GPU's
    reset, no RMA ticket is opened, and the reset repairs it."""
    conf = fast_config(lab, tmp_path, extra="")
    text = conf.read_text().replace("[remediation]\n", "[remediation]\nlemon_episodes = 2\n", 1)
    conf.write_text(text)
    lab.start_healthd("n3", config=conf)
    poll("first round", lambda: bool(store.conditions("n3", type="ib")), timeout=20)
    port = lab.node("n3").host_root / "sys/class/infiniband/mlx5_4/ports/1/state"
    up = port.read_text()
    port.write_text("1: DOWN\n")
    episodes = ep.EpisodeStore(store)
    poll("the link's episode", lambda: bool(episodes.find(node="n3")), timeout=30)
    port.write_text(up)
    flap = wait_closed(store, "n3", timeout=60)
    assert (flap.fault_class, flap.state) == ("ib.port.down", ep.RESOLVED), flap.message

    lab.inject("n3", 2, ["ecc.dbe=1"])
    poll("the DBE's episode", lambda: len(episodes.find(node="n3")) == 2, timeout=30)
    dbe = episodes.find(node="n3")[-1]
    assert dbe.target == "2" and dbe.first_rung == 1, (dbe.fault_class, dbe.message)
    done = wait_closed(store, "n3", timeout=90)
    assert done.id == dbe.id and done.state == ep.RESOLVED, done.message
    assert [s.action for s in episodes.steps(done.id)] == ["gpu_reset"]
    assert tickets.list_tickets(store, node="n3") == []

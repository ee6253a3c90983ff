"""The lab on Slurm 24.11 (Debian 13's, run in a cached Debian root: cli/lab/debian_root.py):
up and down leave nothing behind, the README demo runs unchanged, a resilient job is requeued
off a GPU that fell off the bus with Slurm's restart counter, and `scontrol reboot ...
nextstate=RESUME` goes through the lab's RebootProgram. The root is built on first use
(~100 s), then cached."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import Lab, pid_alive, process_start
from cli.lab.debian_root import DebianRoot
from cli.lab.slurm_conf import LabSpec
from medic_core import proc
from tests.conftest import poll
from tests.lab_views import drained_by_medic, idle_and_clear, node_info

RELEASE = "24.11"
pytestmark = [pytest.mark.lab, pytest.mark.releases]


@pytest.fixture(scope="module")
def lab24() -> Iterator[Lab]:
    # A short directory: slurmstepd's Unix sockets live under each node's spool.
    with tempfile.TemporaryDirectory(prefix="r24-", dir="/tmp") as short:
        lab = Lab(Path(short) / "lab")
        lab.up(LabSpec(nodes=3, gpus_per_node=4, slurm=RELEASE), timeout=60)
        try:
            yield lab
        finally:
            lab.down()


@pytest.fixture
def lab(lab24: Lab) -> Lab:
    lab24.reset()
    return lab24


def _job_field(lab: Lab, job_id: str, field: str) -> str:
    out = lab.slurm(["scontrol", "show", "job", "-o", job_id]).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith(f"{field}=")), "")


def test_the_lab_runs_the_release_asked_for(lab: Lab) -> None:
    assert lab.slurm(["scontrol", "version"]).stdout.split()[-1].startswith(f"{RELEASE}.")
    # Medic's own client, from the host, reads it through the lab's wrappers.
    done = proc.run([sys.executable, "-m", "cli.main", "node", "show", "n1"], timeout=60,
                    env=lab.process_env("n1"))  # fmt: skip
    assert done.ok, done.describe_failure()
    assert "Slurm did not answer" not in done.stdout + done.stderr


def test_a_resilient_job_is_requeued_off_an_xid_and_slurm_counts_the_restart(lab: Lab) -> None:
    for name in ("n1", "n2", "n3"):
        lab.start_healthd(name)
    job = lab.slurm(
        ["sbatch", "--parsable", "--resilient=2", "-N1", "--gpus-per-node=4",
         "--output=/dev/null", "--wrap", "sleep 300"]
    ).stdout.strip().split(";")[0]  # fmt: skip
    poll("the job to run", lambda: _job_field(lab, job, "JobState") == "RUNNING", 30)
    victim = _job_field(lab, job, "NodeList")
    assert _job_field(lab, job, "Comment").startswith("medic:resilient=2")  # cli_filter + SPANK
    lab.inject(victim, 1, ["xid=79"])
    poll(f"{victim} drained by Medic", lambda: drained_by_medic(lab, victim), 20)
    poll("the job's restart", lambda: _job_field(lab, job, "Restarts") == "1", 20)
    poll(
        "the job running again on another node",
        lambda: (
            _job_field(lab, job, "JobState") == "RUNNING"
            and _job_field(lab, job, "NodeList") != victim
        ),
        60,
    )
    # The ladder takes the node back by itself (XID 79: a reboot through Slurm).
    poll(f"{victim} back in service", lambda: idle_and_clear(node_info(lab, victim)), 90)


def test_scontrol_reboot_nextstate_resume_goes_through_the_reboot_program(lab: Lab) -> None:
    before = node_info(lab, "n3")
    old_pid = lab.nodes()[2].slurmd_pid
    assert old_pid is not None
    old_start = process_start(old_pid)
    lab.slurm(["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=medic: r24", "n3"])

    def rebooted() -> bool:
        node = node_info(lab, "n3")
        return node["boot_time"] != before["boot_time"] and idle_and_clear(node)

    poll("n3 to reboot and return to service", rebooted, timeout=60)
    assert "reboot issued" in node_info(lab, "n3")["reason"]  # Slurm's mark, kept after
    assert process_start(old_pid) != old_start
    assert (lab.layout.node("n3").dir / "reboot.log").exists()  # the RebootProgram ran


def test_down_leaves_no_mount_or_process_behind() -> None:
    root = DebianRoot.for_release(RELEASE)
    with tempfile.TemporaryDirectory(prefix="r24d-", dir="/tmp") as short:
        small = Lab(Path(short) / "small")
        small.up(LabSpec(nodes=2, gpus_per_node=2, slurm=RELEASE))
        pids = small.daemon_pids()
        assert len(pids) == 4 and all(pid_alive(p) for p in pids)
        assert root.mounts_left()
        small.slurm(["sbatch", "-N2", "--output=/dev/null", "--wrap", "sleep 300"])
        poll("the job's processes to start", lambda: len(small.tagged_pids()) > len(pids))
        small.down()
        assert small.tagged_pids() == []
        assert not any(pid_alive(p) for p in pids)
        assert str(small.root) not in root._users()
        if not root._users():  # another lab on this root (a test worker's) keeps its mounts
            assert root.mounts_left() == []


def test_the_readme_demo_runs_unchanged_on_24_11() -> None:
    with tempfile.TemporaryDirectory(prefix="demo-", dir="/tmp") as short:
        done = proc.run(
            [sys.executable, "-m", "cli.lab.demo", "--dir", str(Path(short) / "demo"),
             "--slurm", RELEASE],
            timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, done.describe_failure() + done.stdout[-3000:]
    out = done.stdout
    assert f"Slurm {RELEASE}, 5 nodes x 8 GPUs" in out
    assert "medic: gpu.xid.79" in out  # drained with Medic's reason
    assert "restarts=1" in out  # the job's second start
    assert "equals an uninterrupted run's: True" in out
    assert "repaired and re-qualified: resumed" in out  # the ladder, by itself
    assert "Slurm did not answer" not in out  # `medic node show` from the host reached 24.11
    assert out.rstrip().endswith("is down")

"""The lab on Slurm 24.11 (Debian 13's) and 26.05 (Debian sid's), each run in a cached Debian
root (cli/lab/debian_root.py): up and down leave nothing behind, the README demo runs
unchanged, a resilient job is requeued off a GPU that fell off the bus with Slurm's restart
counter, and `scontrol reboot ... nextstate=RESUME` goes through the lab's RebootProgram.
A root is built on first use (100-280 s), then cached."""

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

RELEASES = ("24.11", "26.05")
pytestmark = [pytest.mark.lab, pytest.mark.releases]


@pytest.fixture(scope="module", params=RELEASES)
def release_lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    # A short directory: slurmstepd's Unix sockets live under each node's spool.
    with tempfile.TemporaryDirectory(prefix="rel-", dir="/tmp") as short:
        lab = Lab(Path(short) / "lab")
        lab.up(LabSpec(nodes=3, gpus_per_node=4, slurm=request.param), timeout=60)
        try:
            yield lab
        finally:
            lab.down()


@pytest.fixture
def lab(release_lab: Lab) -> Lab:
    release_lab.reset()
    return release_lab


def _slurm_version(lab: Lab) -> tuple[int, int]:
    """(major, minor) of the Slurm the lab runs, as `scontrol version` prints it."""
    major, minor = lab.slurm(["scontrol", "version"]).stdout.split()[-1].split(".")[:2]
    return int(major), int(minor)


def _job_field(lab: Lab, job_id: str, field: str) -> str:
    out = lab.slurm(["scontrol", "show", "job", "-o", job_id]).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith(f"{field}=")), "")


def test_the_lab_runs_the_release_asked_for(lab: Lab) -> None:
    assert lab.slurm(["scontrol", "version"]).stdout.split()[-1].startswith(f"{lab.release()}.")
    # Medic's own client, from the host, reads it through the lab's wrappers.
    done = proc.run([sys.executable, "-m", "cli.main", "node", "show", "n1"], timeout=60,
                    env=lab.process_env("n1"))  # fmt: skip
    assert done.ok, done.describe_failure()
    assert "Slurm did not answer" not in done.stdout + done.stderr


def test_a_resilient_job_is_requeued_off_an_xid_and_slurm_counts_the_restart(lab: Lab) -> None:
    for name in ("n1", "n2", "n3"):
        lab.start_healthd(name)
    submitted = lab.slurm(
        ["sbatch", "--parsable", "--resilient=2", "-N1", "--gpus-per-node=4",
         "--output=/dev/null", "--wrap", "sleep 300"]
    )  # fmt: skip
    assert "error" not in submitted.stderr, submitted.stderr  # 26.05: "Invalid --requeue ..."
    job = submitted.stdout.strip().split(";")[0]
    assert _job_field(lab, job, "Requeue") == "1"  # cli_filter's bare --requeue
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
    lab.slurm(["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=medic: reboot test", "n3"])

    def rebooted() -> bool:
        node = node_info(lab, "n3")
        return node["boot_time"] != before["boot_time"] and idle_and_clear(node)

    poll("n3 to reboot and return to service", rebooted, timeout=60)
    reason = node_info(lab, "n3")["reason"]
    if _slurm_version(lab) >= (26, 5):  # measured: 26.05 clears the reason on its return
        assert reason == ""
    else:  # 22.05 and 24.11 keep it, with Slurm's mark (medic_core.drain_book.SLURM_SUFFIXES)
        assert reason.startswith("medic: reboot test : reboot issued")
    assert process_start(old_pid) != old_start
    assert (lab.layout.node("n3").dir / "reboot.log").exists()  # the RebootProgram ran


def test_resume_keeps_the_drain_reason_on_24_11_only(lab: Lab) -> None:
    """Measured: after `state=resume` 24.11 keeps the node's reason on the node back in
    service; 22.05 (tests/test_lab_smoke.py) and 26.05 clear it. Medic takes a drain from the
    DRAIN flag, never from a reason alone (medic_core.drain_reason.drain_node)."""
    lab.slurm(["scontrol", "update", "nodename=n2", "state=drain", "reason=medic: probe"])
    assert drained_by_medic(lab, "n2")
    lab.slurm(["scontrol", "update", "nodename=n2", "state=resume"])
    poll("n2 idle again", lambda: idle_and_clear(node_info(lab, "n2")))
    kept = node_info(lab, "n2")["reason"]
    assert kept == ("medic: probe" if _slurm_version(lab)[:2] == (24, 11) else "")
    assert not drained_by_medic(lab, "n2")


@pytest.mark.parametrize("release", RELEASES)
def test_down_leaves_no_mount_or_process_behind(release: str) -> None:
    root = DebianRoot.for_release(release)
    with tempfile.TemporaryDirectory(prefix="reld-", dir="/tmp") as short:
        small = Lab(Path(short) / "small")
        small.up(LabSpec(nodes=2, gpus_per_node=2, slurm=release))
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


@pytest.mark.parametrize("release", RELEASES)
def test_the_readme_demo_runs_unchanged(release: str) -> None:
    with tempfile.TemporaryDirectory(prefix="demo-", dir="/tmp") as short:
        done = proc.run(
            [sys.executable, "-m", "cli.lab.demo", "--dir", str(Path(short) / "demo"),
             "--slurm", release],
            timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, done.describe_failure() + done.stdout[-3000:]
    out = done.stdout
    assert f"Slurm {release}, 5 nodes x 8 GPUs" in out
    assert "medic: gpu.xid.79" in out  # drained with Medic's reason
    assert "restarts=1" in out  # the job's second start
    assert "equals an uninterrupted run's: True" in out
    assert "repaired and re-qualified: resumed" in out  # the ladder, by itself
    assert "Slurm did not answer" not in out  # `medic node show` from the host reached it
    assert out.rstrip().endswith("is down")

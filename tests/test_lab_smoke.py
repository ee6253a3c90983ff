"""Each part of the lab is real: Slurm schedules jobs, scontrol drains, pynvml reads the
injected GPUs and receives XIDs, and a node reboots through RebootProgram."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cli.lab.cluster import Lab, LabError, pid_alive, process_start
from cli.lab.slurm_conf import LabSpec
from medic_core import proc
from tests.conftest import poll
from tests.lab_views import idle_and_clear
from tests.test_production_lab import wheel_venv

pytestmark = pytest.mark.lab  # every test here starts a lab or runs the demo


def _job_state(lab: Lab, job_id: str) -> str:
    out = lab.slurm(["scontrol", "show", "job", "-o", job_id]).stdout
    return out.split("JobState=", 1)[1].split()[0]


def _node(lab: Lab, name: str) -> dict[str, object]:
    return next(n for n in lab.sinfo_nodes() if n["name"] == name)


def test_three_node_gpu_batch_job_completes(lab: Lab, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    submitted = lab.slurm(
        [
            "sbatch",
            "--parsable",
            "-N3",
            "--gpus-per-node=8",
            f"--output={out}",
            "--wrap",
            "srun bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'",
        ],
    ).stdout.strip()
    poll("the job to complete", lambda: _job_state(lab, submitted) == "COMPLETED")
    lines = sorted(out.read_text().split("\n")[:-1])
    assert len(lines) == 3
    assert len({line.split()[0] for line in lines}) == 3
    assert all(line.endswith("0,1,2,3,4,5,6,7") for line in lines)


def test_drain_and_resume_are_seen_in_sinfo_json(lab: Lab) -> None:
    lab.slurm(["scontrol", "update", "nodename=n2", "state=drain", "reason=medic: smoke test"])
    node = _node(lab, "n2")
    assert "DRAIN" in node["state_flags"]  # type: ignore[operator]
    assert node["reason"] == "medic: smoke test"
    lab.slurm(["scontrol", "update", "nodename=n2", "state=resume"])
    # On resume slurmctld pings the node, flagging it NOT_RESPONDING until slurmd answers.
    poll("n2 to be idle again", lambda: idle_and_clear(_node(lab, "n2")))
    node = _node(lab, "n2")
    assert node["state"] == "idle"
    # Measured: 24.11 keeps the reason on a node back in service; 22.05 and 26.05 clear it.
    assert node["reason"] == ("medic: smoke test" if lab.release() == "24.11" else "")


def test_pynvml_on_a_lab_node_reads_gpus_and_receives_xid(
    lab: Lab, probes: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "registered"
    log = tmp_path / "probe.log"
    # srun puts the probe on n3 for real: slurmd gives it SLURMD_NODENAME=n3, which picks
    # n3's scenario; LD_LIBRARY_PATH comes from this (submitting) environment.
    pid = proc.spawn(
        [
            "srun",
            "-w",
            "n3",
            "-N1",
            str(lab.venv_bin / "python"),  # the node's Python: in a 24.11/26.05 lab, the root's
            str(probes / "nvml_xid_probe.py"),
            str(marker),
            "10",
        ],
        log_path=log,
        env=lab.process_env(),
    )
    poll("the probe to register for events", marker.exists, timeout=15)
    injected_at = time.time()
    lab.inject("n3", 2, ["xid=79"])
    poll("the probe to exit", lambda: not pid_alive(pid), timeout=15)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    gpus = records[0]["gpus"]
    assert len(gpus) == 8
    assert len({g["uuid"] for g in gpus}) == 8
    event = records[1]
    assert (event["xid"], event["gpu"]) == (79, 2)
    assert event["at"] - injected_at < 1.0


def test_node_reboot_through_reboot_program_returns_to_service(lab: Lab) -> None:
    before = _node(lab, "n4")
    old_pid = lab.nodes()[3].slurmd_pid
    assert old_pid is not None
    old_start = process_start(old_pid)
    lab.slurm(
        ["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=medic: smoke reboot", "n4"]
    )

    def rebooted() -> bool:
        node = _node(lab, "n4")
        return node["boot_time"] != before["boot_time"] and idle_and_clear(node)

    poll("n4 to reboot and return to service", rebooted, timeout=60)
    new_pid = lab.nodes()[3].slurmd_pid
    assert new_pid is not None and new_pid != old_pid
    # The pid alone could be a new process's by now (pids wrap; CI once saw exactly that).
    assert process_start(old_pid) != old_start


def test_down_leaves_no_process_behind() -> None:
    with tempfile.TemporaryDirectory(prefix="small-", dir="/tmp") as short:
        down_leaves_no_process_behind(Path(short) / "small")


def down_leaves_no_process_behind(root: Path) -> None:
    small = Lab(root)
    small.up(LabSpec(nodes=2, gpus_per_node=2))
    pids = small.daemon_pids()
    assert len(pids) == 4 and all(pid_alive(p) for p in pids)
    small.slurm(["sbatch", "-N2", "--wrap", "sleep 300"])
    poll("the job's processes to start", lambda: len(small.tagged_pids()) > len(pids))
    small.down()
    assert small.tagged_pids() == []
    assert not any(pid_alive(p) for p in pids)
    assert not small.layout.munge_socket.exists()


@pytest.mark.parametrize("production", [False, True], ids=["lab", "production"])
def test_the_readme_demo_tells_the_whole_story(production: bool) -> None:
    """README's first command, minus the install: a lab of its own, fault to repair. In a
    short directory, as README's is (a test worker's tmp_path is too long for slurmstepd's
    Unix sockets: the lab refuses it). In production mode (docs/lab.md) the same story from
    the built wheel, each daemon in the shipped unit's sandbox with a store of its own."""
    with tempfile.TemporaryDirectory(prefix="demo-", dir="/tmp") as short:
        done = proc.run(
            [sys.executable, "-m", "cli.lab.demo", "--dir", str(Path(short) / "demo")]
            # the wheel's venv the production-mode tests share (built once per tree state)
            + (["--production", "--venv", str(wheel_venv().parent)] if production else []),
            timeout=600,
        )
    assert done.returncode == 0, done.describe_failure() + done.stdout[-3000:]
    out = done.stdout
    if production:
        assert "(from the wheel in " in out and "in the unit's sandbox)" in out
    assert "medic: gpu.xid.79" in out  # drained with Medic's reason
    assert "restarts=1" in out  # the job's second start
    assert "equals an uninterrupted run's: True" in out
    assert "repaired and re-qualified: resumed" in out  # the ladder, by itself
    assert out.rstrip().endswith("is down")


def test_a_lab_dir_too_long_for_slurmstepds_sockets_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LabError, match=r"too long for slurmstepd's sockets.*use a shorter --dir"):
        Lab(tmp_path / ("x" * 70)).up()

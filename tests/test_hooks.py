"""The Slurm hooks and the daemon's response on the lab: real slurmctld/slurmd running
Medic's Prolog/Epilog/HealthCheckProgram wrappers, real medic-healthd per node, GPUs from
the NVML injection library."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.lab.cluster import Lab
from cli.lab.train import uninterrupted
from medic_core import proc
from medic_core.drain_reason import is_medic_reason
from medic_core.store import Store, open_store
from tests import lab_views
from tests.conftest import poll


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def node_state(lab: Lab, name: str) -> dict[str, Any]:
    return next(n for n in lab.sinfo_nodes() if n["name"] == name)


def drained_by_medic(lab: Lab, name: str) -> bool:
    node = node_state(lab, name)
    return "DRAIN" in node.get("state_flags", []) and is_medic_reason(node.get("reason", ""))


def job(lab: Lab, job_id: str) -> dict[str, Any]:
    return lab_views.job(lab, job_id)  # finished too, in 22.05's shape on every release


def submit(lab: Lab, *args: str) -> str:
    out = lab.slurm(["sbatch", "--parsable", *args]).stdout.strip()
    return out.split(";")[0]


def run_hook(lab: Lab, hook: str, node: str) -> proc.CommandResult:
    """Run a hook the way slurmd does: the lab's wrapper, SLURMD_NODENAME and nothing else."""
    return proc.run([str(lab.layout.bin_dir / hook)], timeout=60, env={"SLURMD_NODENAME": node})


def test_prolog_refuses_a_node_with_a_pre_existing_fault(lab: Lab, store: Store) -> None:
    # No daemon on n1: the prolog runs the launch tier itself and still catches the DBE.
    lab.inject("n1", 3, ["ecc.dbe=2"])
    out = lab.root / "where.txt"
    job_id = submit(lab, "-N1", f"--output={out}", "--wrap", "echo $SLURMD_NODENAME")

    poll("n1 drained by Medic's prolog", lambda: drained_by_medic(lab, "n1"), timeout=20)
    poll(f"job {job_id} done", lambda: job(lab, job_id)["job_state"] == "COMPLETED", timeout=40)
    ran_on = out.read_text().strip()
    assert ran_on != "n1"
    reason = node_state(lab, "n1")["reason"]
    assert reason.startswith("medic: gpu.ecc.dbe"), reason
    gates = [e for e in store.events("n1", kind="gate") if e.target == f"job:{job_id}"]
    assert gates and gates[0].evidence["allow"] is False
    assert gates[0].evidence["verdict_source"] == "inline"
    assert job(lab, job_id)["restart_cnt"] == 1


def test_resilient_job_survives_xid_79_from_its_last_checkpoint(lab: Lab, store: Store) -> None:
    for name in lab.node_names():
        lab.start_healthd(name)
    steps, pace = 30, 0.2

    work = lab.root / "train"
    work.mkdir()
    result = work / "result"
    python = lab.venv_bin / "python"  # the job's Python: in a 24.11/26.05 lab, the root's
    argv = [str(python), "-m", "cli.lab.train", str(work / "ckpt"), str(result)]
    script = work / "job.sh"
    script.write_text(
        f"#!/bin/sh\ncd {Path(__file__).parents[1]}\nexec {' '.join(argv)} {steps} {pace}\n"
    )
    job_id = submit(lab, "--resilient=2", "-N2", f"--output={work / 'out.txt'}", str(script))
    assert job(lab, job_id)["requeue"] is True

    def checkpoints() -> int:
        return len(list((work / "ckpt").glob("step-*")))

    poll("a few checkpoints", lambda: checkpoints() >= 5, timeout=30)
    nodes = lab.slurm(["scontrol", "show", "hostnames", job(lab, job_id)["nodes"]]).stdout
    victim = nodes.split()[1]  # not the batch host: any node of the job counts
    lab.inject(victim, 0, ["xid=79"])

    poll(f"{victim} drained", lambda: drained_by_medic(lab, victim), timeout=5)
    poll("the job requeued", lambda: job(lab, job_id)["restart_cnt"] == 1, timeout=10)
    poll("the job done", lambda: job(lab, job_id)["job_state"] == "COMPLETED", timeout=60)

    assert result.read_text() == uninterrupted(steps)  # bit for bit
    log = (work / "train.log").read_text().splitlines()
    assert len(log) == 2, log
    assert log[0].startswith("start step=0 restarts=0")
    resumed_at = int(log[1].split()[1].removeprefix("step="))
    assert resumed_at >= 5, log[1]
    assert "restarts=1" in log[1]
    # The ladder took the node from there: XID 79 is NVIDIA's RESTART_BM, so a reboot.
    from remediation.episodes import EpisodeStore

    [episode] = EpisodeStore(store).find(node=victim)
    assert (episode.fault_class, episode.first_rung) == ("gpu.xid.79", 3)
    actions = [e for e in store.events(victim, kind="job_action") if e.target == f"job:{job_id}"]
    assert {e.evidence["action"] for e in actions} == {"requeued", "made_eligible"}


def test_non_resilient_job_is_not_requeued(lab: Lab, store: Store) -> None:
    lab.start_healthd("n1")
    started = lab.root / "non-resilient.started"
    job_id = submit(lab, "-N1", "-w", "n1", "--wrap", f"touch {started}; sleep 600")
    # squeue says RUNNING before the prolog has passed; only the job's own mark proves it runs.
    poll("the job's script running", started.exists, timeout=10)
    lab.inject("n1", 5, ["xid=79"])
    poll("n1 draining", lambda: drained_by_medic(lab, "n1"), timeout=5)
    poll(
        "the job's admin comment",
        lambda: "not resilient" in (job(lab, job_id).get("admin_comment") or ""),
        timeout=5,
    )
    current = job(lab, job_id)
    assert current["job_state"] == "RUNNING"
    assert current["restart_cnt"] == 0


def test_admin_drain_is_never_touched(lab: Lab, store: Store) -> None:
    lab.slurm(["scontrol", "update", "nodename=n3", "state=drain", "reason=admin: fan noise"])
    lab.start_healthd("n3")
    lab.inject("n3", 1, ["xid=79"])
    poll("XID 79 seen", lambda: bool(store.conditions("n3", status="CRITICAL")), timeout=5)
    poll(
        "Medic's answer to the fault",
        lambda: bool(store.events("n3", kind="job_action")),
        timeout=5,
    )
    assert node_state(lab, "n3")["reason"] == "admin: fan noise"
    [action] = store.events("n3", kind="job_action")
    assert "not_ours" in action.message or "kept" in action.message

    # Clear the fault (a reboot clears XIDs) and let the health check run: still drained.
    lab.stop_healthd("n3")
    lab.reboot_node("n3")
    lab.start_healthd("n3")
    result = run_hook(lab, "medic-healthcheck", "n3")
    assert result.returncode == 0, result.stderr
    state = node_state(lab, "n3")
    assert "DRAIN" in state["state_flags"] and state["reason"] == "admin: fan noise"


def test_healthcheck_resumes_what_medic_drained_once_clean(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    # The ladder off: the daemon's drain is for an episode that waits for a human
    # (needs_human), which the health check never gives back, clean or not (issue 22).
    config = tmp_path / "medic.toml"
    text = lab.layout.medic_conf.read_text()
    config.write_text(text.replace("[remediation]\n", "[remediation]\nenabled = false\n", 1))
    # slurmd's HealthCheckProgram may run before the daemon answers the fault (a CI run: it
    # ran while the daemon started) and drain the node itself, with no episode: the
    # daemon's answer takes that drain over for the episode it opens (medic_core.drain_reason
    # take_over). That order made here, not left to slurmd's timer.
    lab.inject("n4", 2, ["nvlink.1=down"])
    result = run_hook(lab, "medic-healthcheck", "n4")
    assert drained_by_medic(lab, "n4"), result.stdout + result.stderr
    lab.start_healthd("n4", config=config)

    def taken_over() -> bool:
        record = store.open_drain("n4")
        return record is not None and record.episode_id is not None

    poll("the drain taken over by the daemon's episode", taken_over, timeout=10)
    result = run_hook(lab, "medic-healthcheck", "n4")
    assert result.returncode == 0, result.stderr
    assert drained_by_medic(lab, "n4"), "resumed while the NVLink is still down"

    lab.inject("n4", 2, ["nvlink.1=up"])
    result = run_hook(lab, "medic-healthcheck", "n4")
    assert "remediation episode" in result.stdout, result.stdout + result.stderr
    assert drained_by_medic(lab, "n4"), "a needs-human episode's node resumed by the health check"

    # The health check's own backstop drain (the daemon down), no episode: given back once
    # clean, the resume recorded with its actor.
    lab.slurm(["scontrol", "update", "nodename=n4", "state=resume"])
    lab.stop_healthd("n4")
    lab.inject("n4", 2, ["nvlink.1=down"])
    result = run_hook(lab, "medic-healthcheck", "n4")
    assert drained_by_medic(lab, "n4"), result.stdout + result.stderr
    lab.inject("n4", 2, ["nvlink.1=up"])
    lab.start_healthd("n4", config=config)
    result = run_hook(lab, "medic-healthcheck", "n4")
    assert "re-qualified" in result.stdout, result.stdout + result.stderr
    poll("n4 resumed", lambda: "DRAIN" not in node_state(lab, "n4")["state_flags"], timeout=10)
    [resume] = store.events("n4", kind="medic.resume")
    assert resume.evidence["actor"] == "hook" and resume.evidence["episode_id"] is None

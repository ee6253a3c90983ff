"""Burn-in on the lab (issue 14.5): a node whose daemon starts with no burn-in record is
drained `medic: burn-in ...`, a job asking for it waits, and once the (simulated) deep tier
passes Medic resumes the node and the job runs there.

The deep tier is the lab's dcgmi (cli/lab/dcgmi.py) behind a gate: a wrapper that waits for a
file the test creates, so the job is submitted while the burn-in is certainly under way (a
real `dcgmi diag -r 3` takes 10 minutes and more; the lab's takes well under a second)."""

from __future__ import annotations

import time
from pathlib import Path

from cli.lab.cluster import Lab
from medic_core.store import open_store
from remediation import burn_in as bi
from remediation.burn_in_runner import read_record
from tests.conftest import poll
from tests.lab_views import drained_by_medic, job, node_info


def burn_in_config(lab: Lab, tmp_path: Path, gate: Path) -> Path:
    tools = tmp_path / "tools"
    tools.mkdir()
    wrapper = tools / "dcgmi"
    real = lab.layout.tools_dir / "dcgmi"
    wrapper.write_text(
        "#!/bin/sh\n# the test's gate: the deep tier waits until the job was submitted\n"
        f'i=0; while [ ! -e "{gate}" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done\n'
        f'exec "{real}" "$@"\n'
    )
    wrapper.chmod(0o755)
    text = lab.layout.medic_conf.read_text()
    text = text.replace("new_node = []", 'new_node = ["deep_dcgm"]', 1)
    text = text.replace(f'search_dirs = ["{lab.layout.tools_dir}"]', f'search_dirs = ["{tools}"]')
    assert 'new_node = ["deep_dcgm"]' in text and str(tools) in text
    path = tmp_path / "medic.toml"
    path.write_text(text)
    return path


def test_a_fresh_node_is_burnt_in_before_its_first_job(lab: Lab, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    config = burn_in_config(lab, tmp_path, gate)
    started = time.monotonic()
    lab.start_healthd("n1", config=config)
    poll("n1 drained for burn-in", lambda: drained_by_medic(lab, "n1"), timeout=15)
    drained_after = time.monotonic() - started
    assert node_info(lab, "n1")["reason"] == "medic: burn-in node new_node: deep_dcgm"

    out = tmp_path / "where.txt"
    job_id = (
        lab.slurm(
            [
                "sbatch",
                "--parsable",
                "-w",
                "n1",
                f"--output={out}",
                "--wrap",
                "echo $SLURMD_NODENAME",
            ]
        )
        .stdout.strip()
        .split(";")[0]
    )
    poll(f"job {job_id} seen pending", lambda: job(lab, job_id)["job_state"] == "PENDING")
    # The burn-in holds n1 (its dcgmi waits at the gate): the job waits, drained out.
    assert drained_by_medic(lab, "n1")
    assert job(lab, job_id)["job_state"] == "PENDING" and not out.exists()

    gate.touch()
    opened = time.monotonic()

    def resumed() -> bool:
        info = node_info(lab, "n1")
        return "DRAIN" not in info.get("state_flags", [])

    poll("n1 resumed after its burn-in", resumed, timeout=30)
    resumed_after = time.monotonic() - opened
    poll(f"job {job_id} ran", lambda: job(lab, job_id)["job_state"] == "COMPLETED", timeout=30)
    assert out.read_text().strip() == "n1"
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        record = read_record(store, "n1")
        assert record is not None and record.phase is bi.Phase.PASSED, record
        assert record.checks == ("deep_dcgm",) and record.attempts == 1
        said = [e.message for e in store.events("n1", kind="remediation")]
    assert any("burn-in passed" in m for m in said), said
    print(f"\nburn-in lab: drained {drained_after:.2f}s after the daemon start, resumed"
          f" {resumed_after:.2f}s after the deep tier was let go")  # fmt: skip

"""Burn-in without the daemon, on the lab's real Slurm (issue 23, finding 4): with
`new_node = ["deep_dcgm"]` and the node's medic-healthd not running, the Prolog (the compiled
front, which finds no daemon and hands over to the Python prolog) refuses a job on a node
never burnt in: Medic's burn-in drain, the job not run. Once the daemon ran the burn-in and
wrote its pass into the state dir, a job runs there with the daemon stopped again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import Lab
from medic_core.drain_reason import is_burn_in_reason
from remediation.burn_in_marker import MARKER
from tests.conftest import poll
from tests.lab_views import job, node_info


@pytest.fixture
def burn_in_on(lab: Lab) -> Iterator[Path]:
    """The lab's medic.toml (the one every hook reads) with new_node burn-in on, put back
    after the test."""
    original = lab.layout.medic_conf.read_text()
    text = original.replace("new_node = []", 'new_node = ["deep_dcgm"]', 1)
    assert text != original
    lab.layout.medic_conf.write_text(text)
    try:
        yield lab.layout.medic_conf
    finally:
        lab.layout.medic_conf.write_text(original)


def submit(lab: Lab, node: str, out: Path) -> str:
    argv = [
        "sbatch",
        "--parsable",
        "-w",
        node,
        f"--output={out}",
        "--wrap",
        "echo $SLURMD_NODENAME ran",
    ]
    return lab.slurm(argv).stdout.strip().split(";")[0]


def prolog_log(lab: Lab, node: str) -> list[str]:
    """What slurmd logged of the node's prologs (their status; medic-prolog's own lines)."""
    log = lab.layout.node(node).slurmd_log
    text = log.read_text(errors="replace") if log.exists() else ""
    return [line for line in text.splitlines() if "rolog" in line or "medic" in line][-20:]


def test_a_job_on_a_node_never_burnt_in_is_refused_without_the_daemon_and_runs_after_the_pass(
    lab: Lab, burn_in_on: Path, tmp_path: Path
) -> None:
    assert not lab.healthd_pids()  # no daemon anywhere: the prolog judges alone
    marker = lab.layout.node("n1").state_dir / MARKER
    assert not marker.exists()

    first_out = tmp_path / "first.txt"
    first = submit(lab, "n1", first_out)

    def settled() -> bool:
        info = node_info(lab, "n1")
        drained = "DRAIN" in info.get("state_flags", []) and bool(info.get("reason"))
        return drained or job(lab, first)["job_state"] == "COMPLETED"

    poll("the first job refused or run", settled, timeout=30)
    assert job(lab, first)["job_state"] != "COMPLETED", "it ran on a node never burnt in"
    reason = node_info(lab, "n1")["reason"]
    # Medic's burn-in drain (not Slurm's "Prolog error"): the daemon, once it runs, burns the
    # node in and gives it back.
    assert is_burn_in_reason(reason) and "not passed" in reason, (reason, prolog_log(lab, "n1"))
    assert not first_out.exists()
    lab.slurm(["scancel", first])

    lab.start_healthd("n1", config=burn_in_on)

    def burnt_in() -> bool:
        return marker.exists() and "DRAIN" not in node_info(lab, "n1").get("state_flags", [])

    poll("n1 burnt in by its daemon and resumed", burnt_in, timeout=60)
    written = json.loads(marker.read_text())
    assert written["node"] == "n1" and written["checks"] == ["deep_dcgm"]
    lab.stop_healthd("n1")

    second_out = tmp_path / "second.txt"
    second = submit(lab, "n1", second_out)
    poll(f"job {second} ran", lambda: job(lab, second)["job_state"] == "COMPLETED", timeout=60)
    assert second_out.read_text().split() == ["n1", "ran"]

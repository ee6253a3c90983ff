"""`medic maintenance` on the lab (issue 26.7): a window on n1 starting in 30 s with a 15 s
lead; a resilient job running there is requeued before the start and runs again elsewhere, a
job that is not resilient is named and left; at the start n1 holds no requeued job and is in
Slurm's MAINT reservation, so Slurm starts nothing there that would run into the window."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.lab.cluster import Lab
from cli.main import medic
from tests.conftest import poll
from tests.lab_views import job
from tests.test_attribution_lab import runs
from tests.test_defects_lab import submit

pytestmark = pytest.mark.lab


def test_a_window_drains_its_nodes_in_time(lab: Lab, tmp_path: Path) -> None:
    marks = tmp_path / "runs"
    others = ",".join(n for n in lab.node_names() if n not in ("n1", "n2"))
    resilient = submit(
        lab, "--resilient=3", f"--exclude={others}", "--job-name=resilient",
        "--wrap", f"echo run $SLURMD_NODENAME >> {marks}; sleep 600",
    )  # fmt: skip
    poll("the resilient job runs", lambda: runs(marks) == 1, timeout=60)
    assert marks.read_text().split() == ["run", "n1"]  # Slurm's first free node
    started = time.monotonic()
    result = CliRunner().invoke(
        medic,
        ["maintenance", "--nodes", "n1", "--start", "+30s", "--duration", "10m",
         "--lead", "15s", "--name", "medic-maint-lab", "--config", str(lab.layout.medic_conf)],
    )  # fmt: skip
    took = time.monotonic() - started
    assert result.exit_code == 0, result.output
    print(result.output, f"(returned after {took:.1f}s)")
    assert "reservation medic-maint-lab: n1" in result.output
    assert f"job {resilient}: requeued" in result.output
    assert "window medic-maint-lab started: n1, no job on them" in result.output
    assert 28 <= took < 50
    shown = lab.slurm(["scontrol", "-o", "show", "reservation", "medic-maint-lab"]).stdout
    assert "MAINT" in shown and "Nodes=n1" in shown
    # The job restarts elsewhere (Slurm will not start it on n1: it would run into the window).
    poll("the job's second run", lambda: runs(marks) == 2, timeout=60)
    assert marks.read_text().split()[-1] == "n2"
    assert "maintenance medic-maint-lab" in job(lab, resilient)["admin_comment"]

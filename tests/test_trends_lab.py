"""Early warning on the lab: real slurmctld and slurmd, medic-healthd on the node, and
correctable ECC raised step by step on one simulated GPU. The trend drains the node after
its job (DRAINING: the job runs on and completes, neither requeued nor killed), with the
series in `medic node show`; then the ladder resets the GPU and gives the node back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.lab.cluster import Lab
from cli.node_commands import node
from medic_core.store import Store, open_store
from remediation import episodes as ep
from tests.conftest import poll
from tests.lab_views import drained_by_medic, job, node_info
from tests.test_defects_lab import (
    admin_comment,
    config,
    in_service,
    job_actions,
    only_on,
    submit,
    wait_episode,
)

# A lab-sized window: a sample a second, judged over 30 s once 4 points span 3 s.
TRENDS = "interval = 1\nwindow = 30\nmin_span = 3\nmin_points = 4"


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


class EccRamp:
    """Adds 5, 10, 20, ... correctable errors to one GPU, one step a second, while polled."""

    def __init__(self, lab: Lab, name: str, gpu: int) -> None:
        self.lab, self.name, self.gpu = lab, name, gpu
        self.steps, self.at = 0, 0.0

    def step(self) -> None:
        now = time.monotonic()
        if now - self.at >= 1.0:
            self.steps, self.at = self.steps + 1, now
            self.lab.inject(self.name, self.gpu, [f"ecc.sbe={5 * 2 ** (self.steps - 1)}"])


def test_rising_correctable_ecc_drains_after_the_job_which_finishes_untouched(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    conf = config(lab, tmp_path, checks={"gpu_trends": TRENDS})
    lab.start_healthd("n2", config=conf)
    started, finish = tmp_path / "started", tmp_path / "finish"
    job_id = submit(
        lab, "--resilient=2", only_on(lab, "n2"), "--wrap",
        f"touch {started}; while [ ! -e {finish} ]; do sleep 0.2; done",
    )  # fmt: skip
    poll(f"job {job_id} running", started.exists, timeout=60)

    ramp = EccRamp(lab, "n2", 3)

    def rising() -> bool:
        ramp.step()
        return drained_by_medic(lab, "n2")

    poll("n2 drained on the trend", rising, timeout=40)
    info = node_info(lab, "n2")
    assert info["reason"].startswith("medic: gpu.trend.ecc_corrected gpu3"), info["reason"]
    assert job(lab, job_id)["job_state"] == "RUNNING"  # DRAINING: the job runs on
    assert ramp.steps <= 8, f"{ramp.steps} steps before the warning"

    shown = CliRunner().invoke(node, ["show", "n2", "--config", str(conf)])
    assert shown.exit_code == 0, shown.output
    series = [line for line in shown.stdout.splitlines() if "correctable ECC:" in line]
    assert series and series[0].startswith("  GPU 3  correctable ECC: ") and "RISING" in series[0]

    finish.touch()
    poll("the job completed", lambda: job(lab, job_id)["job_state"] == "COMPLETED", timeout=30)
    done = job(lab, job_id)
    assert job_actions(store, "n2", job_id) == []  # no requeue, no note
    assert "requeued" not in admin_comment(lab, job_id)
    assert not done.get("restart_cnt"), done.get("restart_cnt")

    # Once idle the ladder takes the GPU: a reset (the counter back to 0: no spike), the
    # re-qualification, and the node back in service.
    episode = wait_episode(store, "n2", (ep.RESOLVED, ep.NEEDS_HUMAN, ep.RMA), timeout=60)
    assert episode.state == ep.RESOLVED, episode.message
    assert [s.action for s in ep.EpisodeStore(store).steps(episode.id)] == ["gpu_reset"]
    poll("n2 back in service", lambda: in_service(lab, "n2"), timeout=15)

    def quiet() -> bool:
        trend = [c for c in store.conditions("n2", type="gpu_trends") if c.target == "3"]
        return bool(trend) and str(trend[0].status) == "OK"

    # The reset started a new series: the rise before it does not drain the node again.
    poll("GPU 3's trend quiet after the reset", quiet, timeout=15)
    assert in_service(lab, "n2") and len(ep.EpisodeStore(store).find(node="n2")) == 1

"""Slurm's own drain adopted on the lab (issue 26.1): slurmctld's "Kill task failed" on n2
(set the way slurmctld stores it), the HealthCheckProgram run as slurmd runs it asks n2's
real medic-healthd to adopt it; the daemon records the drain as Medic's, keeps the stuck
tasks as evidence, reboots n2 through Slurm's RebootProgram, re-qualifies it and gives it
back. An admin's drain on n3 with the same words in other form is left alone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import Lab
from medic_core.store import Store, open_store
from remediation import episodes as ep
from tests.conftest import poll
from tests.test_defects_lab import in_service, run_hook
from tests.test_remediation import fast_config, wait_closed

pytestmark = pytest.mark.lab


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def test_a_kill_task_failed_node_is_adopted_rebooted_and_given_back(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    conf = fast_config(lab, tmp_path)
    for name in ("n2", "n3"):
        lab.start_healthd(name, config=conf)
    lab.slurm(["scontrol", "update", "nodename=n2", "state=drain", "reason=Kill task failed"])
    lab.slurm(["scontrol", "update", "nodename=n3", "state=drain", "reason=kill task failed!"])
    started = time.monotonic()
    checked = run_hook(lab, "medic-healthcheck", "n2")
    assert "Slurm's 'Kill task failed': adopted: episode" in checked.stdout, (
        checked.stdout + checked.stderr
    )
    episodes = ep.EpisodeStore(store)
    [adopted] = episodes.find(node="n2")
    assert adopted.fault_class == "slurm.kill_task_failed"
    assert "stuck_tasks" in adopted.evidence["findings"][0]["evidence"]
    record = store.drain_records("n2")[-1]
    assert (record.actor, record.reason) == ("ladder", "Kill task failed")
    done = wait_closed(store, "n2", timeout=120)
    healed = time.monotonic() - started
    assert done.state == ep.RESOLVED, done.message
    assert [(s.action, s.state) for s in episodes.steps(done.id)] == [("reboot", "done")]
    poll("n2 back in service", lambda: in_service(lab, "n2"), timeout=30)
    print(f"Kill task failed to back in service: {healed:.1f} s")

    # An admin's words, not slurmctld's: never adopted, never resumed.
    other = run_hook(lab, "medic-healthcheck", "n3")
    assert "adopt" not in other.stdout, other.stdout
    assert episodes.find(node="n3") == [] and not in_service(lab, "n3")

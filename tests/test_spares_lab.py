"""Hot spares on the lab's real Slurm 22.05 (issue 14.4): n2-n4 busy with exclusive jobs,
n5 the pool's spare (it joined after the deep tier through its own medic-healthd), a
resilient job on n1 and another job waiting for any node. XID 95 on n1: the job runs again
on n5 (its own reservation: the waiting job does not get it), and once the ladder has reset
n1's GPU and n1 passed the deep tier, n1 refills the pool instead of returning to general
service. bench/spares.py measures the same run against an idle cluster's requeue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.spares import BUSY, SPARE, VICTIM, pool, spares_config, submit
from cli.lab.cluster import Lab
from medic_core.store import Store, open_store
from remediation import episodes as ep
from tests.conftest import poll


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def test_a_faulted_job_runs_again_on_the_spare_and_the_repaired_node_refills_the_pool(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    conf = spares_config(lab, tmp_path / "medic.toml")
    lab.start_healthd(SPARE, config=conf)
    poll("n5 in the spare pool", lambda: pool(lab) == [SPARE], timeout=30)
    lab.start_healthd(VICTIM, config=conf)
    for name in BUSY:
        submit(lab, "--exclusive", "-N1", "-w", name, "--wrap", "sleep 600")
    mark = f'echo "$SLURMD_NODENAME" > {tmp_path}/run-${{SLURM_RESTART_COUNT:-0}}'
    job_id = submit(lab, "--resilient=2", "--exclusive", "-N1", "--wrap", f"{mark}; sleep 600")
    poll("the job running", (tmp_path / "run-0").exists, timeout=30)
    assert (tmp_path / "run-0").read_text().strip() == VICTIM  # the only node left
    waiting = submit(lab, "--exclusive", "-N1", "--wrap", "sleep 600")

    lab.inject(VICTIM, 5, ["xid=95"])
    poll("the job running again", (tmp_path / "run-1").exists, timeout=30)
    assert (tmp_path / "run-1").read_text().strip() == SPARE
    shown = lab.slurm(["squeue", "-h", "-j", f"{job_id},{waiting}", "-o", "%i %T %v"]).stdout
    assert f"{job_id} RUNNING medic-spare-{job_id}" in shown
    assert f"{waiting} PENDING" in shown  # the spare was the job's, not the queue's
    handed = [e for e in store.events(kind="spare") if e.evidence.get("action") == "handed"]
    assert [(e.node, e.target) for e in handed] == [(SPARE, f"job:{job_id}")]

    # The ladder resets n1's GPU; n1 passes the deep tier and joins the pool, not the queue.
    poll("the pool refilled with n1", lambda: pool(lab) == [VICTIM], timeout=60)
    episodes = ep.EpisodeStore(store)
    poll("n1's episode resolved", lambda: episodes.find(node=VICTIM)[-1].state == ep.RESOLVED,
         timeout=10)  # fmt: skip
    assert len(episodes.find(node=VICTIM)) == 1
    joined = [e for e in store.events(VICTIM, kind="spare") if e.evidence.get("action") == "joined"]
    assert joined and "deep tier" in joined[0].message
    assert "DRAIN" not in next(n for n in lab.sinfo_nodes() if n["name"] == VICTIM)["state_flags"]
    still = lab.slurm(["squeue", "-h", "-j", waiting, "-o", "%T"]).stdout.strip()
    assert still == "PENDING"  # n1 is a spare now: the waiting job does not get it either

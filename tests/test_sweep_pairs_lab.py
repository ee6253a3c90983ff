"""Pair tests through Slurm (issue 26.6): a lab of 6 nodes, n4's HCA slow (injected as the
lab injects its other faults, cli/lab/pair_tools.py); `medic sweep run --pairs` runs 2-node
jobs in rounds, names n4 and only n4, hands it to the ladder (drained with Medic's reason)
and gives every other node back; a node running a job and an admin's drain are never taken,
and a second named node meets the drain cap. Prints the rounds and the wall time."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.lab import pair_tools
from cli.lab.cluster import Lab
from cli.lab.slurm_conf import LabSpec
from medic_core import proc
from medic_core.store import open_store
from remediation import episodes as ep
from remediation.sweep.pairs import round_limit
from tests.conftest import poll
from tests.lab_views import drained_by_medic, idle_and_clear, node_info

pytestmark = pytest.mark.lab
NODES = 6
BUSY = ("allocated", "mixed")


@pytest.fixture(scope="module")
def six() -> Iterator[Lab]:
    # A short directory: a worker's tmp_path is too long for slurmstepd's Unix sockets.
    with tempfile.TemporaryDirectory(prefix="pairs-", dir="/tmp") as short:
        lab = Lab(Path(short) / "lab")
        lab.up(LabSpec(nodes=NODES, gpus_per_node=2), timeout=60)
        try:
            pair_tools.install(lab.layout, lab.venv_bin / "python")
            with lab.layout.medic_conf.open("a") as conf:
                conf.write(
                    "\n# The pair tests find the lab's stand-ins (cli/lab/pair_tools.py).\n"
                    "[sweep.pairs]\n"
                    f'probe = ["{lab.venv_bin / "medic"}", "sweep", "pair-probe"]\n'
                    f'search_dirs = ["{lab.layout.tools_dir}"]\n'
                    "default_min_allreduce_gbps = 400.0\n"
                    "default_min_ib_gbps = 300.0\n"
                    "timeout = 120.0\n"
                    "command_timeout = 60.0\n"
                    "connect_wait = 20.0\n"
                )
            yield lab
        finally:
            lab.down()


def test_a_pair_sweep_names_the_one_slow_node_of_6(six: Lab) -> None:
    lab = six
    pair_tools.set_link(lab.layout, "n4", ib_bw_gbps=96.0)  # a slow HCA: 1/4 of the rate
    started = time.monotonic()
    done = proc.run(
        [str(lab.venv_bin / "medic"), "sweep", "run", "--pairs", "--share", "1", "--json"],
        timeout=900,
        env=lab.process_env(),
    )
    wall = time.monotonic() - started
    assert done.ok, done.tail()
    report = json.loads(done.stdout)
    print(f"\npair sweep of {NODES}: {report['rounds']} rounds in {wall:.1f}s: {report['message']}")
    assert report["nodes"] == [f"n{i}" for i in range(1, NODES + 1)]
    assert list(report["bad"]) == ["n4"] and len(report["bad"]["n4"]) >= 2
    assert report["rounds"] <= round_limit(NODES)
    assert report["suspects"] == report["flaky"] == report["given_up"] == []
    slow = [r for r in report["results"] if r["outcome"] == "fail"]
    assert slow and all("n4" in r["pair"] for r in slow)
    assert all(r["measured"]["ib_bw_gbps"] == 96.0 for r in slow)
    assert all(r["outcome"] == "pass" for r in report["results"] if "n4" not in r["pair"])

    nodes = {n["name"]: n for n in lab.sinfo_nodes()}
    assert drained_by_medic(lab, "n4")
    assert str(nodes["n4"]["reason"]).startswith("medic: ib.pair_bandwidth"), nodes["n4"]
    for name in ("n1", "n2", "n3", "n5", "n6"):
        assert idle_and_clear(nodes[name]), nodes[name]
    reservations = lab.slurm(["scontrol", "show", "reservation"], check=False).stdout
    assert reservations.strip() == "No reservations in the system"
    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        # A slow HCA has no rung (the deep tier's findings neither): a human looks.
        [episode] = ep.EpisodeStore(store).find(node="n4")
        assert (episode.fault_class, episode.state) == ("ib.pair_bandwidth", ep.NEEDS_HUMAN)
        assert "n4" in report["handed"] and f"episode {episode.id}" in report["handed"]["n4"]
        assert all(ep.EpisodeStore(store).find(node=f"n{i}") == [] for i in (1, 2, 3, 5, 6))
        assert store.events("n1", kind="sweep")  # every pair's result is an event


def test_a_pair_sweep_leaves_busy_and_admin_drained_nodes_alone_and_keeps_the_cap(six: Lab) -> None:
    lab = six
    pair_tools.set_link(lab.layout, "n4")  # healed; n4 may still be drained by the test above
    capped = drained_by_medic(lab, "n4")
    pair_tools.set_link(lab.layout, "n3", allreduce_busbw_gbps=120.0)
    admin = "admin: cable swap"
    lab.slurm(["scontrol", "update", "nodename=n6", "state=drain", f"reason={admin}"])
    job = lab.slurm(["sbatch", "--parsable", "-w", "n2", "--wrap", "sleep 600"]).stdout.strip()
    try:
        poll("the job to run on n2", lambda: node_info(lab, "n2")["state"] in BUSY, 30)
        started = time.monotonic()
        done = proc.run(
            [str(lab.venv_bin / "medic"), "sweep", "run", "--pairs", "--share", "1", "--json"],
            timeout=900,
            env=lab.process_env(),
        )
        wall = time.monotonic() - started
        assert done.ok, done.tail()
        report = json.loads(done.stdout)
        print(f"\npair sweep, n2 busy, n6 drained: {report['rounds']} rounds in {wall:.1f}s")
        assert {"n2", "n6"}.isdisjoint(report["nodes"]) and "n3" in report["nodes"]
        assert list(report["bad"]) == ["n3"]
        assert report["rounds"] <= round_limit(len(report["nodes"]))
        assert all({"n2", "n6"}.isdisjoint(r["pair"]) for r in report["results"])
        if capped:  # n4, drained by the test above, is the cap's one node of 6
            assert "drain cap reached" in report["handed"]["n3"], report["handed"]
            assert idle_and_clear(node_info(lab, "n3"))  # named, but left in service
        else:
            assert drained_by_medic(lab, "n3"), report["handed"]
        assert node_info(lab, "n2")["state"] in BUSY  # the job runs on, untouched
        assert node_info(lab, "n6")["reason"] == admin
        assert job in lab.slurm(["squeue", "-h", "-o", "%i"]).stdout.split()
    finally:
        lab.slurm(["scancel", job], check=False)

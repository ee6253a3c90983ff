"""Strikes and the link watch on the lab (issue 26.4): n3's real medic-healthd with the `ib`
check at its default 60 s interval. An InfiniBand port that goes down with no kernel-log
line is seen by the link watch (healthd/link_watch.py) within seconds; re-checked, it comes
back and the node is given back; the third time within 3 hours the node stays drained for a
human (a standing fault), even though the port is up again."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from cli.lab.cluster import Lab
from medic_core.store import Store, open_store
from remediation import episodes as ep
from tests.conftest import poll
from tests.test_defects_lab import in_service
from tests.test_remediation import wait_closed

pytestmark = pytest.mark.lab


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def test_a_port_that_flaps_three_times_is_latched_and_each_flap_is_seen_in_seconds(
    lab: Lab, store: Store
) -> None:
    lab.start_healthd("n3")
    episodes = ep.EpisodeStore(store)
    poll("first round", lambda: bool(store.conditions("n3", type="ib")), timeout=30)
    port = lab.node("n3").host_root / "sys/class/infiniband/mlx5_4/ports/1/state"
    up = port.read_text()
    seen = []
    for flap in (1, 2, 3):
        down_at = time.time()
        port.write_text("1: DOWN\n")
        poll(f"flap {flap}'s episode", lambda f=flap: len(episodes.find(node="n3")) == f,
             timeout=20)  # fmt: skip
        opened = episodes.find(node="n3")[-1]
        seen.append(round(opened.opened_at.timestamp() - down_at, 2))
        assert (opened.fault_class, opened.target) == ("ib.port.down", "mlx5_4/1")
        port.write_text(up)
        if flap < 3:
            done = wait_closed(store, "n3", timeout=60)
            assert done.state == ep.RESOLVED, done.message
            poll("n3 back in service", lambda: in_service(lab, "n3"), timeout=20)
    print(f"port down to episode: {seen} s")
    assert all(s < 10 for s in seen), seen  # the check's own interval is 60 s
    third = episodes.find(node="n3")[-1]
    assert third.state == ep.NEEDS_HUMAN and "latched" in third.message, third.message
    assert "3 link faults of HCA port mlx5_4/1" in third.message
    # Up again (the daemon has judged the port OK since): still out, for a human.
    poll("the port judged up again", lambda: all(
        str(c.status) == "OK" for c in store.conditions("n3", type="ib")), timeout=20)  # fmt: skip
    assert not in_service(lab, "n3")
    assert episodes.find(node="n3")[-1].state == ep.NEEDS_HUMAN

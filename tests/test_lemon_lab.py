"""The lemon rule on the lab (real Slurm, the real daemon and its simulated GPUs and HCAs):
an InfiniBand flap that came back by itself, then one double-bit ECC error on a fresh node,
gets the GPU's reset and opens no RMA ticket; a real lemon (the same GPU's memory faulting
again after a reset) opens a ticket whose summary, reason and webhook payload name the GPU's
serial. The unit-level twins: tests/test_lemon.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from cli.lab.cluster import Lab
from medic_core.store import Store, open_store
from medic_core.store.models import RmaOutboxRow
from remediation import episodes as ep
from remediation import tickets
from remediation.policy import Rung
from tests.conftest import poll
from tests.test_fault_injection_lab import node_config
from tests.test_remediation import node_info, wait_closed

# The smallest rule, so one earlier episode decides: before, a link flap was that episode.
LEMON = "lemon_episodes = 2"


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def fast(lab: Lab, tmp_path: Path) -> Path:
    checks = {name: "interval = 2\n" for name in ("ib", "gpu_ecc", "gpu_xid", "gpu_count")}
    checks["gpu_count"] += "expected_count = 8\n"
    return node_config(lab, tmp_path, remediation=LEMON, checks=checks)


def episodes_of(store: Store, node: str) -> list[ep.Episode]:
    return ep.EpisodeStore(store).find(node=node)


def dbe(lab: Lab, store: Store, node: str, gpu: int) -> ep.Episode:
    """One more double-bit ECC error on `gpu`: the episode it opens, once closed."""
    before = len(episodes_of(store, node))
    lab.inject(node, gpu, ["ecc.dbe=1"])
    poll("an episode opened", lambda: len(episodes_of(store, node)) > before, timeout=30)
    return wait_closed(store, node, timeout=90)


def test_an_ib_flap_then_one_dbe_on_a_fresh_node_is_reset_not_sent_back(
    lab: Lab, store: Store, tmp_path: Path
) -> None:
    node = "n3"
    lab.start_healthd(node, config=fast(lab, tmp_path))
    poll("first round", lambda: bool(store.conditions(node, type="ib")), timeout=20)
    port = lab.node(node).host_root / "sys/class/infiniband/mlx5_4/ports/1/state"
    up = port.read_text()
    port.write_text("1: DOWN\n")
    poll("the flap's episode", lambda: bool(episodes_of(store, node)), timeout=30)
    port.write_text(up)  # back by itself
    flap = wait_closed(store, node, timeout=60)
    assert (flap.fault_class, flap.state, flap.rung) == ("ib.port.down", ep.RESOLVED, 0)
    poll("back in service", lambda: "DRAIN" not in node_info(lab, node)["state_flags"], 30)

    episode = dbe(lab, store, node, 3)
    assert episode.fault_class == "gpu.ecc.dbe", episode
    assert (episode.first_rung, episode.state) == (int(Rung.GPU_RESET), ep.RESOLVED), (
        episode.message
    )
    assert [s.action for s in ep.EpisodeStore(store).steps(episode.id)] == ["gpu_reset"]
    assert tickets.list_tickets(store, node=node) == []
    assert "DRAIN" not in node_info(lab, node)["state_flags"]


def test_a_real_lemon_s_ticket_names_the_gpu_serial(lab: Lab, store: Store, tmp_path: Path) -> None:
    node = "n2"
    lab.start_healthd(node, config=fast(lab, tmp_path))
    poll("first round", lambda: bool(store.conditions(node, type="gpu_ecc")), timeout=20)
    first = dbe(lab, store, node, 3)
    assert (first.first_rung, first.state) == (int(Rung.GPU_RESET), ep.RESOLVED), first.message
    second = dbe(lab, store, node, 3)  # the 2nd gpu-memory episode of GPU 3: a lemon
    assert (second.first_rung, second.state) == (int(Rung.RMA), ep.RMA), second.message
    assert ep.EpisodeStore(store).steps(second.id) == []  # no reset tried
    [ticket] = tickets.list_tickets(store, node=node)
    [gpu] = ticket.gpus
    assert gpu.index == 3 and gpu.serial
    reason = f"lemon: 2 gpu-memory episodes on GPU 3 (serial {gpu.serial}) in 7 days"
    assert ticket.reason == reason
    assert ticket.summary == f"GPU 3 (serial {gpu.serial}) on {node}: gpu.ecc.dbe; {reason}"
    assert ticket.component["serial"] == gpu.serial
    with Session(store.engine) as session:
        query = select(RmaOutboxRow).where(RmaOutboxRow.ticket_id == ticket.id)
        payload = session.scalars(query).first().payload  # type: ignore[union-attr]
    assert payload["ticket"]["component"]["serial"] == gpu.serial
    assert payload["ticket"]["reason"] == reason

"""Issue 22, finding 6 on the lab: an admin's drain whose reason reads like Medic's
(`medic: x`, typed with or without its quotes) is never resumed by Medic: not by the
HealthCheckProgram, not by the daemon, whatever its checks say."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli.lab.cluster import Lab
from medic_core import proc
from medic_core.store import DRAIN_RESUMED, Store, open_store
from remediation import episodes as ep
from tests.conftest import poll
from tests.lab_views import node_info


@pytest.fixture
def store(lab: Lab) -> Iterator[Store]:
    with open_store(f"sqlite:///{lab.layout.store_db}") as s:
        yield s


def run_hook(lab: Lab, hook: str, node: str) -> proc.CommandResult:
    """A hook run the way slurmd runs it: the lab's wrapper, SLURMD_NODENAME alone."""
    return proc.run([str(lab.layout.bin_dir / hook)], timeout=60, env={"SLURMD_NODENAME": node})


def holds(what: str, predicate: Callable[[], bool], seconds: float) -> None:
    """`predicate` stays true for `seconds` (checked every 0.2 s up to the deadline)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), what
        time.sleep(0.2)
    assert predicate(), what


@pytest.mark.parametrize("typed", ["medic: x", '"medic: x"'])
def test_an_admins_medic_looking_drain_is_never_resumed(
    lab: Lab, store: Store, tmp_path: Path, typed: str
) -> None:
    name = "n2"
    lab.slurm(["scontrol", "update", f"nodename={name}", "state=drain", f"reason={typed}"])
    info = node_info(lab, name)
    assert "DRAIN" in info["state_flags"] and info["reason"] == "medic: x"  # quotes gone

    def admins() -> bool:
        now = node_info(lab, name)
        return "DRAIN" in now["state_flags"] and now["reason"] == "medic: x"

    # The HealthCheckProgram on a clean node, its daemon up: the drain is not Medic's (no
    # record holds it), whatever it says.
    lab.start_healthd(name)
    result = run_hook(lab, "medic-healthcheck", name)
    assert result.returncode == 0, result.stderr
    assert "resumed" not in result.stdout, result.stdout
    assert admins(), "the HealthCheckProgram resumed an admin's drain"

    # A fault on the admin's node: the daemon hands it to a human (not its drain to take);
    # once the check is OK again, neither the daemon nor the health check gives it back.
    lab.stop_healthd(name)
    lab.inject(name, 1, ["nvlink.1=down"])
    lab.start_healthd(name)
    poll(
        "the fault's episode, handed to a human",
        lambda: any(e.state == ep.NEEDS_HUMAN for e in ep.EpisodeStore(store).find(node=name)),
        timeout=20,
    )
    lab.inject(name, 1, ["nvlink.1=up"])
    result = run_hook(lab, "medic-healthcheck", name)
    assert result.returncode == 0, result.stderr
    assert "resumed" not in result.stdout, result.stdout
    holds("the admin's drain kept while the daemon ticks", admins, seconds=12)
    assert store.events(name, kind=DRAIN_RESUMED) == []
    assert store.open_drain(name) is None  # Medic never recorded a drain of this node

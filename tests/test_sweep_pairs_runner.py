"""The pair sweep's runner (remediation/sweep/pair_runner.py) against a stand-in for Slurm:
what it takes, a node lost between rounds, a named node that runs a job by the end (never
handed, never drained), a killed sweep's reservation given back, one sweep at a time."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from medic_core.config import MedicConfig
from medic_core.pair_settings import PairSettings
from medic_core.proc import CommandResult
from medic_core.settings import SweepSettings
from medic_core.slurm import NodeInfo, SlurmError
from medic_core.store import Store, open_store
from remediation.sweep import SweepBusy, SweepStore
from remediation.sweep.pair_jobs import PAIR_RESERVATION
from remediation.sweep.pair_runner import PairSweeper


class FakeSlurm:
    """Nodes, one reservation and the pair jobs; `slow` nodes measure low; `on_round` runs
    before each job of that round (to change the cluster mid-sweep)."""

    env: Mapping[str, str] = {}

    def __init__(self, names: Sequence[str], slow: set[str]) -> None:
        self.state = {n: "IDLE" for n in names}
        self.flags: dict[str, set[str]] = {n: set() for n in names}
        self.slow = slow
        self.reservations: dict[str, str] = {}
        self.jobs: list[tuple[int, tuple[str, ...]]] = []
        self.drained: list[str] = []
        self.on_round: dict[int, list[str]] = {}
        self.completing_looks = 0  # looks for which a pair job's nodes show COMPLETING

    def nodes(self) -> list[NodeInfo]:
        ended = {n for _, pair in self.jobs[-1:] for n in pair} if self.completing_looks else set()
        self.completing_looks = max(0, self.completing_looks - 1)
        return [
            NodeInfo(
                n, s, frozenset(self.flags[n] | self._completing(n, ended)), partitions=("gpu",)
            )
            for n, s in self.state.items()
        ]

    @staticmethod
    def _completing(node: str, ended: set[str]) -> set[str]:
        return {"COMPLETING"} if node in ended else set()

    def node(self, name: str) -> NodeInfo | None:
        return next((n for n in self.nodes() if n.name == name), None)

    def create_reservation(self, name: str, node: str, minutes: int, user: str) -> None:
        if any(self.state[n] != "IDLE" for n in node.split(",")):
            raise SlurmError("Requested nodes are busy")
        self.reservations[name] = node

    def reservation_exists(self, name: str) -> bool:
        return name in self.reservations

    def delete_reservation(self, name: str) -> bool:
        return self.reservations.pop(name, None) is not None

    def cancel_reservation_jobs(self, name: str) -> None:
        pass

    def cancel_job_named(self, name: str) -> None:
        pass

    def drain(self, node: str, reason: str) -> None:
        self.drained.append(node)
        self.flags[node].add("DRAIN")

    def srun(self, args: Sequence[str], timeout: float, env: Mapping[str, str]) -> CommandResult:
        nodes = tuple(next(a for a in args if a.startswith("--nodelist=")).split("=")[1].split(","))
        round_no = int(re.search(r"-r(\d+)-", " ".join(args)).group(1))  # type: ignore[union-attr]
        for name in self.on_round.pop(round_no, []):
            self.state[name] = "ALLOCATED"  # someone's job: the reservation did not hold it
        self.jobs.append((round_no, nodes))
        ib = 100.0 if self.slow & set(nodes) else 392.0
        lines = [
            json.dumps({"pair_probe": {"node": n, "measured": {"ib_bw_gbps": ib}, "errors": []}})
            for n in nodes
        ]
        return CommandResult(tuple(args), 0, "\n".join(lines), "", 0.1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as opened:
        yield opened


def _sweeper(store: Store, slurm: FakeSlurm) -> PairSweeper:
    config = MedicConfig(source=None, node_name="head")
    pairs = PairSettings(tests=("ib",), default_min_ib_gbps=300.0)
    return PairSweeper(config, store, slurm, SweepSettings(), pairs)  # type: ignore[arg-type]


NAMES = [f"n{i}" for i in range(1, 7)]


def test_only_idle_nodes_are_taken_and_a_busy_one_is_never_paired(store: Store) -> None:
    slurm = FakeSlurm(NAMES, {"n4"})
    slurm.state["n2"] = "ALLOCATED"
    report = _sweeper(store, slurm).run(share=1.0, dry_run=True)
    assert report.nodes == ("n1", "n3", "n4", "n5", "n6")
    assert "round 1: n1+n3, n4+n5" in report.message
    assert slurm.jobs == [] and slurm.reservations == {}  # a dry run takes nothing


def test_share_caps_the_nodes_taken_with_three_at_least(store: Store) -> None:
    slurm = FakeSlurm(NAMES, set())
    assert len(_sweeper(store, slurm).run(share=0.05, dry_run=True).nodes) == 3


def test_a_node_lost_between_rounds_is_left_out(store: Store) -> None:
    slurm = FakeSlurm(NAMES, {"n4"})
    slurm.on_round[2] = ["n5"]  # an admin's job lands on n5 (say, the reservation was cut)
    report = _sweeper(store, slurm).run(share=1.0)
    assert report.left_out == {"n5": "not idle (ALLOCATED)"}
    assert list(report.verdicts.bad) == ["n4"]  # type: ignore[union-attr]
    assert slurm.drained == ["n4"]  # through the ladder: episode, drain cap, then Slurm
    assert all("n5" not in nodes for r, nodes in slurm.jobs if r > 2)
    assert slurm.reservations == {}  # given back


def test_a_named_node_running_a_job_by_the_end_is_not_handed(store: Store) -> None:
    slurm = FakeSlurm(NAMES, {"n4"})
    slurm.on_round[2] = ["n4"]  # busy from round 2 on: named, but never drained
    report = _sweeper(store, slurm).run(share=1.0)
    assert report.handed["n4"].startswith("not handed: not idle")
    assert slurm.drained == []
    assert slurm.reservations == {}


def test_a_killed_sweeps_reservation_is_given_back_and_one_sweep_runs_at_once(
    store: Store,
) -> None:
    slurm = FakeSlurm(NAMES, set())
    slurm.reservations[PAIR_RESERVATION] = ",".join(NAMES)  # left by a killed pair sweep
    report = _sweeper(store, slurm).run(share=1.0)
    assert report.rounds == 1 and len(report.verdicts.good) == 6  # type: ignore[union-attr]
    assert slurm.reservations == {}
    with SweepStore(store).exclusive(), pytest.raises(SweepBusy):
        _sweeper(store, slurm).run(share=1.0)


def test_nodes_busy_when_taken_are_dropped_and_the_rest_taken(store: Store) -> None:
    slurm = FakeSlurm(NAMES, set())
    real = slurm.create_reservation
    calls: list[str] = []

    def racing(name: str, node: str, minutes: int, user: str) -> None:
        calls.append(node)
        if len(calls) == 1:
            slurm.state["n6"] = "ALLOCATED"  # a job started between our look and the take
        real(name, node, minutes, user)

    slurm.create_reservation = racing  # type: ignore[method-assign]
    report = _sweeper(store, slurm).run(share=1.0)
    assert calls == [",".join(NAMES), "n1,n2,n3,n4,n5"]
    assert report.nodes == ("n1", "n2", "n3", "n4", "n5")


def test_nodes_completing_our_own_pair_job_are_waited_for_not_left_out(store: Store) -> None:
    slurm = FakeSlurm(NAMES, {"n4"})
    real = slurm.srun

    def ending(args: Sequence[str], timeout: float, env: Mapping[str, str]) -> CommandResult:
        result = real(args, timeout, env)
        slurm.completing_looks = 2  # the job's nodes show COMPLETING for the next two looks
        return result

    slurm.srun = ending  # type: ignore[method-assign]
    report = _sweeper(store, slurm).run(share=1.0)
    assert report.left_out == {} and list(report.verdicts.bad) == ["n4"]  # type: ignore[union-attr]
    assert slurm.drained == ["n4"]

"""Strikes (issue 26.4): a part that keeps coming back by itself is latched as a standing
fault. Pure tests of remediation.policy.StrikeScore, and the real ladder (a real SQLite
store, fake Slurm, node and clock: tests/test_ladder_unit.World): an InfiniBand port that
goes down and comes back twice is re-checked and given back each time; the third time within
3 hours the node stays drained for a human, and another port's or a GPU's fault is not
counted with it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medic_core.status import Status
from medic_core.vocabulary import Component, ComponentKind, Finding, Recommendation
from remediation import episodes as ep
from remediation.policy import LINK, LemonEpisode, StrikeRule, StrikeScore
from tests.test_ladder_unit import World, in_service

NOW = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
PORT = Component(ComponentKind.HCA, "mlx5_0/1", guid="b8ce:f603:0012:3456")
OTHER_PORT = Component(ComponentKind.HCA, "mlx5_1/1")


def came_back(component: Component, hours_ago: float, **values: bool) -> LemonEpisode:
    """An earlier episode of the node: by default one that came back by itself."""
    facts = {"repaired": False, "resolved": True, **values}
    return LemonEpisode(component, LINK, NOW - dt.timedelta(hours=hours_ago), **facts)


def test_the_third_flap_of_one_port_within_three_hours_latches() -> None:
    two = [came_back(PORT, 2.5), came_back(PORT, 0.5)]
    score = StrikeScore.of(PORT, LINK, two, now=NOW)
    assert score.latched and score.flaps == 3
    assert score.why() == (
        "3 link faults of HCA port mlx5_0/1 (GUID b8ce:f603:0012:3456) (strikes: 3 within 3 h)"
    )


@pytest.mark.parametrize(
    "earlier",
    [
        [came_back(PORT, 3.5), came_back(PORT, 0.5)],  # one is older than the window
        [came_back(OTHER_PORT, 1), came_back(PORT, 0.5)],  # another port's
        [came_back(PORT, 1, repaired=True), came_back(PORT, 0.5)],  # a repair ran: the lemon's
        [came_back(PORT, 1, closed_by_human=True), came_back(PORT, 0.5)],  # a human judged it
        [came_back(PORT, 1, resolved=False), came_back(PORT, 0.5)],  # never came back
    ],
    ids=["old", "other-port", "repaired", "human", "not-back"],
)
def test_what_does_not_count_as_a_strike(earlier: list[LemonEpisode]) -> None:
    assert not StrikeScore.of(PORT, LINK, earlier, now=NOW).latched


def test_a_family_without_a_rule_never_latches() -> None:
    many = [came_back(PORT, h / 10) for h in range(10)]
    assert not StrikeScore.of(PORT, "gpu-memory", many, now=NOW).latched


@settings(max_examples=200, deadline=None)
@given(hours=st.lists(st.floats(0, 6), max_size=8), count=st.integers(2, 5))
def test_it_latches_exactly_when_enough_came_back_within_the_window(
    hours: list[float], count: int
) -> None:
    rule = StrikeRule(count, 3 * 3600.0)
    history = [came_back(PORT, h) for h in hours]
    score = StrikeScore.of(PORT, LINK, history, now=NOW, rules={LINK: rule})
    assert score.latched == (sum(1 for h in hours if h <= 3) + 1 >= count)


IB_DOWN = Finding(
    "ib", Status.CRITICAL, "ib.port.down", "mlx5_0/1", "port down", Recommendation.RECHECK,
    evidence={"hca": "mlx5_0", "port": 1},
)  # fmt: skip


def flap(world: World) -> ep.Episode:
    world.fault("n1", IB_DOWN)
    world.tick("n1")
    world.nodes["n1"].findings.clear()  # the link came back
    return world.run("n1")


def test_a_port_that_flaps_a_third_time_stays_out_for_a_human(tmp_path: Path) -> None:
    world = World(tmp_path / "medic.db")
    try:
        for _ in range(2):
            episode = flap(world)
            assert episode.state == ep.RESOLVED and in_service(world, "n1")
            world.clock.advance(600)
        world.fault("n1", IB_DOWN)
        third = world.last("n1")
        assert third.state == ep.NEEDS_HUMAN and "latched" in third.message
        assert "3 link faults of HCA port mlx5_0/1" in third.message
        world.nodes["n1"].findings.clear()  # it comes back again: stays out all the same
        for _ in range(5):
            world.tick("n1")
            world.clock.advance(60)
        assert world.last("n1").state == ep.NEEDS_HUMAN and not in_service(world, "n1")
    finally:
        world.close()

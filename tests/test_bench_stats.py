"""bench.stats: a percentile only where its sample carries it, two groups reported apart
when a figure is bimodal (bench.fault_recovery's "back in service": ~3.2 s and ~5.1 s), a
drift's slope, and the order of paired runs drawn per pair."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.stats import clusters, described, pair_order, slope_per_hour


def test_p90_needs_twenty_values_and_p99_a_thousand() -> None:
    rng = random.Random(1)
    ten = described([float(v) for v in range(10)], rng, unit="s")
    assert "p90_s" not in ten and ten["max_s"] == 9.0 and ten["n"] == 10
    twenty = described([float(v) for v in range(20)], rng, unit="s")
    assert "p90_s" in twenty and "p99_s" not in twenty
    many = described([float(v % 97) for v in range(1000)], rng)
    assert "p99_ms" in many and "p99_ci_ms" in many


def test_the_two_groups_of_back_in_service_are_reported_apart() -> None:
    back = [3.18, 3.21, 3.25, 3.2, 5.02, 5.1, 5.31, 3.19, 5.05, 3.22]
    low, high = clusters(back)
    assert max(low) < 3.3 < 5.0 < min(high)
    shown = described(back, random.Random(1), unit="s")
    assert [c["n"] for c in shown["clusters"]] == [6, 4]  # type: ignore[union-attr]


def test_one_group_with_noise_stays_one() -> None:
    rng = random.Random(3)
    values = [rng.gauss(2.0, 0.1) for _ in range(200)]
    assert len(clusters(values)) == 1
    assert "clusters" not in described(values, rng)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=60))
def test_clusters_keep_every_value_in_order(values: list[float]) -> None:
    groups = clusters(values)
    assert [v for g in groups for v in g] == sorted(values)
    assert 1 <= len(groups) <= 2
    if len(groups) == 2:
        assert min(len(g) for g in groups) >= 2 and groups[0][-1] < groups[1][0]


def test_slope_per_hour_of_a_steady_drift_and_of_a_flat_line() -> None:
    rising = [(t, 60.0 + t / 3600 * 0.5) for t in range(0, 1800, 15)]  # 0.5 MiB an hour
    assert abs(slope_per_hour(rising) - 0.5) < 1e-6
    assert slope_per_hour([(t, 61.8) for t in range(0, 600, 15)]) == 0.0
    assert slope_per_hour([(0.0, 1.0)]) == 0.0


def test_pair_order_puts_each_side_first_about_half_the_time() -> None:
    rng = random.Random(7)
    firsts = [pair_order(("hook", "true"), rng)[0] for _ in range(1000)]
    assert 400 < firsts.count("hook") < 600
    assert sorted(pair_order(("a", "b", "c"), rng)) == ["a", "b", "c"]

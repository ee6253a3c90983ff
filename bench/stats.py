"""The benches' statistics: quantiles with 95 % bootstrap intervals, reported only where the
sample can carry them (p90 needs at least 20 values and p99 at least 1,000; with fewer the
largest value is given, named `max`), figures that fall in two separate groups reported as
those groups, a fitted slope for a figure that drifts, and the order of paired runs drawn per
pair so that neither side always goes first."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

BOOTSTRAP = 1000
P90_MIN_SAMPLES = 20
P99_MIN_SAMPLES = 1000
# Two groups are reported apart when the gap between them is this many times wider than
# the spread (standard deviation, pooled) inside them, and the smaller holds >= 2 values.
CLUSTER_SEPARATION = 4.0


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def interval(values: list[float], q: float, rng: random.Random) -> list[float]:
    """95 % bootstrap interval of the q-quantile."""
    n = len(values)
    estimates = sorted(quantile(sorted(rng.choices(values, k=n)), q) for _ in range(BOOTSTRAP))
    return [round(quantile(estimates, 0.025), 3), round(quantile(estimates, 0.975), 3)]


def described(values: list[float], rng: random.Random, unit: str = "ms") -> dict[str, object]:
    """n, p50, p90 (with >= 20 values) and p99 (with >= 1,000), each with its interval, and
    the max; `clusters` too when the values fall in two separate groups (see clusters)."""
    ordered = sorted(values)
    out: dict[str, object] = {"n": len(values)}
    wanted = [("p50", 0.5)]
    if len(values) >= P90_MIN_SAMPLES:
        wanted.append(("p90", 0.9))
    if len(values) >= P99_MIN_SAMPLES:
        wanted.append(("p99", 0.99))
    for label, q in wanted:
        out[f"{label}_{unit}"] = round(quantile(ordered, q), 3)
        out[f"{label}_ci_{unit}"] = interval(values, q, rng)
    out[f"max_{unit}"] = round(ordered[-1], 3)
    groups = clusters(values)
    if len(groups) > 1:
        out["clusters"] = [
            {"n": len(g), f"median_{unit}": round(statistics.median(g), 3),
             f"range_{unit}": [round(g[0], 3), round(g[-1], 3)]}
            for g in groups
        ]  # fmt: skip
    return out


def clusters(values: Sequence[float]) -> list[list[float]]:
    """The values as one sorted group, or as two when they fall apart: the split that
    leaves the least spread inside the groups (two-means on a line, exact), kept only when
    the gap between the groups is CLUSTER_SEPARATION times the pooled spread inside them
    and each group has at least 2 values. A bimodal figure's median moves with how many
    runs land in each group: reporting the groups says what a second run will show."""
    ordered = sorted(values)
    n = len(ordered)
    if n < 4:
        return [ordered]
    best: tuple[float, int] | None = None
    for cut in range(2, n - 1):
        low, high = ordered[:cut], ordered[cut:]
        inside = statistics.pvariance(low) * len(low) + statistics.pvariance(high) * len(high)
        if best is None or inside < best[0]:
            best = (inside, cut)
    assert best is not None
    inside, cut = best
    spread = (inside / n) ** 0.5
    gap = ordered[cut] - ordered[cut - 1]
    if gap > 0 and gap >= CLUSTER_SEPARATION * spread:
        return [ordered[:cut], ordered[cut:]]
    return [ordered]


def slope_per_hour(samples: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) samples, in value units per hour."""
    if len(samples) < 2:
        return 0.0
    xs = [t for t, _ in samples]
    ys = [v for _, v in samples]
    if max(xs) == min(xs):
        return 0.0
    fit = statistics.linear_regression(xs, ys)
    return fit.slope * 3600.0


def pair_order(names: Sequence[str], rng: random.Random) -> list[str]:
    """The order to run one pair (or set) of compared commands in: drawn anew for each
    pair, so that a cost of going first or second (a warm cache, a timer's phase) falls on
    every side alike."""
    order = list(names)
    rng.shuffle(order)
    return order

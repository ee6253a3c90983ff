"""The benches' statistics: quantiles with 95 % bootstrap intervals, reported only where the
sample can carry them (p99 needs at least 1,000 values, else p90 is the last one given)."""

from __future__ import annotations

import random

BOOTSTRAP = 1000
P99_MIN_SAMPLES = 1000


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def interval(values: list[float], q: float, rng: random.Random) -> list[float]:
    """95 % bootstrap interval of the q-quantile."""
    n = len(values)
    estimates = sorted(quantile(sorted(rng.choices(values, k=n)), q) for _ in range(BOOTSTRAP))
    return [round(quantile(estimates, 0.025), 3), round(quantile(estimates, 0.975), 3)]


def described(values: list[float], rng: random.Random, unit: str = "ms") -> dict[str, object]:
    """n, p50, p90 and (with enough values) p99, each with its interval, and the max."""
    ordered = sorted(values)
    out: dict[str, object] = {"n": len(values)}
    wanted = [("p50", 0.5), ("p90", 0.9)]
    if len(values) >= P99_MIN_SAMPLES:
        wanted.append(("p99", 0.99))
    for label, q in wanted:
        out[f"{label}_{unit}"] = round(quantile(ordered, q), 3)
        out[f"{label}_ci_{unit}"] = interval(values, q, rng)
    out[f"max_{unit}"] = round(ordered[-1], 3)
    return out

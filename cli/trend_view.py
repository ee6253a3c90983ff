"""The trend checks' series as `medic node show` prints them: one compact line per target
(a GPU, the memory controllers, an InfiniBand port) and counter (the last values, the rate
per hour), from the evidence of the node's `gpu_trends` and `host_trends` conditions.
Counters that do not move are left out unless asked for (--all)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from healthd.checks.host_trends import LABELS as HOST_LABELS
from healthd.trends import COUNTERS, describe

CHECKS = ("gpu_trends", "host_trends")


def _natural(target: str) -> tuple[int, str]:
    return (int(target), "") if target.isdigit() else (1 << 30, target)


def trend_lines(conditions: Iterable[Any], *, show_all: bool = False) -> list[str]:
    """Lines for the `gpu_trends` conditions among `conditions` (store Condition rows: type,
    target, evidence); evidence that is not what the check writes is skipped."""
    out: list[str] = []
    rows = [c for c in conditions if getattr(c, "type", "") in CHECKS]
    for c in sorted(rows, key=lambda c: (c.type, _natural(str(c.target)))):
        where = f"GPU {c.target}" if c.type == "gpu_trends" else str(c.target)
        evidence = c.evidence if isinstance(c.evidence, Mapping) else {}
        series, rates = evidence.get("series"), evidence.get("rates_per_hour") or {}
        if not isinstance(series, Mapping) or not isinstance(rates, Mapping):
            continue
        rising = set(evidence.get("rising") or ())
        known = (*COUNTERS, *HOST_LABELS)
        for counter in (*known, *sorted(set(series) - set(known))):
            points = series.get(counter)
            if not isinstance(points, list):
                continue
            rate = rates.get(counter)
            if not show_all and counter not in rising and not rate:
                continue
            try:
                label = HOST_LABELS.get(counter)
                line = describe(counter, points, None if rate is None else float(rate), label)
            except (TypeError, ValueError, IndexError):
                continue
            mark = "  RISING" if counter in rising else ""
            out.append(f"  {where}  {line}{mark}")
    return out

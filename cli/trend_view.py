"""The trends check's series as `medic node show` prints them: one compact line per GPU and
counter (the last values, the rate per hour), from the evidence of the node's `gpu_trends`
conditions. Counters that do not move are left out unless asked for (--all)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from healthd.trends import COUNTERS, describe

CHECK = "gpu_trends"


def _natural(target: str) -> tuple[int, str]:
    return (int(target), "") if target.isdigit() else (1 << 30, target)


def trend_lines(conditions: Iterable[Any], *, show_all: bool = False) -> list[str]:
    """Lines for the `gpu_trends` conditions among `conditions` (store Condition rows: type,
    target, evidence); evidence that is not what the check writes is skipped."""
    out: list[str] = []
    rows = [c for c in conditions if getattr(c, "type", "") == CHECK]
    for c in sorted(rows, key=lambda c: _natural(str(c.target))):
        evidence = c.evidence if isinstance(c.evidence, Mapping) else {}
        series, rates = evidence.get("series"), evidence.get("rates_per_hour") or {}
        if not isinstance(series, Mapping) or not isinstance(rates, Mapping):
            continue
        rising = set(evidence.get("rising") or ())
        for counter in (*COUNTERS, *sorted(set(series) - set(COUNTERS))):
            points = series.get(counter)
            if not isinstance(points, list):
                continue
            rate = rates.get(counter)
            if not show_all and counter not in rising and not rate:
                continue
            try:
                line = describe(counter, points, None if rate is None else float(rate))
            except (TypeError, ValueError, IndexError):
                continue
            mark = "  RISING" if counter in rising else ""
            out.append(f"  GPU {c.target}  {line}{mark}")
    return out

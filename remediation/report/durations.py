"""Durations in `medic report`: seconds between two times, a time in the window, a
percentile, a Spread (count, total, mean, p50, p90) and a duration as a person reads it.
Pure: the standard library only."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """Totals and percentiles of one duration over the interruptions that have it."""

    count: int
    total_s: float
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None


def seconds(a: dt.datetime, b: dt.datetime) -> float:
    return (b - a).total_seconds()


def in_window(at: dt.datetime, since: dt.datetime, until: dt.datetime) -> bool:
    return since <= at <= until


def format_duration(value: float | None) -> str:
    """A duration as a person reads it, its unit fitted to its size: `-` (unknown), `0 s`,
    `643 ms`, `4.4 s`, `42 s`, `12 min 05 s`, `3 h 20 min`, `2 d 4 h`. The text and the HTML
    report both print durations with this."""
    if value is None or math.isnan(value):
        return "-"
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value == 0:
        return "0 s"
    if round(value * 1000) < 1000:
        return f"{sign}{value * 1000:.3g} ms" if value < 0.001 else f"{sign}{value * 1000:.0f} ms"
    if round(value, 1) < 10:
        return f"{sign}{value:.1f} s"
    whole = round(value)
    if whole < 60:
        return f"{sign}{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{sign}{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{sign}{days} d {hours} h"


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def spread(values: Iterable[float | None]) -> Spread:
    known = [v for v in values if v is not None]
    total = sum(known)
    return Spread(
        count=len(known),
        total_s=total,
        mean_s=total / len(known) if known else None,
        p50_s=percentile(known, 0.5),
        p90_s=percentile(known, 0.9),
    )

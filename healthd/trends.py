"""Short time series of the counters that rise before a failure, and the pure trend math the
`gpu_trends` check judges them with.

A series is a list of (unix time, value) points, newest last, kept per GPU (by UUID) and
counter. `stats` turns the points inside a window into a rate (per hour), the rates of the
window's older and recent halves and an acceleration; `judge` compares them with the limits
from `[checks.gpu_trends]`. Counters that go down (a GPU reset, a driver reload, a 32-bit wrap)
restart: the step down counts the new value (the errors since the restart), never the
difference, so a reset is never a spike, and the trend is judged on the points since the
last restart only: a GPU reset or a driver reload (the ladder's repair) starts a new series,
which must fill again before it can warn. A gauge (the temperature) counts its net change.

`SeriesBook` holds the series in memory and, given a path, persists them as one JSON file
(temp file, fsync, rename) so a daemon restart keeps them; a missing or unreadable file is
an empty book (one log line), never an error.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("medic.healthd.trends")

Point = tuple[float, float]  # (unix time in seconds, value)

# Every counter the check samples, in the order a warning names them (the first that rises
# is the finding's fault class). Labels are for messages and `medic node show`.
COUNTERS: Mapping[str, str] = {
    "ecc_corrected": "correctable ECC",
    "remapped_rows": "remapped rows",
    "retired_pages": "retired pages",
    "pcie_replay": "PCIe replays",
    "nvlink_crc": "NVLink CRC errors",
    "nvlink_replay": "NVLink replays",
    "throttle_ms": "clock-throttle ms",
    "temperature_c": "temperature C",
}
GAUGES = frozenset({"temperature_c"})  # readings, not counters: the net change counts
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class TrendStats:
    points: int
    span_s: float
    increase: float  # over the window (restarts counted as restarts, not drops)
    rate: float  # per hour over the window
    older_rate: float  # per hour, the window's first half
    recent_rate: float  # per hour, its second half
    acceleration: float  # per hour per hour: (recent - older) / half the span
    restarts: int  # steps down in the window (reset, reload, wrap); judged after the last


def in_window(points: Sequence[Point], now: float, window: float) -> list[Point]:
    return [p for p in points if now - window <= p[0] <= now]


def increments(points: Sequence[Point], *, gauge: bool = False) -> list[tuple[float, float, float]]:
    """(start, end, increase) per step. A counter that went down restarted: its new value
    is what it counted since (a lower bound), never the negative difference."""
    out = []
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t1 <= t0:
            continue
        if gauge or v1 >= v0:
            out.append((t0, t1, v1 - v0))
        else:
            out.append((t0, t1, max(v1, 0.0)))
    return out


def _share_before(start: float, end: float, mid: float) -> float:
    """The share of a step's increase that falls before `mid` (spread evenly over the step)."""
    if end <= mid:
        return 1.0
    if start >= mid:
        return 0.0
    return (mid - start) / (end - start)


def stats(
    points: Sequence[Point], now: float, window: float, *, gauge: bool = False
) -> TrendStats | None:
    """The trend of the points inside [now - window, now] since the counter's last restart;
    None with fewer than two."""
    pts = sorted(in_window(points, now, window))
    restarts = 0 if gauge else sum(1 for (_, v0), (_, v1) in itertools.pairwise(pts) if v1 < v0)
    if restarts:
        last = max(i for i in range(1, len(pts)) if pts[i][1] < pts[i - 1][1])
        pts = pts[last - 1 :]  # the step down itself counts its new value
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    steps = increments(pts, gauge=gauge)
    span = pts[-1][0] - pts[0][0]
    increase = sum(inc for _, _, inc in steps)
    mid = pts[0][0] + span / 2
    older = sum(inc * _share_before(a, b, mid) for a, b, inc in steps)
    recent = increase - older
    half_h = span / 2 / SECONDS_PER_HOUR
    older_rate, recent_rate = older / half_h, recent / half_h
    return TrendStats(
        points=len(pts),
        span_s=span,
        increase=increase,
        rate=increase / (span / SECONDS_PER_HOUR),
        older_rate=older_rate,
        recent_rate=recent_rate,
        acceleration=(recent_rate - older_rate) / half_h,
        restarts=restarts,
    )


@dataclass(frozen=True)
class Limits:
    """What counts as rising, from `[checks.gpu_trends]`."""

    rate_per_hour: Mapping[str, float]  # counter -> rate that warns; absent: never warns
    acceleration_ratio: float = 3.0  # recent half's rate over the older half's
    min_points: int = 4
    min_span_s: float = 600.0


def judge(counter: str, s: TrendStats | None, limits: Limits) -> str:
    """Why this counter's trend warns ("" when it does not): its rate over the window
    reached the limit, or its recent half rises at least `acceleration_ratio` times as fast
    as the older half and at half the limit or more (a gauge has no acceleration rule)."""
    limit = limits.rate_per_hour.get(counter)
    if s is None or limit is None or s.points < limits.min_points:
        return ""
    if s.span_s < limits.min_span_s:
        return ""
    label = COUNTERS.get(counter, counter)
    if s.rate >= limit:
        return f"{label} rising {fmt(s.rate)}/h (limit {fmt(limit)}/h)"
    if counter in GAUGES:
        return ""
    floor = limit / 2
    if s.recent_rate >= floor and s.recent_rate >= limits.acceleration_ratio * s.older_rate:
        ratio = "from 0" if s.older_rate == 0 else f"x{s.recent_rate / s.older_rate:.1f}"
        return (
            f"{label} accelerating {fmt(s.older_rate)}/h -> {fmt(s.recent_rate)}/h ({ratio};"
            f" limit {fmt(limit)}/h)"
        )
    return ""


def fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2g}" if abs(value) < 1 else f"{value:.1f}"


# --- the series themselves -----------------------------------------------------------------


SAVE_EVERY = 50.0  # seconds of sample time; below the default interval (60 s, jitter 10 %)


class SeriesBook:
    """Series by key ("<gpu uuid>/<counter>"), each at most `keep` points no older than
    `horizon` seconds. Not thread-safe: the check's gather is its only user."""

    VERSION = 1

    def __init__(self, path: Path | None = None, *, keep: int = 120) -> None:
        self.path = path
        self.keep = keep
        self.series: dict[str, list[Point]] = {}
        self.loaded = path is None
        self._saved_at: float | None = None

    def load(self) -> None:
        """Read the persisted series once; a missing file is an empty book, a bad one is
        logged on one line and replaced at the next save."""
        self.loaded = True
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("version") != self.VERSION:
                raise ValueError("not a trends file of version 1")
            series = data.get("series")
            if not isinstance(series, dict):
                raise ValueError("no 'series' object")
            self.series = {
                str(k): [(float(t), float(v)) for t, v in pts][-self.keep :]
                for k, pts in series.items()
            }
        except (OSError, ValueError, TypeError) as exc:
            log.warning(
                "%s: trend series not restored (%s); starting empty, rewritten at the next run",
                self.path,
                exc,
            )
            self.series = {}

    def add(self, key: str, t: float, value: float, horizon: float) -> None:
        pts = self.series.setdefault(key, [])
        if pts and t <= pts[-1][0]:
            return  # a clock that stepped back: keep the series monotonic in time
        pts.append((t, value))
        cut = t - horizon
        while pts and (pts[0][0] < cut or len(pts) > self.keep):
            pts.pop(0)

    def forget_except(self, keys: Iterable[str], now: float, horizon: float) -> None:
        """Drop series not sampled within `horizon` (a GPU replaced: its UUID is gone)."""
        keep = set(keys)
        for key in list(self.series):
            pts = self.series[key]
            if key not in keep and (not pts or pts[-1][0] < now - horizon):
                del self.series[key]

    def get(self, key: str) -> list[Point]:
        return list(self.series.get(key, ()))

    def save_due(self, now: float) -> None:
        """save() at most once per SAVE_EVERY seconds of sample time `now`: a check run more
        often than its default (every minute) rewrites the file every few runs, not at each;
        a crash loses at most that much of a series that spans hours."""
        if self._saved_at is not None and 0 <= now - self._saved_at < SAVE_EVERY:
            return
        self.save()
        self._saved_at = now

    def save(self) -> None:
        if self.path is None:
            return
        body = {"version": self.VERSION, "series": self.series}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as out:
                json.dump(body, out, separators=(",", ":"))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("%s: trend series not saved: %s", self.path, exc)


def book_for(book: SeriesBook | None, path: Path | None, keep: int) -> SeriesBook:
    """A check's book for this round: `book` while it keeps the same file, else a new one
    loaded from `path` (a reload may move state_dir); `keep` as configured now."""
    if book is None or book.path != path:
        book = SeriesBook(path, keep=keep)
        book.load()
    book.keep = keep
    return book


def compact(points: Sequence[Point], last: int = 6) -> list[list[float]]:
    """The newest points as evidence: [[unix seconds, value], ...]."""
    return [[round(t), v if v != int(v) else int(v)] for t, v in points[-last:]]


def describe(
    counter: str, points: Sequence[Any], rate: float | None, label: str | None = None
) -> str:
    """One line for `medic node show`: label, the last values, the rate."""
    label = label or COUNTERS.get(counter, counter)
    values = " ".join(fmt(float(p[1])) for p in points)
    per_hour = "-" if rate is None else f"{fmt(rate)}/h"
    return f"{label}: {values or '-'} ({per_hour})"

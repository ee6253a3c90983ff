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
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

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
    None with fewer than two. A `Series` (what a `SeriesBook` hands out) is judged from its
    running sums in a few bisections, with exactly the result of the plain computation."""
    if isinstance(points, Series):
        return points.stats(now, window, gauge=gauge)
    return _stats_of_points(points, now, window, gauge=gauge)


def _stats_of_points(
    points: Sequence[Point], now: float, window: float, *, gauge: bool
) -> TrendStats | None:
    """`stats` point by point: any points (unsorted, repeated times, NaN, fractions)."""
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
    return _trend(len(pts), span, increase, older, recent, restarts)


def _trend(
    points: int, span: float, increase: float, older: float, recent: float, restarts: int
) -> TrendStats:
    half_h = span / 2 / SECONDS_PER_HOUR
    older_rate, recent_rate = older / half_h, recent / half_h
    return TrendStats(
        points=points,
        span_s=span,
        increase=increase,
        rate=increase / (span / SECONDS_PER_HOUR),
        older_rate=older_rate,
        recent_rate=recent_rate,
        acceleration=(recent_rate - older_rate) / half_h,
        restarts=restarts,
    )


# --- a series with running sums ------------------------------------------------------------

_EXACT = 2.0**52  # |value| below this: an integer, its steps and their sums are exact floats
_COMPACT = 16  # dead points a series' columns may hold before they are copied anew


def _exact(v: float) -> bool:
    return -_EXACT < v < _EXACT and v == int(v)


def _counter_step(v0: float, v1: float) -> int:
    """`increments` of one counter step, as an integer (both values exact integers)."""
    return int(v1) - int(v0) if v1 >= v0 else max(int(v1), 0)


class _Store:
    """The append-only columns behind Series views: a view sees only its [lo, hi), so an
    append (past every view's hi) changes no view; a compaction makes new columns."""

    __slots__ = ("cum", "exact", "restarts", "times", "values")

    def __init__(self, points: Iterable[Point]) -> None:
        pts = list(points)
        self.times = [t for t, _ in pts]
        self.values = [v for _, v in pts]
        # every value an exact integer, times finite and strictly rising: sums are exact
        self.exact = all(math.isfinite(t) and _exact(v) for t, v in pts) and all(
            t0 < t1 for t0, t1 in itertools.pairwise(self.times)
        )
        self.cum: list[int] = []  # cum[i]: the counter's increments from the first point to i
        self.restarts: list[float] = []  # the time of each point lower than the one before
        if self.exact and pts:
            steps = (_counter_step(v0, v1) for v0, v1 in itertools.pairwise(self.values))
            self.cum = list(itertools.accumulate(steps, initial=0))
            self.restarts = [t1 for (_, v0), (t1, v1) in itertools.pairwise(pts) if v1 < v0]

    def copy(self, lo: int, hi: int) -> _Store:
        """New columns holding [lo, hi) of these (exact) ones."""
        new = _Store(())
        new.times, new.values, new.cum = self.times[lo:hi], self.values[lo:hi], self.cum[lo:hi]
        new.exact = self.exact
        first = self.times[lo]
        new.restarts = [r for r in self.restarts if r > first]
        return new


class Series(Sequence[Point]):
    """An immutable series (a Sequence of its points, oldest first) with what `stats` needs
    to judge any window of it without a pass over its points: the running sum of the
    counter's increments (integers: exactly the floating-point sums of the plain
    computation, which are exact below 2**53) and the times of its restarts. A view of
    [lo, hi) of append-only columns: appending makes a new view in O(1) (amortized). When a
    point is not an integer below 2**52 or the times do not strictly increase (a
    hand-edited file), `stats` computes point by point."""

    __slots__ = ("_hi", "_lo", "_store")

    def __init__(self, store: _Store, lo: int, hi: int) -> None:
        self._store, self._lo, self._hi = store, lo, hi

    @classmethod
    def of(cls, points: Iterable[Point]) -> Series:
        store = _Store(points)
        return cls(store, 0, len(store.times))

    @property
    def exact(self) -> bool:
        return self._store.exact

    @property
    def points(self) -> tuple[Point, ...]:
        store, lo, hi = self._store, self._lo, self._hi
        return tuple(zip(store.times[lo:hi], store.values[lo:hi], strict=True))

    def then(self, t: float, value: float, cut: float, keep: int) -> Series:
        """This series with (t, value) appended (t after the last point), then the points
        older than `cut` and those beyond the newest `keep` dropped."""
        store, hi = self._store, self._hi
        times = store.times
        drop = self._lo
        while drop < hi and (times[drop] < cut or hi + 1 - drop > keep):
            drop += 1
        if drop == hi:  # nothing left of this series
            return Series.of(() if t < cut or keep < 1 else [(t, value)])
        appendable = hi == len(times) and store.exact and math.isfinite(t) and t > times[hi - 1]
        if not (appendable and _exact(value)):
            kept = zip(times[drop:hi], store.values[drop:hi], strict=True)
            return Series.of((*kept, (t, value)))
        if drop >= _COMPACT:  # dead points at the head of the columns: new columns
            store = store.copy(drop, hi)
            drop, hi = 0, hi - drop
        previous = store.values[hi - 1]
        store.times.append(t)
        store.values.append(value)
        store.cum.append(store.cum[hi - 1] + _counter_step(previous, value))
        if value < previous:
            store.restarts.append(t)
        return Series(store, drop, hi + 1)

    def stats(self, now: float, window: float, *, gauge: bool = False) -> TrendStats | None:
        """`stats` of this series from its running sums; point by point when they cannot
        give the exact result (a point not an exact integer, a bound not finite)."""
        store = self._store
        if not store.exact or not (math.isfinite(now) and math.isfinite(window)):
            return _stats_of_points(self.points, now, window, gauge=gauge)
        times, values = store.times, store.values
        lo = bisect_left(times, now - window, self._lo, self._hi)
        hi = bisect_right(times, now, lo, self._hi)
        if hi - lo < 2:
            return None
        first, restarts, last = lo, 0, hi - 1
        if not gauge and store.restarts:
            a = bisect_right(store.restarts, times[lo])
            b = bisect_right(store.restarts, times[last], a)
            restarts = b - a
            if restarts:
                first = bisect_left(times, store.restarts[b - 1], lo, hi) - 1
        span = times[last] - times[first]
        mid = times[first] + span / 2
        m = bisect_right(times, mid, first, hi)  # points first..m-1: up to the middle
        if gauge:
            increase = values[last] - values[first]
            older = values[m - 1] - values[first]
            step = values[m] - values[m - 1]
        else:
            # Since the last restart the steps only rise: every partial sum lies between 0
            # and the total, below 2**53 (values are under 2**52): exact as floats, so the
            # integer sums are the plain computation's float sums.
            cum = store.cum
            increase = float(cum[last] - cum[first])
            older = float(cum[m - 1] - cum[first])
            step = float(cum[m] - cum[m - 1])
        before = times[m - 1]
        if before < mid:  # the step across the middle: its share before it
            older = older + step * ((mid - before) / (times[m] - before))
        return _trend(hi - first, span, increase, older, increase - older, restarts)

    # -- Sequence[Point]

    def __len__(self) -> int:
        return self._hi - self._lo

    @overload
    def __getitem__(self, index: int) -> Point: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Point, ...]: ...

    def __getitem__(self, index: int | slice) -> Point | tuple[Point, ...]:
        store, lo, hi = self._store, self._lo, self._hi
        if isinstance(index, slice):
            start, stop, step = index.indices(hi - lo)
            if step != 1:
                return self.points[index]
            lo, hi = lo + start, lo + max(start, stop)
            return tuple(zip(store.times[lo:hi], store.values[lo:hi]))  # noqa: B905 (same length)
        i = range(lo, hi)[index]
        return store.times[i], store.values[i]

    def __iter__(self) -> Iterator[Point]:
        store, lo, hi = self._store, self._lo, self._hi
        return zip(store.times[lo:hi], store.values[lo:hi], strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Series):
            return self.points == other.points
        if isinstance(other, (tuple, list)):
            return self.points == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Series({self.points!r})"


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
        self.series: dict[str, Series] = {}
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
                str(k): Series.of([(float(t), float(v)) for t, v in pts][-self.keep :])
                for k, pts in series.items()
            }
        except (OSError, ValueError, TypeError) as exc:
            log.warning(
                "%s: trend series not restored (%s); starting empty, rewritten at the next run",
                self.path,
                exc,
            )
            self.series = {}

    def add(self, key: str, t: float, value: float, horizon: float) -> Series:
        """Append (t, value) to the series of `key`, drop its points older than `horizon`
        seconds before t and beyond the newest `keep`; the series as it is now."""
        pts = self.series.get(key) or _EMPTY
        if pts and t <= pts[-1][0]:
            self.series[key] = pts
            return pts  # a clock that stepped back: keep the series monotonic in time
        pts = self.series[key] = pts.then(t, value, t - horizon, self.keep)
        return pts

    def forget_except(self, keys: Iterable[str], now: float, horizon: float) -> None:
        """Drop series not sampled within `horizon` (a GPU replaced: its UUID is gone)."""
        keep = set(keys)
        for key in list(self.series):
            pts = self.series[key]
            if key not in keep and (not pts or pts[-1][0] < now - horizon):
                del self.series[key]

    def get(self, key: str) -> list[Point]:
        return list(self.series.get(key, ()))

    def view(self, key: str) -> Series:
        """The series of `key` as it is now (immutable: later adds make new ones)."""
        return self.series.get(key) or _EMPTY

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
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as out:
                out.write(self.dumps())
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("%s: trend series not saved: %s", self.path, exc)

    def dumps(self) -> str:
        """The file's text: {"version": 1, "series": {key: [[t, v], ...]}}."""
        series = {key: list(pts) for key, pts in self.series.items()}
        return json.dumps({"version": self.VERSION, "series": series}, separators=(",", ":"))


_EMPTY = Series.of(())


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

"""The trend statistics from a series' running sums (healthd.trends.Series) against the plain
computation point by point, kept here as it was before the running sums as the reference:
over random series built by a SeriesBook (appends, evictions past the window and past `keep`,
a clock that steps back, counter resets, gauges, NaN and fractional values, series forgotten
and begun again), after a restart from the saved file, and for any window. Equality is
exact (==, NaN equal to NaN), not within a tolerance."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import astuple
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import healthd.trends
from healthd.trends import Series, SeriesBook, TrendStats, stats

Point = tuple[float, float]
SECONDS_PER_HOUR = 3600.0
T0 = 1_800_000_000.0


# ---- the reference: the computation before the running sums, verbatim -------------------------


def ref_in_window(points: Sequence[Point], now: float, window: float) -> list[Point]:
    return [p for p in points if now - window <= p[0] <= now]


def ref_increments(
    points: Sequence[Point], *, gauge: bool = False
) -> list[tuple[float, float, float]]:
    out = []
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t1 <= t0:
            continue
        if gauge or v1 >= v0:
            out.append((t0, t1, v1 - v0))
        else:
            out.append((t0, t1, max(v1, 0.0)))
    return out


def ref_share_before(start: float, end: float, mid: float) -> float:
    if end <= mid:
        return 1.0
    if start >= mid:
        return 0.0
    return (mid - start) / (end - start)


def ref_stats(
    points: Sequence[Point], now: float, window: float, *, gauge: bool = False
) -> TrendStats | None:
    pts = sorted(ref_in_window(points, now, window))
    restarts = 0 if gauge else sum(1 for (_, v0), (_, v1) in itertools.pairwise(pts) if v1 < v0)
    if restarts:
        last = max(i for i in range(1, len(pts)) if pts[i][1] < pts[i - 1][1])
        pts = pts[last - 1 :]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    steps = ref_increments(pts, gauge=gauge)
    span = pts[-1][0] - pts[0][0]
    increase = sum(inc for _, _, inc in steps)
    mid = pts[0][0] + span / 2
    older = sum(inc * ref_share_before(a, b, mid) for a, b, inc in steps)
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


class RefBook:
    """SeriesBook.add and forget_except as they were: plain lists."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.series: dict[str, list[Point]] = {}

    def add(self, key: str, t: float, value: float, horizon: float) -> None:
        pts = self.series.setdefault(key, [])
        if pts and t <= pts[-1][0]:
            return
        pts.append((t, value))
        cut = t - horizon
        while pts and (pts[0][0] < cut or len(pts) > self.keep):
            pts.pop(0)

    def forget_except(self, keys: list[str], now: float, horizon: float) -> None:
        for key in list(self.series):
            pts = self.series[key]
            if key not in keys and (not pts or pts[-1][0] < now - horizon):
                del self.series[key]


def same(a: TrendStats | None, b: TrendStats | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(x == y or (x != x and y != y) for x, y in zip(astuple(a), astuple(b), strict=True))


# ---- random histories ---------------------------------------------------------------------------

KEYS = ("GPU-a/ecc_corrected", "GPU-a/temperature_c", "GPU-b/nvlink_crc")

# A counter's next value: mostly rising by small integers, sometimes reset (to 0 or a small
# count: a GPU reset, a driver reload), sometimes a value the sums cannot take exactly.
steps = st.one_of(
    st.tuples(st.just("rise"), st.integers(0, 50)),
    st.tuples(st.just("rise"), st.integers(0, 10**6)),
    st.tuples(st.just("reset"), st.integers(0, 5)),
    st.tuples(st.just("set"), st.integers(-(2**53), 2**53)),
    st.tuples(st.just("odd"), st.sampled_from([math.nan, 0.5, -3.25, math.inf, 1e300, -0.0])),
)
ops = st.lists(
    st.tuples(
        st.sampled_from(KEYS),
        st.one_of(st.integers(1, 90), st.just(0), st.integers(-30, -1)),  # dt: 0/back: dropped
        steps,
        st.booleans(),  # forget the other keys' stale series after this add
    ),
    max_size=60,
)


def replay(
    history: list, keep: int, horizon: float, views: list[tuple[Series, list[Point]]] | None = None
) -> tuple[SeriesBook, RefBook, float]:
    """Run `history` on a SeriesBook and on the reference book; `views` collects each
    Series the book handed out with the points it had then."""
    book, ref = SeriesBook(None, keep=keep), RefBook(keep)
    t, values = T0, dict.fromkeys(KEYS, 0.0)
    for key, dt, (kind, n), forget in history:
        t += dt
        v = values[key]
        if kind == "rise":
            v = v + n if math.isfinite(v) and abs(v) < 2**60 else float(n)
        elif kind in ("reset", "set"):
            v = float(n)
        else:
            v = float(n)
        values[key] = v
        view = book.add(key, t, v, horizon)
        ref.add(key, t, v, horizon)
        if views is not None:
            views.append((view, list(ref.series[key])))
        if forget:
            book.forget_except([key], t, horizon)
            ref.forget_except([key], t, horizon)
    return book, ref, t


def check_book(book: SeriesBook, ref: RefBook, now: float, windows: list[float]) -> None:
    assert list(book.series) == list(ref.series)
    for key, points in ref.series.items():
        series = book.view(key)
        assert repr(list(series)) == repr(points) == repr(book.get(key))  # NaN: itself
        for window, gauge, shift in itertools.product(windows, (False, True), (0.0, -45.0, 30.0)):
            expected = ref_stats(points, now + shift, window, gauge=gauge)
            assert same(stats(series, now + shift, window, gauge=gauge), expected), (
                key,
                window,
                gauge,
                shift,
            )


@settings(max_examples=300, deadline=None)
@given(
    history=ops,
    keep=st.integers(1, 12),
    horizon=st.sampled_from([0.0, 60.0, 300.0, 3600.0]),
    windows=st.lists(st.sampled_from([5.0, 90.0, 240.0, 600.0, 3600.0, 1e9]), min_size=1),
    compact=st.sampled_from([1, 2, 3, 32]),
)
def test_the_running_sums_give_exactly_the_plain_stats(
    history: list, keep: int, horizon: float, windows: list[float], compact: int
) -> None:
    saved, healthd.trends._COMPACT = healthd.trends._COMPACT, compact  # columns copied often
    try:
        views: list[tuple[Series, list[Point]]] = []
        book, ref, now = replay(history, keep, horizon, views)
        check_book(book, ref, now, windows)
        # Every Series handed out (an observation holds it) is as it was when handed out,
        # judges alike, and appending to an old one (not the book's latest) leaves it be.
        for view, points in views:
            assert repr(list(view)) == repr(points) and len(view) == len(points)
            if points:
                assert repr(view[-1]) == repr(points[-1])
                assert repr(view[-3:]) == repr(tuple(points[-3:]))
            t = points[-1][0] if points else now
            for window in windows:
                assert same(stats(view, t, window), ref_stats(points, t, window))
        for view, points in views[:3]:
            t = (points[-1][0] if points else now) + 10
            grown = view.then(t, 5.0, t - horizon, keep)
            ref_grown = RefBook(keep)
            ref_grown.series["k"] = list(points)
            ref_grown.add("k", t, 5.0, horizon)
            assert repr(list(grown)) == repr(ref_grown.series["k"])
            assert repr(list(view)) == repr(points)
    finally:
        healthd.trends._COMPACT = saved


@settings(max_examples=100, deadline=None)
@given(history=ops, keep=st.integers(2, 12), more=ops)
def test_a_book_restored_from_its_file_gives_the_same_stats_and_goes_on_alike(
    tmp_path_factory: object, history: list, keep: int, more: list
) -> None:
    path = Path(tmp_path_factory.mktemp("book")) / "trends.json"  # type: ignore[attr-defined]
    book, ref, now = replay(history, keep, 3600.0)
    book.path = path
    book.save()
    # The file is what json.dumps writes for the plain lists.
    expected = {"version": 1, "series": ref.series}
    assert path.read_text() == json.dumps(expected, separators=(",", ":"))
    again = SeriesBook(path, keep=keep)
    again.load()
    check_book(again, ref, now, [600.0, 3600.0])
    # ... and both go on to the same series and stats.
    t = now
    for key, dt, (_, n), _ in more:
        t += dt
        for b in (book, again):
            b.add(key, t, float(n), 3600.0)
        ref.add(key, t, float(n), 3600.0)
    check_book(again, ref, t, [600.0, 3600.0])
    check_book(book, ref, t, [600.0, 3600.0])


def test_a_long_steady_counter_is_judged_from_its_sums_with_resets_and_a_gauge() -> None:
    """A named case: 120 points every 10 s, a reset in the middle, the window sliding."""
    book, ref = SeriesBook(None, keep=120), RefBook(120)
    value = 0.0
    for i in range(400):
        value = 3.0 if i == 250 else value + (i % 7)
        for b in (book, ref):
            b.add("GPU-a/ecc_corrected", T0 + 10 * i, value, 3600.0)
            b.add("GPU-a/temperature_c", T0 + 10 * i, float(40 + i % 13), 3600.0)
        now = T0 + 10 * i
        if i == 260:  # the window since the reset: the step down and the 10 after it
            s = stats(book.view("GPU-a/ecc_corrected"), now, 600.0)
            assert s is not None and s.restarts == 1 and s.points == 12
        for window in (600.0, 1200.0):
            s = stats(book.view("GPU-a/ecc_corrected"), now, window)
            assert same(s, ref_stats(ref.series["GPU-a/ecc_corrected"], now, window))
            g = stats(book.view("GPU-a/temperature_c"), now, window, gauge=True)
            assert same(g, ref_stats(ref.series["GPU-a/temperature_c"], now, window, gauge=True))
    assert book.view("GPU-a/ecc_corrected").exact  # judged from the sums, not point by point


def test_a_series_view_indexes_and_slices_as_its_points_do() -> None:
    book = SeriesBook(None, keep=6)
    for i in range(20):  # the columns hold dead points before the view's first
        view = book.add("k", T0 + i, float(i), 3600.0)
    points = tuple(view)
    assert len(points) == 6 and points[0] == (T0 + 14, 14.0)
    for cut in (slice(None), slice(-3, None), slice(2, 1), slice(-20, 5), slice(5, 100)):
        assert view[cut] == points[cut], cut
    assert view[::-1] == points[::-1] and view[1:6:2] == points[1:6:2]
    assert [view[i] for i in (0, 5, -1, -6)] == [points[i] for i in (0, 5, -1, -6)]
    for outside in (6, -7):
        with pytest.raises(IndexError):
            view[outside]

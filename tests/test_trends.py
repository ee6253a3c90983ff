"""Early warning from trends: the pure trend math (hypothesis), the check's evaluate and its
decision (drain after the job: nothing requeued), the series book's persistence, and the
sensor end to end with the real pynvml against the NVML injection library."""

from __future__ import annotations

import ctypes
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.lab.nvml.build import build_library
from cli.lab.scenario import default_scenario, gpu_reset, inject, write_scenario
from healthd.checks import get
from healthd.checks.base import CheckContext, Result, Status
from healthd.checks.gpu_common import GpuContext, GpuSample, GpuSamples
from healthd.checks.gpu_trends import GpuSeries, TrendsCheck, TrendsConfig, TrendsObservation
from healthd.nvml_client import GpuInfo, PynvmlClient, Reading
from healthd.trends import SAVE_EVERY, Limits, Point, SeriesBook, describe, judge, stats
from medic_core.vocabulary import Finding, Recommendation
from remediation.decide import (
    WAITING_IDLE,
    EpisodeMove,
    FaultFacts,
    JobFacts,
    NodeFacts,
    decide_fault,
)
from remediation.policy import Rung

LIMIT = 100.0  # per hour
LIMITS = Limits({"ecc_corrected": LIMIT}, acceleration_ratio=3.0, min_points=4, min_span_s=0)
STEP = 60.0  # seconds between samples
T0 = 1_800_000_000.0


def counter(increments: list[int], start: int = 0) -> list[Point]:
    """A cumulative counter sampled every STEP seconds."""
    points, value = [(T0, float(start))], start
    for i, inc in enumerate(increments, 1):
        value += inc
        points.append((T0 + i * STEP, float(value)))
    return points


def verdict(points: list[Point], window: float = 3600.0) -> str:
    return judge("ecc_corrected", stats(points, points[-1][0], window), LIMITS)


# ---- the pure math --------------------------------------------------------------------------

steps = st.integers(min_value=4, max_value=60)


@given(n=steps, start=st.integers(0, 2**40))
def test_a_constant_counter_never_warns(n: int, start: int) -> None:
    points = counter([0] * n, start)
    s = stats(points, points[-1][0], 3600)
    assert s is not None and s.rate == 0 and s.acceleration == 0
    assert verdict(points) == ""


@given(n=steps, per_step=st.integers(0, 1))
def test_a_steady_rise_below_the_limit_never_warns(n: int, per_step: int) -> None:
    # 1 per minute = 60/h, under the 100/h limit; steady, so no acceleration either
    assert verdict(counter([per_step] * n)) == ""


@given(n=steps, per_step=st.integers(2, 50))
def test_a_steady_rise_at_the_limit_warns_on_its_rate(n: int, per_step: int) -> None:
    why = verdict(counter([per_step] * n))
    assert why.startswith("correctable ECC rising"), why


@given(
    increments=st.lists(st.integers(0, 1), min_size=6, max_size=60),
    resets=st.sets(st.integers(1, 59), max_size=4),
    before=st.integers(0, 2**32 - 1),
)
@settings(max_examples=200)
def test_a_reset_or_wrap_is_never_a_spike(
    increments: list[int], resets: set[int], before: int
) -> None:
    """A driver reload (or a 32-bit wrap) sets the counter back: the trend is judged on
    what the GPU counted since the last restart it sees, never on the drop, so its
    increase is at most the plain series'; a slow counter (at most 60/h, its limit 200/h)
    stays quiet across any number of restarts."""
    plain = counter(increments)
    points, value = [(T0, float(before))], before
    for i, inc in enumerate(increments, 1):
        value = inc if i in resets else value + inc  # restarted from 0, then counted `inc`
        points.append((T0 + i * STEP, float(value)))
    with_resets = stats(points, points[-1][0], 3600)
    without = stats(plain, plain[-1][0], 3600)
    assert with_resets is not None and without is not None
    assert 0 <= with_resets.increase <= without.increase
    slow = Limits({"ecc_corrected": 200.0}, min_points=4, min_span_s=0)
    for series in (points, plain):
        assert judge("ecc_corrected", stats(series, series[-1][0], 3600), slow) == ""


def test_a_reset_from_a_huge_count_reads_as_a_restart() -> None:
    points = [*counter([0] * 5, start=1_000_000), (T0 + 6 * STEP, 0.0), (T0 + 7 * STEP, 1.0)]
    s = stats(points, points[-1][0], 3600)
    assert s is not None and s.increase == 1 and s.restarts == 1
    assert verdict(points) == ""


def test_a_repair_starts_a_new_series_that_must_fill_before_it_warns() -> None:
    """The ladder resets the GPU: the rise before the reset no longer counts, so the
    repaired GPU is not drained again for it; a rise after the reset warns again once the
    new series holds min_points."""
    rising = counter([50] * 10)
    assert verdict(rising) != ""
    after = rising[-1][0]
    reset = [*rising, (after + STEP, 0.0), (after + 2 * STEP, 0.0)]
    assert verdict(reset) == ""  # 3 points since the restart: quiet
    again = [*reset, (after + 3 * STEP, 50.0), (after + 4 * STEP, 100.0)]
    assert verdict(again).startswith("correctable ECC rising")


@given(growth=st.floats(1.25, 1.6), n=st.integers(10, 40))
def test_an_accelerating_counter_warns_before_its_rate_reaches_the_limit(
    growth: float, n: int
) -> None:
    """Errors per minute growing geometrically: the window's recent half rises more than
    three times as fast as its older half, and the counter is caught on acceleration while
    its rate over the window is still under the limit."""
    incs = [growth**i for i in range(n)]
    points = [(T0 + i * STEP, v) for i, v in enumerate([0.0, *_cumsum(incs)])]
    s = stats(points, points[-1][0], 3600)
    assert s is not None and s.acceleration > 0
    assert s.recent_rate >= 3 * s.older_rate
    limit = s.rate * 1.5  # the rate alone would not warn
    why = judge("ecc_corrected", s, Limits({"ecc_corrected": limit}, min_points=4, min_span_s=0))
    assert "accelerating" in why, (s, why)
    steady = counter([1] * n)  # the same rule on a steady counter: quiet
    assert judge("ecc_corrected", stats(steady, steady[-1][0], 3600), Limits(
        {"ecc_corrected": 61.0}, min_points=4, min_span_s=0)) == ""  # fmt: skip


def _cumsum(values: list[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def test_too_few_points_or_too_short_a_span_does_not_warn() -> None:
    burst = counter([500, 500])
    assert verdict(burst) == ""  # 3 points: under min_points
    short = Limits({"ecc_corrected": LIMIT}, min_points=2, min_span_s=600)
    assert judge("ecc_corrected", stats(burst, burst[-1][0], 3600), short) == ""
    assert stats([(T0, 1.0)], T0, 3600) is None


def test_points_outside_the_window_do_not_count() -> None:
    old_burst = counter([5000] + [0] * 70)  # the burst is 70 minutes old
    assert verdict(old_burst, window=3600) == ""
    assert verdict(old_burst, window=7200) != ""


def test_a_gauge_counts_its_net_change_and_has_no_acceleration_rule() -> None:
    temps = [(T0 + i * STEP, float(t)) for i, t in enumerate([40, 80, 40, 80, 40])]
    limits = Limits({"temperature_c": 10.0}, min_points=4, min_span_s=0)
    s = stats(temps, temps[-1][0], 3600, gauge=True)
    assert s is not None and s.increase == 0
    assert judge("temperature_c", s, limits) == ""
    rising = [(T0 + i * STEP, 40.0 + 2 * i) for i in range(10)]
    why = judge("temperature_c", stats(rising, rising[-1][0], 3600, gauge=True), limits)
    assert why.startswith("temperature C rising 120/h")


# ---- the series book ----------------------------------------------------------------------------


def test_a_book_sampled_often_is_written_once_per_save_every(tmp_path: Path) -> None:
    path = tmp_path / "state" / "trends.json"
    book = SeriesBook(path, keep=100)
    written: list[float] = []
    for i in range(13):  # every 10 s for 2 minutes
        t = T0 + 10 * i
        book.add("GPU-a/ecc_corrected", t, float(i), horizon=3600)
        book.save_due(t)
        saved = SeriesBook(path, keep=100)
        saved.load()
        last = saved.get("GPU-a/ecc_corrected")[-1][0]
        if not written or last != written[-1]:
            written.append(last)
    assert SAVE_EVERY == 50
    assert written == [T0, T0 + 50, T0 + 100]
    path.unlink()
    book.save_due(T0 + 125)  # 25 s after the last write: held
    assert not path.exists()
    book.save_due(T0 - 100)  # the clock stepped back: written, not held for SAVE_EVERY
    assert path.exists()


def test_the_series_survive_a_restart_and_a_bad_file_is_an_empty_book(tmp_path: Path) -> None:
    path = tmp_path / "state" / "trends.json"
    book = SeriesBook(path, keep=5)
    for i in range(8):
        book.add("GPU-a/ecc_corrected", T0 + i, float(i), horizon=3600)
    book.add("GPU-a/ecc_corrected", T0 + 3, 99.0, horizon=3600)  # clock stepped back: dropped
    book.save()
    again = SeriesBook(path, keep=5)
    again.load()
    assert again.get("GPU-a/ecc_corrected") == [(T0 + i, float(i)) for i in range(3, 8)]
    path.write_text("{not json")
    broken = SeriesBook(path)
    broken.load()
    assert broken.series == {}
    path.write_text(json.dumps({"version": 9, "series": {}}))
    broken.load()
    assert broken.series == {}


def test_old_points_and_gone_gpus_are_forgotten() -> None:
    book = SeriesBook(None, keep=100)
    book.add("GPU-old/ecc_corrected", T0, 1.0, horizon=600)
    book.add("GPU-new/ecc_corrected", T0, 1.0, horizon=600)
    book.add("GPU-new/ecc_corrected", T0 + 700, 2.0, horizon=600)
    assert book.get("GPU-new/ecc_corrected") == [(T0 + 700, 2.0)]
    book.forget_except(["GPU-new/ecc_corrected"], T0 + 700, 600)
    assert list(book.series) == ["GPU-new/ecc_corrected"]


def test_describe_is_one_compact_line() -> None:
    line = describe("ecc_corrected", [[T0, 0], [T0 + 60, 12], [T0 + 120, 40]], 1200.0)
    assert line == "correctable ECC: 0 12 40 (1200/h)"


# ---- evaluate and the decision ---------------------------------------------------------------


def observation(series: dict[str, list[Point]], now: float) -> TrendsObservation:
    info = GpuInfo(2, "GPU-2", "1654", "NVIDIA H100 80GB HBM3", "0000:3a:00.0")
    gpu = GpuSeries({k: tuple(v) for k, v in series.items()})
    return TrendsObservation(GpuSamples(Reading(3), (GpuSample(2, info, Reading(gpu)),)), now)


CFG = TrendsConfig(window=600, min_span=60, min_points=4)


def rising_ecc() -> Result:
    points = counter([0, 0, 10, 40, 90, 160])
    quiet = counter([0] * 6)
    obs = observation(
        {"ecc_corrected": points, "pcie_replay": quiet, "temperature_c": quiet}, points[-1][0]
    )
    (result,) = TrendsCheck.evaluate(obs, CFG)
    return result


def test_a_rising_counter_is_a_warn_asking_for_drain_after_job_with_the_series() -> None:
    result = rising_ecc()
    assert (result.status, result.fault_class, result.target) == (
        Status.WARN,
        "gpu.trend.ecc_corrected",
        "2",
    )
    assert result.remediation is Recommendation.DRAIN_AFTER_JOB
    assert result.evidence["recommendation"] == "drain_after_job"
    assert result.evidence["rising"] == ["ecc_corrected"]
    assert result.evidence["series"]["ecc_corrected"][-1] == [round(T0 + 6 * STEP), 300]
    assert result.evidence["rates_per_hour"]["pcie_replay"] == 0
    assert "drain after the running job" in result.message
    assert result.evidence["uuid"] == "GPU-2"


def test_quiet_counters_are_ok_and_config_turns_a_counter_off() -> None:
    quiet = counter([0] * 6)
    (ok,) = TrendsCheck.evaluate(observation({"ecc_corrected": quiet}, quiet[-1][0]), CFG)
    assert ok.status is Status.OK and ok.message == "GPU 2: no counter rising"
    off = TrendsConfig(window=600, min_span=60, rate_per_hour={"ecc_corrected": 0})
    points = counter([0, 0, 10, 40, 90, 160])
    (r,) = TrendsCheck.evaluate(observation({"ecc_corrected": points}, points[-1][0]), off)
    assert r.status is Status.OK


def test_the_decision_drains_after_the_job_and_requeues_nothing() -> None:
    """Through the one decision core: drained now (Slurm: DRAINING while the job runs), the
    running job, resilient or not, neither requeued nor given a note; the episode waits
    for idle and starts at a GPU reset."""
    result = rising_ecc()
    finding = Finding.from_json(
        {
            "check": result.check,
            "status": result.status.value,
            "fault_class": result.fault_class,
            "target": result.target,
            "message": result.message,
            "evidence": dict(result.evidence),
        }
    )
    jobs = (
        JobFacts("41", "RUNNING", budget=3, requeue=True, pinned=False),
        JobFacts("42", "RUNNING", budget=None, requeue=False, pinned=False),
    )
    d = decide_fault([finding], FaultFacts("n1", NodeFacts(), jobs))
    assert d.drain and d.jobs == () and d.requeued == ()
    assert (d.episode, d.state, d.rung) == (EpisodeMove.OPEN, WAITING_IDLE, Rung.GPU_RESET)
    assert d.recommendation is Recommendation.DRAIN_AFTER_JOB
    assert d.reason.startswith("medic: gpu.trend.ecc_corrected")
    # the drain cap and someone else's drain hold as for any fault
    theirs = FaultFacts("n1", NodeFacts(drained=True, reason="admin: bios"), jobs)
    kept = decide_fault([finding], theirs)
    assert not kept.drain and kept.jobs == () and "someone else" in kept.why


# ---- the sensor: the real pynvml against the injection library ---------------------------------


@pytest.fixture(scope="session")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_library(tmp_path_factory.mktemp("nvml"))
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # before pynvml's first nvmlInit
    return path


class StepClock:
    def __init__(self) -> None:
        self.t = T0

    def monotonic(self) -> float:
        return self.t

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.t, dt.UTC)


@pytest.fixture
def client(
    nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[PynvmlClient, Path]]:
    path = tmp_path / "scenario.txt"
    write_scenario(path, default_scenario("trend-test", 4))
    monkeypatch.setenv("NVML_INJECT_SCENARIO", str(path))
    c = PynvmlClient(call_timeout=2.0).open()
    try:
        yield c, path
    finally:
        c.close()


def test_the_sensor_reads_every_counter_through_pynvml(
    client: tuple[PynvmlClient, Path],
) -> None:
    nvml, path = client
    s = default_scenario("trend-test", 4)
    for spec in ("ecc.sbe=7", "pcie.replay=3", "nvlink.crc_flit=4", "nvlink.crc_data=1"):
        s = inject(s, 1, spec)
    for spec in ("nvlink.replay=2", "nvlink.recovery=1", "violation.thermal=2500"):
        s = inject(s, 1, spec)
    s = inject(inject(inject(s, 1, "remap.correctable=2"), 1, "retired.sbe=1"), 1, "temperature=71")
    write_scenario(path, s)
    got = nvml.trend_counters(1).values()
    assert got == {
        "ecc_corrected": 7,
        "remapped_rows": 2,
        "retired_pages": 1,
        "pcie_replay": 3,
        "nvlink_crc": 5,
        "nvlink_replay": 3,
        "throttle_ms": 2500,
    }
    assert set(nvml.trend_counters(0).values().values()) == {0}


def test_the_check_warns_as_ecc_rises_step_by_step_and_a_restart_keeps_the_series(
    client: tuple[PynvmlClient, Path], tmp_path: Path
) -> None:
    nvml, path = client
    clock = StepClock()
    ctx = CheckContext.for_root(
        tmp_path, nvml=GpuContext(nvml), clock=clock, state_dir=tmp_path / "state"
    )
    spec = get("gpu_trends")
    cfg = TrendsConfig(window=600, min_span=120, min_points=4)
    check = spec.create()
    s = default_scenario("trend-test", 4)
    statuses = []
    for step, add in enumerate([0, 0, 5, 10, 20, 40, 80]):
        if add:
            s = inject(s, 2, f"ecc.sbe={add}")
            write_scenario(path, s)
        if step == 4:  # the daemon restarts: a new check instance reads the saved series
            check = spec.create()
        results = check.evaluate(check.gather(ctx, cfg), cfg)
        statuses.append(next(r for r in results if r.target == "2").status)
        assert all(r.status is Status.OK for r in results if r.target != "2")
        clock.t += STEP
    # quiet until the window holds 4 points; then 15 in 3 minutes (300/h) warns, and on
    assert statuses[:3] == [Status.OK] * 3 and statuses[3:] == [Status.WARN] * 4
    warn = next(r for r in results if r.target == "2")
    assert [v for _, v in warn.evidence["series"]["ecc_corrected"]] == [0, 5, 15, 35, 75, 155]
    assert warn.evidence["series"]["temperature_c"][-1][1] == 33  # the thermal call's reading
    assert (tmp_path / "state" / "trends.json").is_file()
    # a GPU reset sets the counter back to 0: not a spike; quiet again once the window passes
    write_scenario(path, gpu_reset(s, 2))
    for _ in range(11):
        results = check.evaluate(check.gather(ctx, cfg), cfg)
        clock.t += STEP
    assert next(r for r in results if r.target == "2").status is Status.OK

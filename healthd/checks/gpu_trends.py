"""Early warning from trends: short series of the GPU counters that rise before a failure
(correctable ECC, remapped rows, retired pages, PCIe replays, NVLink CRC and replay errors,
clock-throttle time, temperature), and a WARN when one rises too fast or accelerates.

The WARN asks for a planned action, `drain_after_job`: the decision core drains the node
(Slurm lets the running job finish: DRAINING, nothing is requeued or killed), then the
ladder takes the GPU (a reset once idle, the re-qualification checks, back to service or
up the ladder). Gather samples NVML and keeps the series (healthd.trends.SeriesBook: in
memory, and in `<state_dir>/trends.json` so a restart keeps them); evaluate is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Result,
    Status,
    Tier,
    bounds,
    register,
    setting,
)
from healthd.checks.gpu_common import (
    GpuSample,
    GpuSamples,
    GpuSteps,
    count_problem,
    gpu_context,
    gpu_fault,
    gpu_ok,
    no_gpus,
    problem_result,
    sweep_gpus,
)
from healthd.nvml_types import Problem, Reading, Thermal, TrendCounters
from healthd.trends import (
    COUNTERS,
    GAUGES,
    Limits,
    Point,
    SeriesBook,
    book_for,
    compact,
    judge,
    stats,
)

NAME = "gpu_trends"
STATE_FILE = "trends.json"
ACTION = "drain_after_job"

# Rates (per hour, over the window) at which a counter warns; 0 turns a counter off. The
# temperature has none by default: it follows the load; a site that wants one sets it.
DEFAULT_RATES: Mapping[str, float] = {
    "ecc_corrected": 100.0,
    "remapped_rows": 2.0,
    "retired_pages": 2.0,
    "pcie_replay": 60.0,
    "nvlink_crc": 100.0,
    "nvlink_replay": 10.0,
    "throttle_ms": 300_000.0,  # held down 5 minutes an hour
}


@dataclass(frozen=True, kw_only=True)
class TrendsConfig(CheckConfig):
    window: float = setting(3600, minimum=5, doc="seconds of series a trend is judged over")
    min_span: float = setting(
        600, minimum=0, doc="seconds the series must cover before it may warn"
    )
    min_points: int = setting(4, minimum=2, doc="points the window must hold before it may warn")
    keep: int = setting(120, minimum=4, maximum=10_000, doc="points kept per GPU and counter")
    acceleration_ratio: float = setting(
        3.0,
        minimum=1.0,
        doc="warn when the window's recent half rises this many times as fast as its older"
        " half (and at half the rate limit or more)",
    )
    rate_per_hour: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_RATES),
        metadata=bounds(
            minimum=0,
            keys=tuple(COUNTERS),
            doc="per counter, the rate per hour that warns (merged over the defaults; 0: off)",
        ),
    )

    def limits(self) -> Limits:
        rates = {**DEFAULT_RATES, **self.rate_per_hour}
        return Limits(
            rate_per_hour={k: v for k, v in rates.items() if v > 0},
            acceleration_ratio=self.acceleration_ratio,
            min_points=self.min_points,
            min_span_s=self.min_span,
        )


class TrendSource(Protocol):
    def trend_counters(self, index: int) -> TrendCounters: ...


@dataclass(frozen=True)
class GpuSeries:
    """One GPU's series inside the window, by counter (only counters it supports): the
    book's immutable `Series` (stats from running sums), or plain points."""

    series: Mapping[str, Sequence[Point]]


@dataclass(frozen=True)
class TrendsObservation:
    samples: GpuSamples[GpuSeries]
    now: float  # unix seconds of this run's sample


def series_key(sample: GpuSample[Any], counter: str) -> str:
    gpu = sample.info.uuid if sample.info is not None else f"index:{sample.index}"
    return f"{gpu}/{counter}"


@register(
    name=NAME,
    tiers=(Tier.PERIODIC,),
    interval=60,
    timeout=10,
    needs=("nvml",),
    faults={
        f"gpu.trend.{counter}": Fault(
            Status.WARN, f"{label} rising too fast or accelerating on one GPU", ACTION
        )
        for counter, label in COUNTERS.items()
    },
)
class TrendsCheck(Check[TrendsObservation, TrendsConfig]):
    """Early warning: GPU counters rising before a failure; drain after the running job."""

    config_type = TrendsConfig

    def __init__(self) -> None:
        self._book: SeriesBook | None = None

    def gather(self, ctx: CheckContext, cfg: TrendsConfig) -> TrendsObservation:
        now = ctx.clock.now().timestamp()
        client: Any = gpu_context(ctx).client
        if not hasattr(client, "trend_counters"):
            missing: Reading[int] = Reading(
                None, Problem.NOT_SUPPORTED, "this NVML client reads no trend counters"
            )
            return TrendsObservation(GpuSamples(missing), now)
        source: TrendSource = client

        def steps(index: int) -> GpuSteps[tuple[TrendCounters, Thermal | None]]:
            counters: Reading[TrendCounters] = yield partial(source.trend_counters, index)
            if counters.value is None:
                return Reading(None, counters.problem, counters.detail)
            # The temperature through the thermal check's own call: a hung temperature
            # read (remembered by the client) costs the other counters nothing.
            thermal: Reading[Thermal] = yield partial(client.thermal, index)
            return Reading((counters.value, thermal.value))

        raw = sweep_gpus(client, steps)
        path = ctx.state_dir / STATE_FILE if ctx.state_dir is not None else None
        book = self._book = book_for(self._book, path, cfg.keep)
        horizon = max(cfg.window, cfg.min_span)
        samples = []
        for s in raw.samples:
            if s.reading.value is None:
                samples.append(
                    GpuSample(
                        s.index,
                        s.info,
                        Reading[GpuSeries](None, s.reading.problem, s.reading.detail),
                    )
                )
                continue
            series: dict[str, Sequence[Point]] = {}
            counters, thermal = s.reading.value
            values: dict[str, int | None] = {
                **counters.values(),
                "temperature_c": thermal.temperature_c if thermal is not None else None,
            }
            for counter, value in values.items():
                if value is None:
                    continue
                series[counter] = book.add(series_key(s, counter), now, float(value), horizon)
            samples.append(GpuSample(s.index, s.info, Reading(GpuSeries(series))))
        sampled = [series_key(s, c) for s in raw.samples for c in COUNTERS]
        book.forget_except(sampled, now, horizon)
        book.save_due(now)
        return TrendsObservation(GpuSamples(raw.count, tuple(samples)), now)

    @staticmethod
    def evaluate(observation: TrendsObservation, cfg: TrendsConfig) -> list[Result]:
        failed = count_problem(NAME, observation.samples)
        if failed is not None:
            if observation.samples.count.problem is Problem.NOT_SUPPORTED:
                return [Result(NAME, Status.NOT_APPLICABLE, None, None, "no trend counters", {})]
            return failed
        if not observation.samples.samples:
            return no_gpus(NAME)
        limits = cfg.limits()
        results: list[Result] = []
        for sample in observation.samples.samples:
            gpu = sample.reading.value
            if gpu is None:
                results.append(
                    problem_result(
                        NAME,
                        "the trend counters",
                        sample.reading,
                        target=sample.target,
                        evidence=sample.evidence(),
                    )
                )
                continue
            results.append(_judge_gpu(sample, gpu, observation.now, cfg, limits))
        return results


def _judge_gpu(
    sample: GpuSample[GpuSeries], gpu: GpuSeries, now: float, cfg: TrendsConfig, limits: Limits
) -> Result:
    found = {
        counter: stats(points, now, cfg.window, gauge=counter in GAUGES)
        for counter, points in gpu.series.items()
    }
    rising = [(c, why) for c in COUNTERS if c in found if (why := judge(c, found[c], limits))]
    rates = {c: None if s is None else round(s.rate, 3) for c, s in found.items()}
    evidence = sample.evidence(
        series={c: compact(points) for c, points in gpu.series.items()},
        rates_per_hour=rates,
        window_s=cfg.window,
    )
    if not rising:
        return gpu_ok(
            NAME, f"GPU {sample.index}: no counter rising", target=sample.target, evidence=evidence
        )
    first = rising[0][0]
    return gpu_fault(
        NAME,
        Status.WARN,
        f"gpu.trend.{first}",
        f"GPU {sample.index}: {'; '.join(why for _, why in rising)}:"
        " drain after the running job, then the ladder",
        recommendation=ACTION,
        target=sample.target,
        evidence={**evidence, "rising": [c for c, _ in rising]},
    )

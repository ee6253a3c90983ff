"""Early warning from the host's counters: short series of EDAC correctable memory errors
(every memory controller, summed) and InfiniBand symbol errors, link-downs and link error
recoveries (per port), read from /sys below the host root, judged with the same trend math
as `gpu_trends` (healthd.trends: rate and acceleration over a window; a counter that steps
down restarted).

A rising host counter is a WARN reported only (recommendation `none`): Medic's repair rungs
are GPU repairs, none of which mends a DIMM or a cable, so the series go to a human (in
`medic node show`, the store and the metrics) instead of a drain. The series are kept in
memory and in `<state_dir>/host_trends.json`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Recommendation,
    Result,
    Status,
    Tier,
    bounds,
    not_applicable,
    ok,
    register,
    setting,
)
from healthd.hostfs import list_dir, read_int
from healthd.trends import Limits, Point, SeriesBook, book_for, compact, judge, stats

NAME = "host_trends"
STATE_FILE = "host_trends.json"
EDAC_DIR = "sys/devices/system/edac/mc"
IB_DIR = "sys/class/infiniband"
IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery")
COUNTERS = ("edac_ce", *IB_COUNTERS)
LABELS: Mapping[str, str] = {
    "edac_ce": "EDAC correctable errors",
    "symbol_error": "IB symbol errors",
    "link_downed": "IB link-downs",
    "link_error_recovery": "IB link recoveries",
}
# The fault class of each counter's warning, in its subsystem's area.
FAULT_CLASSES: Mapping[str, str] = {
    "edac_ce": "mem.trend.edac_ce",
    "symbol_error": "ib.trend.symbol_error",
    "link_downed": "ib.trend.link_downed",
    "link_error_recovery": "ib.trend.link_error_recovery",
}
DEFAULT_RATES: Mapping[str, float] = {
    "edac_ce": 60.0,
    "symbol_error": 60.0,
    "link_downed": 2.0,
    "link_error_recovery": 10.0,
}


@dataclass(frozen=True, kw_only=True)
class HostTrendsConfig(CheckConfig):
    window: float = setting(3600, minimum=5, doc="seconds of series a trend is judged over")
    min_span: float = setting(
        600, minimum=0, doc="seconds the series must cover before it may warn"
    )
    min_points: int = setting(4, minimum=2, doc="points the window must hold before it may warn")
    keep: int = setting(120, minimum=4, maximum=10_000, doc="points kept per target and counter")
    acceleration_ratio: float = setting(
        3.0, minimum=1.0, doc="as gpu_trends: the recent half's rate over the older half's"
    )
    rate_per_hour: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_RATES),
        metadata=bounds(
            minimum=0,
            keys=COUNTERS,
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


@dataclass(frozen=True)
class HostTrendsObservation:
    # target ("edac", "mlx5_0/1") -> counter -> the points kept
    series: Mapping[str, Mapping[str, Sequence[Point]]]
    now: float
    unreadable: Mapping[str, str] = field(default_factory=dict)  # file -> why


def read_counters(ctx: CheckContext) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """Counters by target now, and the files that could not be read (with why)."""
    root = ctx.roots.root
    found: dict[str, dict[str, int]] = {}
    problems: dict[str, str] = {}
    controllers = [m for m in list_dir(root, EDAC_DIR) or [] if re.fullmatch(r"mc\d+", m)]
    total, seen = 0, False
    for mc in controllers:
        rel = f"{EDAC_DIR}/{mc}/ce_count"
        try:
            value = read_int(root, rel)
        except (OSError, ValueError) as exc:
            problems[rel] = str(exc)
            continue
        if value is not None:
            total, seen = total + value, True
    if seen:
        found["edac"] = {"edac_ce": total}
    for hca in list_dir(root, IB_DIR) or []:
        for port in list_dir(root, f"{IB_DIR}/{hca}/ports") or []:
            if not port.isdigit():
                continue
            counters: dict[str, int] = {}
            for name in IB_COUNTERS:
                rel = f"{IB_DIR}/{hca}/ports/{port}/counters/{name}"
                try:
                    value = read_int(root, rel)
                except (OSError, ValueError) as exc:
                    problems[rel] = str(exc)
                    continue
                if value is not None:
                    counters[name] = value
            if counters:
                found[f"{hca}/{port}"] = counters
    return found, problems


@register(
    name=NAME,
    tiers=(Tier.PERIODIC,),
    interval=60,
    timeout=10,
    needs=("host",),
    faults={
        FAULT_CLASSES[counter]: Fault(
            Status.WARN, f"{label} rising too fast or accelerating (reported only)", "none"
        )
        for counter, label in LABELS.items()
    },
)
class HostTrendsCheck(Check[HostTrendsObservation, HostTrendsConfig]):
    """Early warning: EDAC correctable and InfiniBand error counters rising; reported only."""

    config_type = HostTrendsConfig

    def __init__(self) -> None:
        self._book: SeriesBook | None = None

    def gather(self, ctx: CheckContext, cfg: HostTrendsConfig) -> HostTrendsObservation:
        now = ctx.clock.now().timestamp()
        path = ctx.state_dir / STATE_FILE if ctx.state_dir is not None else None
        book = self._book = book_for(self._book, path, cfg.keep)
        horizon = max(cfg.window, cfg.min_span)
        counters, problems = read_counters(ctx)
        series: dict[str, dict[str, Sequence[Point]]] = {}
        for target, values in counters.items():
            for counter, value in values.items():
                points = book.add(f"{target}/{counter}", now, float(value), horizon)
                series.setdefault(target, {})[counter] = points
        book.forget_except(
            [f"{t}/{c}" for t, values in counters.items() for c in values], now, horizon
        )
        book.save_due(now)
        return HostTrendsObservation(series, now, problems)

    @staticmethod
    def evaluate(observation: HostTrendsObservation, cfg: HostTrendsConfig) -> list[Result]:
        if not observation.series:
            return [
                not_applicable(
                    NAME,
                    "no EDAC memory controller and no InfiniBand port counters",
                    {"unreadable": dict(observation.unreadable)},
                )
            ]
        limits = cfg.limits()
        results = []
        for target in sorted(observation.series):
            results.append(_judge(target, observation.series[target], observation.now, cfg, limits))
        return results


def _judge(
    target: str,
    series: Mapping[str, Sequence[Point]],
    now: float,
    cfg: HostTrendsConfig,
    limits: Limits,
) -> Result:
    found = {c: stats(points, now, cfg.window) for c, points in series.items()}
    rising = []
    for counter in COUNTERS:
        if counter in found and (why := judge(counter, found[counter], limits)):
            rising.append((counter, why.replace(counter, LABELS[counter], 1)))
    evidence: dict[str, Any] = {
        "series": {c: compact(points) for c, points in series.items()},
        "rates_per_hour": {c: None if s is None else round(s.rate, 3) for c, s in found.items()},
        "window_s": cfg.window,
    }
    if not rising:
        return ok(NAME, f"{target}: no counter rising", target=target, evidence=evidence)
    return Result(
        NAME,
        Status.WARN,
        FAULT_CLASSES[rising[0][0]],
        target,
        f"{target}: {'; '.join(why for _, why in rising)}",
        {**evidence, "rising": [c for c, _ in rising], "recommendation": "none"},
        Recommendation.NONE,
    )

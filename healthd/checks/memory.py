"""Memory: MemTotal against the installed size, and EDAC error counts per memory controller."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Result,
    Status,
    Tier,
    fault,
    ok,
    register,
    setting,
)
from healthd.hostfs import list_dir, read_int, read_text

NAME = "memory"
EDAC_DIR = "sys/devices/system/edac/mc"
_MEMTOTAL = re.compile(r"^MemTotal:\s+(\d+)\s+kB\s*$", re.MULTILINE)
KIB_PER_GIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class MemoryConfig(CheckConfig):
    expected_gib: float | None = setting(
        None, minimum=0, doc="installed memory in GiB (e.g. 2048); unset = do not compare"
    )
    tolerance_percent: float = setting(
        3.0,
        minimum=0,
        maximum=50,
        doc="MemTotal may be this much below expected_gib (firmware and kernel reserve some)",
    )
    ce_per_hour: float = setting(
        100.0, minimum=0, doc="corrected-error rate per memory controller before WARN"
    )


@dataclass(frozen=True)
class EdacCounts:
    ce: int
    ue: int


@dataclass(frozen=True)
class MemoryObservation:
    memtotal_kib: int | None  # None: /proc/meminfo has no MemTotal
    edac: Mapping[str, EdacCounts] | None  # by controller ("mc0"); None: EDAC absent
    at: float  # monotonic seconds when read
    previous_edac: Mapping[str, EdacCounts] | None = None
    previous_at: float | None = None
    notes: Mapping[str, str] = field(default_factory=dict)


def parse_memtotal_kib(meminfo: str) -> int | None:
    match = _MEMTOTAL.search(meminfo)
    return int(match.group(1)) if match else None


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=300,
    timeout=5,
    faults={
        "mem.total.low": Fault(
            Status.CRITICAL, "MemTotal below expected_gib minus tolerance_percent"
        ),
        "mem.edac.ue": Fault(
            Status.CRITICAL,
            "a memory controller's ue_count is above 0 (uncorrected errors since boot)",
        ),
        "mem.edac.ce_rate": Fault(
            Status.WARN,
            "a controller's corrected errors per hour since the last run exceed ce_per_hour",
        ),
        "check.read_error": Fault(Status.UNKNOWN, "/proc/meminfo has no MemTotal"),
    },
)
class MemoryCheck(Check[MemoryObservation, MemoryConfig]):
    """Memory size against expectation; EDAC uncorrected errors and corrected-error rate."""

    config_type = MemoryConfig

    def __init__(self) -> None:
        self._previous: tuple[dict[str, EdacCounts], float] | None = None

    def gather(self, ctx: CheckContext, cfg: MemoryConfig) -> MemoryObservation:
        meminfo = read_text(ctx.roots.proc, "meminfo")
        if meminfo is None:
            raise FileNotFoundError(f"{ctx.roots.proc / 'meminfo'} is missing")
        edac: dict[str, EdacCounts] | None = None
        controllers = list_dir(ctx.roots.root, EDAC_DIR)
        if controllers is not None:
            edac = {}
            for mc in controllers:
                if not re.fullmatch(r"mc\d+", mc):
                    continue
                ce = read_int(ctx.roots.root, f"{EDAC_DIR}/{mc}/ce_count")
                ue = read_int(ctx.roots.root, f"{EDAC_DIR}/{mc}/ue_count")
                if ce is not None and ue is not None:
                    edac[mc] = EdacCounts(ce, ue)
        at = ctx.clock.monotonic()
        previous, previous_at = self._previous or (None, None)
        if edac is not None:
            self._previous = (edac, at)
        return MemoryObservation(parse_memtotal_kib(meminfo), edac, at, previous, previous_at)

    @staticmethod
    def evaluate(observation: MemoryObservation, cfg: MemoryConfig) -> list[Result]:
        results: list[Result] = []
        kib = observation.memtotal_kib
        gib = None if kib is None else kib / KIB_PER_GIB
        if gib is None:
            results.append(
                fault(
                    NAME,
                    Status.UNKNOWN,
                    "check.read_error",
                    "/proc/meminfo has no MemTotal line",
                )
            )
        elif cfg.expected_gib is not None:
            floor = cfg.expected_gib * (1 - cfg.tolerance_percent / 100)
            evidence = {
                "memtotal_kib": kib,
                "memtotal_gib": round(gib, 1),
                "expected_gib": cfg.expected_gib,
                "floor_gib": round(floor, 1),
            }
            if gib < floor:
                results.append(
                    fault(
                        NAME,
                        Status.CRITICAL,
                        "mem.total.low",
                        f"MemTotal {gib:.1f} GiB is below {floor:.1f} GiB "
                        f"({cfg.expected_gib:g} GiB - {cfg.tolerance_percent:g}%)",
                        evidence=evidence,
                    )
                )
            else:
                results.append(ok(NAME, f"MemTotal {gib:.1f} GiB", evidence=evidence))
        else:
            results.append(ok(NAME, f"MemTotal {gib:.1f} GiB", evidence={"memtotal_kib": kib}))

        edac = observation.edac or {}
        previous = observation.previous_edac or {}
        hours = None
        if observation.previous_at is not None:
            hours = (observation.at - observation.previous_at) / 3600
        for mc, counts in sorted(edac.items()):
            if counts.ue > 0:
                results.append(
                    fault(
                        NAME,
                        Status.CRITICAL,
                        "mem.edac.ue",
                        f"{mc}: {counts.ue} uncorrected memory errors since boot",
                        target=mc,
                        evidence={"ue_count": counts.ue, "ce_count": counts.ce},
                    )
                )
            before = previous.get(mc)
            if before is None or not hours or hours <= 0 or counts.ce < before.ce:
                continue
            rate = (counts.ce - before.ce) / hours
            if rate > cfg.ce_per_hour:
                results.append(
                    fault(
                        NAME,
                        Status.WARN,
                        "mem.edac.ce_rate",
                        f"{mc}: {counts.ce - before.ce} corrected errors in "
                        f"{hours * 60:.1f} min ({rate:.0f}/h, limit {cfg.ce_per_hour:g}/h)",
                        target=mc,
                        evidence={
                            "ce_before": before.ce,
                            "ce_now": counts.ce,
                            "per_hour": round(rate, 1),
                            "limit_per_hour": cfg.ce_per_hour,
                        },
                    )
                )
        return results

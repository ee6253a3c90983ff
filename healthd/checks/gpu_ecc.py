"""GPU ECC error counters (NVML): uncorrectable (double-bit) errors, volatile and lifetime,
and correctable (single-bit) errors over a threshold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    Fault,
    Result,
    Status,
    Tier,
    register,
    setting,
)
from healthd.checks.gpu_common import (
    GpuSample,
    GpuSamples,
    evaluate_each,
    gpu_context,
    gpu_fault,
    sample_gpus,
)
from healthd.nvml_types import EccCounts

NAME = "gpu_ecc"


@dataclass(frozen=True, kw_only=True)
class GpuEccConfig(CheckConfig):
    volatile_dbe_limit: int = setting(
        0, minimum=0, doc="volatile uncorrectable errors tolerated before CRITICAL gpu.ecc.dbe"
    )
    aggregate_dbe_growth_limit: int = setting(
        0, minimum=0, doc="growth of the lifetime uncorrectable count between runs before CRITICAL"
    )
    aggregate_dbe_limit: int | None = setting(
        None, minimum=0, doc="lifetime uncorrectable errors before CRITICAL (default: off)"
    )
    volatile_sbe_limit: int = setting(
        1000, minimum=0, doc="volatile correctable errors before WARN gpu.ecc.sbe"
    )


@dataclass(frozen=True)
class GpuEccObservation:
    samples: GpuSamples[EccCounts]
    previous: Mapping[str, EccCounts] | None = None  # by GPU key (UUID, else index)


def gpu_key(sample: GpuSample[Any]) -> str:
    return sample.info.uuid if sample.info is not None else f"index:{sample.index}"


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=60,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.ecc.dbe": Fault(
            Status.CRITICAL,
            "uncorrectable ECC errors over the volatile, growth or lifetime limits",
            "gpu_reset",
        ),
        "gpu.ecc.sbe": Fault(
            Status.WARN, "volatile correctable ECC errors over volatile_sbe_limit", "none"
        ),
    },
)
class GpuEccCheck(Check[GpuEccObservation, GpuEccConfig]):
    """GPU ECC: uncorrectable errors (CRITICAL), correctable errors over a threshold (WARN)."""

    config_type = GpuEccConfig

    def __init__(self) -> None:
        self._previous: dict[str, EccCounts] | None = None

    def gather(self, ctx: CheckContext, cfg: GpuEccConfig) -> GpuEccObservation:
        client = gpu_context(ctx).client
        samples = sample_gpus(client, client.ecc_counts)
        observation = GpuEccObservation(samples, self._previous)
        current = {gpu_key(s): s.reading.value for s in samples.samples if s.reading.value}
        self._previous = {**(self._previous or {}), **current}
        return observation

    @staticmethod
    def evaluate(observation: GpuEccObservation, cfg: GpuEccConfig) -> list[Result]:
        def judge(sample: GpuSample[EccCounts], ecc: EccCounts) -> list[Result]:
            before = (observation.previous or {}).get(gpu_key(sample))
            ev = sample.evidence(**_counts(ecc))
            found: list[Result] = []
            growth = ecc.aggregate_dbe - before.aggregate_dbe if before else 0
            why = []
            if ecc.volatile_dbe > cfg.volatile_dbe_limit:
                why.append(f"{ecc.volatile_dbe} volatile uncorrectable ECC errors")
            if growth > cfg.aggregate_dbe_growth_limit:
                why.append(f"{growth} new lifetime uncorrectable ECC errors since the last run")
            if cfg.aggregate_dbe_limit is not None and ecc.aggregate_dbe > cfg.aggregate_dbe_limit:
                why.append(
                    f"{ecc.aggregate_dbe} lifetime uncorrectable ECC errors"
                    f" (limit {cfg.aggregate_dbe_limit})"
                )
            if why:
                found.append(
                    gpu_fault(
                        NAME,
                        Status.CRITICAL,
                        "gpu.ecc.dbe",
                        f"GPU {sample.index}: {'; '.join(why)}",
                        recommendation="gpu_reset",
                        target=sample.target,
                        evidence={**ev, "aggregate_dbe_growth": growth},
                    )
                )
            if ecc.volatile_sbe > cfg.volatile_sbe_limit:
                found.append(
                    gpu_fault(
                        NAME,
                        Status.WARN,
                        "gpu.ecc.sbe",
                        f"GPU {sample.index}: {ecc.volatile_sbe} volatile correctable ECC errors"
                        f" (limit {cfg.volatile_sbe_limit})",
                        recommendation="none",
                        target=sample.target,
                        evidence={**ev, "limit": cfg.volatile_sbe_limit},
                    )
                )
            return found

        return evaluate_each(
            NAME,
            "ECC counters",
            observation.samples,
            judge,
            lambda e: f"ECC volatile sbe={e.volatile_sbe} dbe={e.volatile_dbe}",
            _counts,
        )


def _counts(ecc: EccCounts) -> dict[str, int]:
    return {
        "volatile_sbe": ecc.volatile_sbe,
        "volatile_dbe": ecc.volatile_dbe,
        "aggregate_sbe": ecc.aggregate_sbe,
        "aggregate_dbe": ecc.aggregate_dbe,
    }

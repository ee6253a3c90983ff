"""Persistence mode (NVML): off means the driver tears GPU state down between clients,
slowing every job start and hiding errors; WARN."""

from __future__ import annotations

from dataclasses import dataclass

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

NAME = "gpu_persistence"


@dataclass(frozen=True, kw_only=True)
class GpuPersistenceConfig(CheckConfig):
    status: str = setting("WARN", choices=("WARN", "CRITICAL"), doc="status when it is off")


@dataclass(frozen=True)
class GpuPersistenceObservation:
    samples: GpuSamples[bool]


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=300,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.persistence.off": Fault(
            (Status.WARN, Status.CRITICAL), "persistence mode is off (status: status)", "none"
        )
    },
)
class GpuPersistenceCheck(Check[GpuPersistenceObservation, GpuPersistenceConfig]):
    """GPU persistence mode is on."""

    config_type = GpuPersistenceConfig

    def gather(self, ctx: CheckContext, cfg: GpuPersistenceConfig) -> GpuPersistenceObservation:
        client = gpu_context(ctx).client
        return GpuPersistenceObservation(sample_gpus(client, client.persistence_mode))

    @staticmethod
    def evaluate(observation: GpuPersistenceObservation, cfg: GpuPersistenceConfig) -> list[Result]:
        def judge(sample: GpuSample[bool], enabled: bool) -> list[Result]:
            if enabled:
                return []
            return [
                gpu_fault(
                    NAME,
                    Status(cfg.status),
                    "gpu.persistence.off",
                    f"GPU {sample.index}: persistence mode is off (nvidia-persistenced down?)",
                    recommendation="none",
                    target=sample.target,
                    evidence=sample.evidence(persistence=False),
                )
            ]

        return evaluate_each(
            NAME,
            "persistence mode",
            observation.samples,
            judge,
            lambda on: "persistence mode on",
            lambda on: {"persistence": on},
        )

"""Dynamic page retirement (NVML; pre-Ampere GPUs, NOT_APPLICABLE where row remapping
replaced it): pending retirement and the retired-page count against NVIDIA's RMA limit."""

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
from healthd.nvml_types import RetiredPages

NAME = "gpu_retired_pages"


@dataclass(frozen=True, kw_only=True)
class GpuRetiredPagesConfig(CheckConfig):
    rma_retired_pages: int = setting(
        60, minimum=1, doc="retired pages (SBE + DBE) at which the GPU is due for RMA"
    )
    rma_status: str = setting(
        "CRITICAL", choices=("WARN", "CRITICAL"), doc="status when the RMA limit is reached"
    )


@dataclass(frozen=True)
class GpuRetiredPagesObservation:
    samples: GpuSamples[RetiredPages]


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=300,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.retired_pages.pending": Fault(
            Status.WARN,
            "pages pending retirement (retired at the next reset)",
            "gpu_reset_when_idle",
        ),
        "gpu.retired_pages.limit": Fault(
            (Status.WARN, Status.CRITICAL),
            "retired pages at or above rma_retired_pages (status: rma_status)",
            "rma",
        ),
    },
)
class GpuRetiredPagesCheck(Check[GpuRetiredPagesObservation, GpuRetiredPagesConfig]):
    """GPU retired pages: pending retirement (reset when idle), count over the RMA limit."""

    config_type = GpuRetiredPagesConfig

    def gather(self, ctx: CheckContext, cfg: GpuRetiredPagesConfig) -> GpuRetiredPagesObservation:
        client = gpu_context(ctx).client
        return GpuRetiredPagesObservation(sample_gpus(client, client.retired_pages))

    @staticmethod
    def evaluate(
        observation: GpuRetiredPagesObservation, cfg: GpuRetiredPagesConfig
    ) -> list[Result]:
        def judge(sample: GpuSample[RetiredPages], pages: RetiredPages) -> list[Result]:
            ev = sample.evidence(**_fields(pages))
            found = []
            if pages.total >= cfg.rma_retired_pages:
                found.append(
                    gpu_fault(
                        NAME,
                        Status(cfg.rma_status),
                        "gpu.retired_pages.limit",
                        f"GPU {sample.index}: {pages.total} retired pages"
                        f" (sbe {pages.sbe}, dbe {pages.dbe}), RMA limit {cfg.rma_retired_pages}",
                        recommendation="rma",
                        target=sample.target,
                        evidence={**ev, "limit": cfg.rma_retired_pages},
                    )
                )
            if pages.pending:
                found.append(
                    gpu_fault(
                        NAME,
                        Status.WARN,
                        "gpu.retired_pages.pending",
                        f"GPU {sample.index}: page retirement pending; reset the GPU when idle",
                        recommendation="gpu_reset_when_idle",
                        target=sample.target,
                        evidence=ev,
                    )
                )
            return found

        return evaluate_each(
            NAME,
            "retired pages",
            observation.samples,
            judge,
            lambda p: f"{p.total} retired pages, none pending",
            _fields,
        )


def _fields(pages: RetiredPages) -> dict[str, object]:
    return {"retired_sbe": pages.sbe, "retired_dbe": pages.dbe, "pending": pages.pending}

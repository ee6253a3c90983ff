"""PCIe link of each GPU (NVML): current width and generation against the maximum (or the
configured expectation). Note that idle GPUs may lower the link generation to save power:
`check_gen = false` watches the width only."""

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
from healthd.nvml_types import PcieLink

NAME = "gpu_pcie"


@dataclass(frozen=True, kw_only=True)
class GpuPcieConfig(CheckConfig):
    expected_width: int | None = setting(None, minimum=1, doc="lanes expected (default: max)")
    expected_gen: int | None = setting(None, minimum=1, doc="generation expected (default: max)")
    check_gen: bool = setting(True, doc="also compare the generation (idle GPUs may downshift)")
    status: str = setting("WARN", choices=("WARN", "CRITICAL"), doc="status of a degraded link")


@dataclass(frozen=True)
class GpuPcieObservation:
    samples: GpuSamples[PcieLink]


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=300,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.pcie.degraded": Fault(
            (Status.WARN, Status.CRITICAL),
            "PCIe width (or generation, with check_gen) below the expectation (status: status)",
            "gpu_reset",
        )
    },
)
class GpuPcieCheck(Check[GpuPcieObservation, GpuPcieConfig]):
    """GPU PCIe link: current width/generation below the maximum or expectation."""

    config_type = GpuPcieConfig

    def gather(self, ctx: CheckContext, cfg: GpuPcieConfig) -> GpuPcieObservation:
        client = gpu_context(ctx).client
        return GpuPcieObservation(sample_gpus(client, client.pcie_link))

    @staticmethod
    def evaluate(observation: GpuPcieObservation, cfg: GpuPcieConfig) -> list[Result]:
        def judge(sample: GpuSample[PcieLink], link: PcieLink) -> list[Result]:
            width = cfg.expected_width or link.max_width
            gen = cfg.expected_gen or link.max_gen
            why = []
            if link.cur_width < width:
                why.append(f"width x{link.cur_width} < x{width}")
            if cfg.check_gen and link.cur_gen < gen:
                why.append(f"Gen{link.cur_gen} < Gen{gen}")
            if not why:
                return []
            return [
                gpu_fault(
                    NAME,
                    Status(cfg.status),
                    "gpu.pcie.degraded",
                    f"GPU {sample.index}: PCIe link degraded: {', '.join(why)}",
                    recommendation="gpu_reset",
                    target=sample.target,
                    evidence=sample.evidence(
                        **_fields(link), expected_width=width, expected_gen=gen
                    ),
                )
            ]

        return evaluate_each(
            NAME,
            "the PCIe link",
            observation.samples,
            judge,
            lambda link: f"PCIe Gen{link.cur_gen} x{link.cur_width}",
            _fields,
        )


def _fields(link: PcieLink) -> dict[str, int]:
    return {
        "cur_gen": link.cur_gen,
        "cur_width": link.cur_width,
        "max_gen": link.max_gen,
        "max_width": link.max_width,
    }

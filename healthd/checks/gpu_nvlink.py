"""NVLink link states (NVML): every link the GPU reports (or the configured number) must be
active."""

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
from healthd.nvml_types import NvLinkStates

NAME = "gpu_nvlink"


@dataclass(frozen=True, kw_only=True)
class GpuNvlinkConfig(CheckConfig):
    expected_links: int | None = setting(
        None, minimum=0, doc="NVLinks each GPU must have up (default: every link it reports)"
    )
    status: str = setting("CRITICAL", choices=("WARN", "CRITICAL"), doc="status of a down link")


@dataclass(frozen=True)
class GpuNvlinkObservation:
    samples: GpuSamples[NvLinkStates]


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=60,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.nvlink.down": Fault(
            (Status.WARN, Status.CRITICAL),
            "an expected NVLink is down, or fewer links than expected (status: status)",
            "gpu_reset",
        )
    },
)
class GpuNvlinkCheck(Check[GpuNvlinkObservation, GpuNvlinkConfig]):
    """GPU NVLinks: each expected link is up."""

    config_type = GpuNvlinkConfig

    def gather(self, ctx: CheckContext, cfg: GpuNvlinkConfig) -> GpuNvlinkObservation:
        client = gpu_context(ctx).client
        return GpuNvlinkObservation(sample_gpus(client, client.nvlink_states))

    @staticmethod
    def evaluate(observation: GpuNvlinkObservation, cfg: GpuNvlinkConfig) -> list[Result]:
        def judge(sample: GpuSample[NvLinkStates], links: NvLinkStates) -> list[Result]:
            expected = cfg.expected_links if cfg.expected_links is not None else len(links.links)
            watched = links.links[:expected]
            down = [i for i, up in enumerate(watched) if not up]
            missing = max(0, expected - len(links.links))
            if not down and not missing:
                return []
            parts = []
            if down:
                parts.append(f"NVLink {', '.join(map(str, down))} down")
            if missing:
                parts.append(f"{len(links.links)} links reported, {expected} expected")
            return [
                gpu_fault(
                    NAME,
                    Status(cfg.status),
                    "gpu.nvlink.down",
                    f"GPU {sample.index}: {'; '.join(parts)}",
                    recommendation="gpu_reset",
                    target=sample.target,
                    evidence=sample.evidence(
                        links=len(links.links), expected=expected, down=down, missing=missing
                    ),
                )
            ]

        return evaluate_each(
            NAME,
            "NVLink states",
            observation.samples,
            judge,
            lambda links: f"{len(links.links)} NVLinks up",
            lambda links: {"links": len(links.links)},
        )

"""Row remapping (NVML, Ampere and newer): a pending remap (reset when idle), a remap
failure (the bank ran out of spare rows: RMA) and uncorrectable remaps over a threshold."""

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
from healthd.nvml_types import RemappedRows

NAME = "gpu_remapped_rows"


@dataclass(frozen=True, kw_only=True)
class GpuRemappedRowsConfig(CheckConfig):
    uncorrectable_rows_limit: int = setting(
        64,
        minimum=0,
        doc="rows remapped for uncorrectable errors before gpu.remap.uncorrectable (Medic's"
        " default, not an NVIDIA figure; 0 = off)",
    )
    uncorrectable_status: str = setting(
        "WARN", choices=("WARN", "CRITICAL"), doc="status when the limit is exceeded"
    )


@dataclass(frozen=True)
class GpuRemappedRowsObservation:
    samples: GpuSamples[RemappedRows]


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=300,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.remap.failure": Fault(
            Status.CRITICAL, "row remapping failed: a bank ran out of spare rows", "rma"
        ),
        "gpu.remap.pending": Fault(
            Status.WARN, "a row remap is pending (applied at the next reset)", "gpu_reset_when_idle"
        ),
        "gpu.remap.uncorrectable": Fault(
            (Status.WARN, Status.CRITICAL),
            "rows remapped for uncorrectable errors over uncorrectable_rows_limit",
            "rma",
        ),
    },
)
class GpuRemappedRowsCheck(Check[GpuRemappedRowsObservation, GpuRemappedRowsConfig]):
    """GPU row remapping: failure (RMA), pending (reset when idle), uncorrectable rows."""

    config_type = GpuRemappedRowsConfig

    def gather(self, ctx: CheckContext, cfg: GpuRemappedRowsConfig) -> GpuRemappedRowsObservation:
        client = gpu_context(ctx).client
        return GpuRemappedRowsObservation(sample_gpus(client, client.remapped_rows))

    @staticmethod
    def evaluate(
        observation: GpuRemappedRowsObservation, cfg: GpuRemappedRowsConfig
    ) -> list[Result]:
        def judge(sample: GpuSample[RemappedRows], rows: RemappedRows) -> list[Result]:
            ev = sample.evidence(**_fields(rows))
            found = []
            if rows.failure:
                found.append(
                    gpu_fault(
                        NAME,
                        Status.CRITICAL,
                        "gpu.remap.failure",
                        f"GPU {sample.index}: row remapping failed (no spare rows left)",
                        recommendation="rma",
                        target=sample.target,
                        evidence=ev,
                    )
                )
            elif rows.pending:
                found.append(
                    gpu_fault(
                        NAME,
                        Status.WARN,
                        "gpu.remap.pending",
                        f"GPU {sample.index}: row remap pending; reset the GPU when idle",
                        recommendation="gpu_reset_when_idle",
                        target=sample.target,
                        evidence=ev,
                    )
                )
            limit = cfg.uncorrectable_rows_limit
            if limit and rows.uncorrectable > limit:
                found.append(
                    gpu_fault(
                        NAME,
                        Status(cfg.uncorrectable_status),
                        "gpu.remap.uncorrectable",
                        f"GPU {sample.index}: {rows.uncorrectable} rows remapped for"
                        f" uncorrectable errors (limit {limit})",
                        recommendation="rma",
                        target=sample.target,
                        evidence={**ev, "limit": limit},
                    )
                )
            return found

        return evaluate_each(
            NAME,
            "remapped rows",
            observation.samples,
            judge,
            lambda r: f"remapped rows correctable={r.correctable} uncorrectable={r.uncorrectable}",
            _fields,
        )


def _fields(rows: RemappedRows) -> dict[str, object]:
    return {
        "correctable": rows.correctable,
        "uncorrectable": rows.uncorrectable,
        "pending": rows.pending,
        "failure": rows.failure,
    }

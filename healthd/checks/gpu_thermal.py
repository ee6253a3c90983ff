"""GPU temperature and hardware clock slowdowns (NVML clock event reasons): HW slowdown,
HW thermal slowdown, HW power brake (and optionally SW thermal slowdown)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

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
    evaluate_each,
    gpu_context,
    gpu_fault,
    sample_gpus,
)
from healthd.nvml_types import Thermal

NAME = "gpu_thermal"
WATCHED_REASONS = ("hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal")
DEFAULT_REASON_STATUS = {"hw_slowdown": "WARN", "hw_thermal": "WARN", "hw_power_brake": "WARN"}
REASON_TEXT = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal": "HW thermal slowdown",
    "hw_power_brake": "HW power brake slowdown",
    "sw_thermal": "SW thermal slowdown",
}


@dataclass(frozen=True, kw_only=True)
class GpuThermalConfig(CheckConfig):
    warn_temperature_c: int = setting(85, minimum=0, maximum=150, doc="WARN at or above (°C)")
    critical_temperature_c: int = setting(
        92, minimum=0, maximum=150, doc="CRITICAL at or above (°C)"
    )
    reason_status: dict[str, str] = field(
        default_factory=lambda: dict(DEFAULT_REASON_STATUS),
        metadata=bounds(
            choices=("OK", "WARN", "CRITICAL"),
            keys=WATCHED_REASONS,
            doc="status per active clock event reason (absent or OK: not reported)",
        ),
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        if self.critical_temperature_c < self.warn_temperature_c:
            yield (
                "critical_temperature_c",
                "is below warn_temperature_c",
                "make it at least warn_temperature_c",
            )


@dataclass(frozen=True)
class GpuThermalObservation:
    samples: GpuSamples[Thermal]


@register(
    name=NAME,
    tiers=(Tier.PERIODIC,),
    interval=60,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.thermal.high": Fault(
            (Status.WARN, Status.CRITICAL),
            "temperature at or over warn_temperature_c / critical_temperature_c",
            {Status.WARN: "none", Status.CRITICAL: "drain"},
        ),
        "gpu.clocks.hw_slowdown": Fault(
            (Status.WARN, Status.CRITICAL),
            "clocks lowered by HW slowdown (status: reason_status)",
            {Status.WARN: "none", Status.CRITICAL: "drain"},
        ),
        "gpu.clocks.hw_thermal": Fault(
            (Status.WARN, Status.CRITICAL),
            "clocks lowered by HW thermal slowdown (status: reason_status)",
            {Status.WARN: "none", Status.CRITICAL: "drain"},
        ),
        "gpu.clocks.hw_power_brake": Fault(
            (Status.WARN, Status.CRITICAL),
            "clocks lowered by HW power brake slowdown (status: reason_status)",
            {Status.WARN: "none", Status.CRITICAL: "drain"},
        ),
        "gpu.clocks.sw_thermal": Fault(
            (Status.WARN, Status.CRITICAL),
            "clocks lowered by SW thermal slowdown (off unless set in reason_status)",
            {Status.WARN: "none", Status.CRITICAL: "drain"},
        ),
    },
)
class GpuThermalCheck(Check[GpuThermalObservation, GpuThermalConfig]):
    """GPU temperature and hardware clock slowdowns."""

    config_type = GpuThermalConfig

    def gather(self, ctx: CheckContext, cfg: GpuThermalConfig) -> GpuThermalObservation:
        client = gpu_context(ctx).client
        return GpuThermalObservation(sample_gpus(client, client.thermal))

    @staticmethod
    def evaluate(observation: GpuThermalObservation, cfg: GpuThermalConfig) -> list[Result]:
        def judge(sample: GpuSample[Thermal], thermal: Thermal) -> list[Result]:
            ev = sample.evidence(**_fields(thermal))
            found = []
            temp = thermal.temperature_c
            if temp >= cfg.warn_temperature_c:
                critical = temp >= cfg.critical_temperature_c
                limit = cfg.critical_temperature_c if critical else cfg.warn_temperature_c
                found.append(
                    gpu_fault(
                        NAME,
                        Status.CRITICAL if critical else Status.WARN,
                        "gpu.thermal.high",
                        f"GPU {sample.index}: {temp} °C (limit {limit} °C)",
                        recommendation="drain" if critical else "none",
                        target=sample.target,
                        evidence={**ev, "limit_c": limit},
                    )
                )
            for reason in thermal.reasons:
                status = cfg.reason_status.get(reason, "OK")
                if status == "OK":
                    continue
                found.append(
                    gpu_fault(
                        NAME,
                        Status(status),
                        f"gpu.clocks.{reason}",
                        f"GPU {sample.index}: clocks lowered by {REASON_TEXT[reason]}",
                        recommendation="drain" if status == "CRITICAL" else "none",
                        target=sample.target,
                        evidence=ev,
                    )
                )
            return found

        return evaluate_each(
            NAME,
            "the temperature",
            observation.samples,
            judge,
            lambda t: (
                f"{t.temperature_c} °C, clock event reasons: {', '.join(t.reasons) or 'none'}"
            ),
            _fields,
        )


def _fields(thermal: Thermal) -> dict[str, object]:
    return {
        "temperature_c": thermal.temperature_c,
        "clock_event_reasons": f"0x{thermal.clock_event_reasons:x}",
        "reasons": list(thermal.reasons),
    }

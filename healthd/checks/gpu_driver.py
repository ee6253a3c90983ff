"""NVIDIA driver version (NVML) against the expected versions or a minimum."""

from __future__ import annotations

from collections.abc import Iterator
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
from healthd.checks.gpu_common import gpu_context, gpu_fault, gpu_ok, problem_result
from healthd.nvml_types import Reading, measure

NAME = "gpu_driver"


def version_tuple(version: str) -> tuple[int, ...]:
    """ "550.127.05" -> (550, 127, 5); raises ValueError for anything else."""
    parts = version.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a driver version: {version!r}")
    return tuple(int(p) for p in parts)


@dataclass(frozen=True, kw_only=True)
class GpuDriverConfig(CheckConfig):
    expected_versions: tuple[str, ...] = setting(
        (), doc='driver versions allowed, e.g. ["550.127.05"] (default: any)'
    )
    min_version: str = setting("", doc='oldest driver allowed, e.g. "535.104.05" (default: any)')
    status: str = setting("WARN", choices=("WARN", "CRITICAL"), doc="status of a wrong driver")

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for key, values in (
            ("expected_versions", self.expected_versions),
            ("min_version", (self.min_version,) if self.min_version else ()),
        ):
            for value in values:
                try:
                    version_tuple(value)
                except ValueError:
                    yield (key, f"{value!r} is not a driver version", "write e.g. 550.127.05")


@dataclass(frozen=True)
class GpuDriverObservation:
    version: Reading[str]


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=600,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.driver.version": Fault(
            (Status.WARN, Status.CRITICAL),
            "driver not in expected_versions or older than min_version (status: status)",
            "drain",
        )
    },
)
class GpuDriverCheck(Check[GpuDriverObservation, GpuDriverConfig]):
    """NVIDIA driver version is the expected one."""

    config_type = GpuDriverConfig

    def gather(self, ctx: CheckContext, cfg: GpuDriverConfig) -> GpuDriverObservation:
        return GpuDriverObservation(measure(gpu_context(ctx).client.driver_version))

    @staticmethod
    def evaluate(observation: GpuDriverObservation, cfg: GpuDriverConfig) -> list[Result]:
        version = observation.version.value
        if version is None:
            return [
                problem_result(
                    NAME, "the driver version", observation.version, target=None, evidence={}
                )
            ]
        evidence = {
            "driver_version": version,
            "expected_versions": list(cfg.expected_versions),
            "min_version": cfg.min_version,
        }
        why = []
        if cfg.expected_versions and version not in cfg.expected_versions:
            why.append(f"not one of {', '.join(cfg.expected_versions)}")
        if cfg.min_version:
            try:
                if version_tuple(version) < version_tuple(cfg.min_version):
                    why.append(f"older than {cfg.min_version}")
            except ValueError:
                why.append("unparseable")
        if why:
            return [
                gpu_fault(
                    NAME,
                    Status(cfg.status),
                    "gpu.driver.version",
                    f"NVIDIA driver {version} is {'; '.join(why)}",
                    recommendation="drain",
                    evidence=evidence,
                )
            ]
        return [gpu_ok(NAME, f"NVIDIA driver {version}", target=None, evidence=evidence)]

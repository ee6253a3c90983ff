"""The GPUs NVML lists against the expected count and PCI bus ids, and the NVML
responsiveness policy: repeated timeouts or "GPU is lost" answers on a GPU (counted by the
NVML client across every check's calls, reset by any successful call) are CRITICAL
`gpu.nvml.unresponsive`; a single timeout is only UNKNOWN."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial

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
    gpu_context,
    gpu_fault,
    gpu_not_applicable,
    gpu_ok,
    problem_result,
)
from healthd.nvml_types import CallHealth, GpuInfo, Problem, Reading, Sweep, pci_key

NAME = "gpu_count"


@dataclass(frozen=True, kw_only=True)
class GpuCountConfig(CheckConfig):
    expected_count: int | None = setting(None, minimum=0, doc="GPUs this node must have")
    expected_pci_bus_ids: tuple[str, ...] = setting(
        (), doc='PCI bus ids that must be present, e.g. ["0000:18:00.0", ...]'
    )
    unresponsive_after_timeouts: int = setting(
        3, minimum=1, doc="consecutive NVML timeouts on a GPU before CRITICAL gpu.nvml.unresponsive"
    )
    unresponsive_after_lost: int = setting(
        1, minimum=1, doc="consecutive GPU-is-lost answers before CRITICAL gpu.nvml.unresponsive"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for bus_id in self.expected_pci_bus_ids:
            try:
                pci_key(bus_id)
            except ValueError:
                yield (
                    "expected_pci_bus_ids",
                    f"{bus_id!r} is not a PCI bus id",
                    "write 0000:18:00.0",
                )


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    info: Reading[GpuInfo]
    cached: GpuInfo | None = None  # the last identity read, for evidence when this one failed


@dataclass(frozen=True)
class GpuCountObservation:
    count: Reading[int]
    gpus: tuple[GpuIdentity, ...] = ()
    health: Mapping[int, CallHealth] = field(default_factory=dict)


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=60,
    timeout=15,
    needs=("nvml",),
    faults={
        "gpu.missing": Fault(
            Status.CRITICAL,
            "fewer GPUs than expected_count, or an expected PCI bus id is absent",
            "reboot",
        ),
        "gpu.count.unexpected": Fault(Status.WARN, "more GPUs than expected_count", "none"),
        "gpu.nvml.unresponsive": Fault(
            Status.CRITICAL,
            "a GPU timed out or answered GPU-is-lost too many times in a row",
            "reboot",
        ),
        "gpu.nvml.unavailable": Fault(
            Status.CRITICAL,
            "NVML is unusable (driver not loaded) while GPUs are expected",
            "reboot",
        ),
    },
)
class GpuCountCheck(Check[GpuCountObservation, GpuCountConfig]):
    """GPU count and PCI ids as expected; GPUs that stopped answering NVML."""

    config_type = GpuCountConfig

    def gather(self, ctx: CheckContext, cfg: GpuCountConfig) -> GpuCountObservation:
        client = gpu_context(ctx).client

        def plan() -> Sweep[tuple[Reading[int], tuple[GpuIdentity, ...]]]:
            count: Reading[int] = yield client.device_count
            gpus = []
            for index in range(count.value or 0):
                info: Reading[GpuInfo] = yield partial(client.gpu_info, index, refresh=True)
                cached = None if info.ok else client.cached_gpu_info(index)
                gpus.append(GpuIdentity(index, info, cached))
            return count, tuple(gpus)

        count, gpus = client.sweep(plan())
        return GpuCountObservation(count, gpus, client.call_health())

    @staticmethod
    def evaluate(observation: GpuCountObservation, cfg: GpuCountConfig) -> list[Result]:
        results = list(_unresponsive(observation, cfg))
        flagged = {r.target for r in results}
        count = observation.count.value
        if count is None:
            if observation.count.problem is Problem.UNAVAILABLE and cfg.expected_count:
                return [
                    *results,
                    gpu_fault(
                        NAME,
                        Status.CRITICAL,
                        "gpu.nvml.unavailable",
                        f"NVML is unavailable but {cfg.expected_count} GPUs are expected:"
                        f" {observation.count.detail}",
                        recommendation="reboot",
                        evidence={"detail": observation.count.detail},
                    ),
                ]
            return [
                *results,
                problem_result(NAME, "the GPU count", observation.count, target=None, evidence={}),
            ]
        present: dict[str, GpuInfo] = {}
        for gpu in observation.gpus:
            info = gpu.info.value or gpu.cached
            if info is not None:
                present[pci_key(info.pci_bus_id)] = info
            if gpu.info.value is None and str(gpu.index) not in flagged:
                evidence = info.evidence() if info is not None else {"index": gpu.index}
                results.append(
                    problem_result(
                        NAME, "its identity", gpu.info, target=str(gpu.index), evidence=evidence
                    )
                )
        found = [g.evidence() for g in present.values()]
        if cfg.expected_count is not None and count != cfg.expected_count:
            fewer = count < cfg.expected_count
            results.append(
                gpu_fault(
                    NAME,
                    Status.CRITICAL if fewer else Status.WARN,
                    "gpu.missing" if fewer else "gpu.count.unexpected",
                    f"{count} GPUs, expected {cfg.expected_count}",
                    recommendation="reboot" if fewer else "none",
                    evidence={"count": count, "expected": cfg.expected_count, "gpus": found},
                )
            )
        for bus_id in cfg.expected_pci_bus_ids:
            if pci_key(bus_id) not in present:
                results.append(
                    gpu_fault(
                        NAME,
                        Status.CRITICAL,
                        "gpu.missing",
                        f"GPU at PCI {bus_id} is missing",
                        recommendation="reboot",
                        target=bus_id,
                        evidence={"pci_bus_id": bus_id, "present": sorted(present)},
                    )
                )
        if count == 0 and not cfg.expected_count and not cfg.expected_pci_bus_ids:
            return [*results, gpu_not_applicable(NAME, "NVML lists no GPUs and none are expected")]
        if not any(r.status.severity >= Status.WARN.severity for r in results):
            results.append(
                gpu_ok(
                    NAME,
                    f"{count} GPUs" + (" as expected" if cfg.expected_count is not None else ""),
                    target=None,
                    evidence={"count": count, "gpus": found},
                )
            )
        return results


def _unresponsive(observation: GpuCountObservation, cfg: GpuCountConfig) -> Iterator[Result]:
    for gpu, health in sorted(observation.health.items()):
        timeouts = health.consecutive_timeouts >= cfg.unresponsive_after_timeouts
        lost = health.consecutive_lost >= cfg.unresponsive_after_lost
        if not (timeouts or lost):
            continue
        why = (
            f"{health.consecutive_lost} consecutive 'GPU is lost' answers"
            if lost
            else f"{health.consecutive_timeouts} consecutive NVML timeouts"
        )
        identity = next((g for g in observation.gpus if g.index == gpu), None)
        info = (identity.info.value or identity.cached) if identity is not None else None
        evidence = info.evidence() if info is not None else {"index": gpu}
        yield gpu_fault(
            NAME,
            Status.CRITICAL,
            "gpu.nvml.unresponsive",
            f"GPU {gpu}: {why} (last: {health.last_function})",
            recommendation="reboot",
            target=str(gpu),
            evidence={
                **evidence,
                "consecutive_timeouts": health.consecutive_timeouts,
                "consecutive_lost": health.consecutive_lost,
                "last_problem": health.last_problem,
                "last_function": health.last_function,
            },
        )

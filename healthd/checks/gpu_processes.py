"""Leftover GPU work: compute processes or used GPU memory on a GPU while no job runs on it
(a leaked process from the last job, a stuck context). The "no job" fact comes from the
daemon's job-state provider (`GpuContext.jobs`, see gpu_common.JobStateProvider); without
one this check is NOT_APPLICABLE."""

from __future__ import annotations

from dataclasses import dataclass
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
    GpuSample,
    GpuSamples,
    GpuSteps,
    JobState,
    evaluate_each,
    gpu_context,
    gpu_fault,
    gpu_not_applicable,
    sweep_gpus,
)
from healthd.nvml_types import GpuProcess, MemoryUsage, NvmlClient, Reading

NAME = "gpu_processes"
_NO_COUNT: Reading[int] = Reading(0)


@dataclass(frozen=True, kw_only=True)
class GpuProcessesConfig(CheckConfig):
    max_idle_used_mib: int = setting(
        1024, minimum=0, doc="used GPU memory (MiB) tolerated on a GPU no job uses"
    )
    grace_seconds: float = setting(
        30.0, minimum=0, doc="after a job ends, seconds its processes get to exit"
    )
    status: str = setting("WARN", choices=("WARN", "CRITICAL"), doc="status of a leak")


@dataclass(frozen=True)
class GpuUsage:
    processes: tuple[GpuProcess, ...]
    memory: MemoryUsage | None  # None when the memory query failed


@dataclass(frozen=True)
class GpuProcessesObservation:
    jobs: JobState | None  # None: the daemon gave no job-state provider
    samples: GpuSamples[GpuUsage]


def _usage(client: NvmlClient, index: int) -> GpuSteps[GpuUsage]:
    processes: Reading[tuple[GpuProcess, ...]] = yield partial(client.processes, index)
    if processes.value is None:
        return Reading(None, processes.problem, processes.detail)
    # the processes are the main fact; memory is a second opinion (None when unreadable)
    memory: Reading[MemoryUsage] = yield partial(client.memory, index)
    return Reading(GpuUsage(processes.value, memory.value))


@register(
    name=NAME,
    tiers=(Tier.LAUNCH, Tier.PERIODIC),
    interval=60,
    timeout=10,
    needs=("nvml",),
    faults={
        "gpu.leak.process": Fault(
            (Status.WARN, Status.CRITICAL),
            "compute processes or used memory on a GPU no job uses (status: status)",
            "gpu_reset_when_idle",
        )
    },
)
class GpuProcessesCheck(Check[GpuProcessesObservation, GpuProcessesConfig]):
    """GPU processes or memory in use while no job runs (leaked processes)."""

    config_type = GpuProcessesConfig

    def gather(self, ctx: CheckContext, cfg: GpuProcessesConfig) -> GpuProcessesObservation:
        gpu = gpu_context(ctx)
        jobs = gpu.jobs.job_state() if gpu.jobs is not None else None
        if jobs is None or jobs.running is None:
            return GpuProcessesObservation(jobs, GpuSamples(count=_NO_COUNT))
        client = gpu.client
        return GpuProcessesObservation(jobs, sweep_gpus(client, partial(_usage, client)))

    @staticmethod
    def evaluate(observation: GpuProcessesObservation, cfg: GpuProcessesConfig) -> list[Result]:
        jobs = observation.jobs
        if jobs is None or jobs.running is None:
            why = "no job-state provider" if jobs is None else "job state unknown"
            return [gpu_not_applicable(NAME, f"{why}: cannot tell leftover GPU processes")]
        in_grace = (
            not jobs.running
            and jobs.idle_seconds is not None
            and jobs.idle_seconds < cfg.grace_seconds
        )

        def idle(sample: GpuSample[GpuUsage]) -> bool:
            if not jobs.running:
                return True
            return jobs.gpus_in_use is not None and sample.index not in jobs.gpus_in_use

        def judge(sample: GpuSample[GpuUsage], usage: GpuUsage) -> list[Result]:
            if not idle(sample) or in_grace:
                return []
            used = usage.memory.used_mib if usage.memory is not None else None
            why = []
            if usage.processes:
                pids = ", ".join(str(p.pid) for p in usage.processes)
                why.append(f"{len(usage.processes)} compute processes (pid {pids})")
            if used is not None and used > cfg.max_idle_used_mib:
                why.append(f"{used} MiB used")
            if not why:
                return []
            return [
                gpu_fault(
                    NAME,
                    Status(cfg.status),
                    "gpu.leak.process",
                    f"GPU {sample.index}: {' and '.join(why)} while no job uses it",
                    recommendation="gpu_reset_when_idle",
                    target=sample.target,
                    evidence=sample.evidence(
                        **_fields(usage), job_ids=list(jobs.job_ids), job_source=jobs.source
                    ),
                )
            ]

        return evaluate_each(
            NAME,
            "GPU processes",
            observation.samples,
            judge,
            lambda u: (
                f"{len(u.processes)} compute processes"
                + (f", {u.memory.used_mib} MiB used" if u.memory is not None else "")
            ),
            _fields,
        )


def _fields(usage: GpuUsage) -> dict[str, object]:
    return {
        "processes": [{"pid": p.pid, "used_mib": p.used_mib} for p in usage.processes],
        "used_mib": usage.memory.used_mib if usage.memory is not None else None,
    }

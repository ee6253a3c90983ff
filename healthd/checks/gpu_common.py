"""What the GPU checks share (this module registers no check).

`ctx.nvml` carries a `GpuContext`: the NVML client, the recent-XID buffer the listener
feeds, and the job-state provider that tells `gpu_processes` whether a job runs. A bare
`NvmlClient` in `ctx.nvml` also works (no XID buffer of the daemon, no job state).

Readings go into observations as plain data (`Reading`: a value or a named problem);
`problem_result` turns a problem into the one result every GPU check gives for it:
not supported -> NOT_APPLICABLE for that GPU, timeout / lost / error -> UNKNOWN (never a
hardware verdict: `gpu_count` turns repeated timeouts and lost GPUs into
`gpu.nvml.unresponsive`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from healthd.checks.base import (
    CheckContext,
    Kind,
    Recommendation,
    Result,
    Status,
    remediation_for,
)
from healthd.nvml_types import GpuInfo, NvmlClient, Problem, Reading

if TYPE_CHECKING:
    from healthd.xid import XidBuffer

T = TypeVar("T")


def remediation_of(recommendation: str) -> Recommendation:
    return Recommendation(recommendation)


# --- job state ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobState:
    """Whether Slurm runs a job on this node. `running` None: unknown."""

    running: bool | None
    job_ids: tuple[str, ...] = ()
    gpus_in_use: frozenset[int] | None = None  # NVML indexes of the running jobs; None: all
    idle_seconds: float | None = None  # how long the node has had no job
    source: str = ""


class JobStateProvider(Protocol):
    """The daemon's view of Slurm on this node (prolog/epilog notifications, or a query)."""

    def job_state(self) -> JobState: ...


@dataclass(frozen=True)
class StaticJobState:
    """A fixed answer: the prolog's request ("no job yet") or a test."""

    state: JobState

    def job_state(self) -> JobState:
        return self.state


def _no_xids() -> XidBuffer:
    """An empty XID buffer. healthd.xid (its catalog) loads here, not with every GPU check's
    module: `medic config check` imports the checks for their config alone (issue 27)."""
    from healthd.xid import XidBuffer

    return XidBuffer()


@dataclass(frozen=True)
class GpuContext:
    client: NvmlClient
    xids: XidBuffer = field(default_factory=_no_xids)
    jobs: JobStateProvider | None = None


def gpu_context(ctx: CheckContext) -> GpuContext:
    value: Any = ctx.require_nvml()
    if isinstance(value, GpuContext):
        return value
    return GpuContext(client=value)


# --- sampling every GPU ---------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSample(Generic[T]):
    index: int
    info: GpuInfo | None  # identity, for evidence; None if it could not be read
    reading: Reading[T]

    @property
    def target(self) -> str:
        return str(self.index)

    def evidence(self, **more: Any) -> dict[str, Any]:
        base = self.info.evidence() if self.info is not None else {"index": self.index}
        return {**base, **more}


@dataclass(frozen=True)
class GpuSamples(Generic[T]):
    count: Reading[int]
    samples: tuple[GpuSample[T], ...] = ()


# One GPU's part of a sweep: yields client calls, is sent their readings, returns the GPU's.
GpuSteps = Generator[Callable[[], Any], Reading[Any], Reading[T]]


def sweep_gpus(client: NvmlClient, steps: Callable[[int], GpuSteps[T]]) -> GpuSamples[T]:
    """`steps(index)` for every GPU NVML lists, with each GPU's identity (cached), as one
    `client.sweep()`: the count and every GPU's calls on one worker thread."""

    def plan() -> Generator[Callable[[], Any], Reading[Any], GpuSamples[T]]:
        count: Reading[int] = yield client.device_count
        if count.value is None:
            return GpuSamples(count)
        samples = []
        for index in range(count.value):
            info = yield partial(client.gpu_info, index)
            reading = yield from steps(index)
            samples.append(GpuSample(index, info.value, reading))
        return GpuSamples(count, tuple(samples))

    return client.sweep(plan())


def sample_gpus(client: NvmlClient, read: Callable[[int], T]) -> GpuSamples[T]:
    """`read(index)` (one NVML call) for every GPU NVML lists, with each GPU's identity."""

    def steps(index: int) -> GpuSteps[T]:
        reading: Reading[T] = yield partial(read, index)
        return reading

    return sweep_gpus(client, steps)


# --- results ----------------------------------------------------------------------------------


def gpu_fault(
    check: str,
    status: Status,
    fault_class: str,
    message: str,
    *,
    recommendation: str,
    target: str | None = None,
    evidence: Mapping[str, Any] | None = None,
    kind: Kind = Kind.CONDITION,
) -> Result:
    """A finding with Medic's recommendation for it: per finding, not per fault class (an
    XID's bucket decides), so it does not come from base.REMEDIATIONS; the exact word is
    kept in evidence["recommendation"]."""
    remediation = remediation_of(recommendation)
    return Result(
        check,
        status,
        fault_class,
        target,
        message,
        {**(evidence or {}), "recommendation": recommendation},
        remediation,
        kind,
    )


def gpu_ok(check: str, message: str, *, target: str | None, evidence: Mapping[str, Any]) -> Result:
    return Result(check, Status.OK, None, target, message, dict(evidence))


def gpu_not_applicable(
    check: str,
    message: str,
    *,
    target: str | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> Result:
    return Result(check, Status.NOT_APPLICABLE, None, target, message, dict(evidence or {}))


_PROBLEM_CLASSES = {
    Problem.TIMEOUT: "check.nvml.timeout",
    Problem.GPU_LOST: "check.nvml.gpu_lost",
    Problem.UNAVAILABLE: "check.nvml.unavailable",
    Problem.ERROR: "check.nvml.error",
}


def problem_result(
    check: str, what: str, reading: Reading[Any], *, target: str | None, evidence: Mapping[str, Any]
) -> Result:
    """The result for a reading that failed: NOT_APPLICABLE when the GPU does not support
    the metric, UNKNOWN otherwise (remediation none: never a hardware verdict)."""
    assert reading.problem is not None
    where = f"GPU {target}" if target is not None else "this node"
    detail = {**evidence, "problem": reading.problem.value, "detail": reading.detail}
    if reading.problem is Problem.NOT_SUPPORTED:
        return gpu_not_applicable(
            check, f"{where}: {what} is not supported", target=target, evidence=detail
        )
    fault_class = _PROBLEM_CLASSES[reading.problem]
    return Result(
        check,
        Status.UNKNOWN,
        fault_class,
        target,
        f"{where}: could not read {what}: {reading.detail}",
        detail,
        remediation_for(fault_class),
    )


def count_problem(check: str, samples: GpuSamples[Any]) -> list[Result] | None:
    """The results when the GPUs could not even be counted, else None."""
    if samples.count.ok:
        return None
    return [problem_result(check, "the GPU count", samples.count, target=None, evidence={})]


def no_gpus(check: str) -> list[Result]:
    return [gpu_not_applicable(check, "NVML lists no GPUs")]


def evaluate_each(
    check: str,
    what: str,
    samples: GpuSamples[T],
    judge: Callable[[GpuSample[T], T], list[Result]],
    describe: Callable[[T], str],
    evidence: Callable[[T], Mapping[str, Any]],
) -> list[Result]:
    """The usual shape: a problem result per unreadable GPU, `judge`'s findings per GPU, and
    an OK naming the reading for a GPU without findings."""
    failed = count_problem(check, samples)
    if failed is not None:
        return failed
    if not samples.samples:
        return no_gpus(check)
    results: list[Result] = []
    for sample in samples.samples:
        value = sample.reading.value
        if value is None:
            results.append(
                problem_result(
                    check, what, sample.reading, target=sample.target, evidence=sample.evidence()
                )
            )
            continue
        findings = judge(sample, value)
        results.extend(
            findings
            or [
                gpu_ok(
                    check,
                    f"GPU {sample.index}: {describe(value)}",
                    target=sample.target,
                    evidence=sample.evidence(**evidence(value)),
                )
            ]
        )
    return results

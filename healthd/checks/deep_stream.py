"""Host memory bandwidth: the STREAM benchmark (`stream` / `stream_c.exe`, McCalpin).

STREAM prints a banner (array size, threads), then

    Function    Best Rate MB/s  Avg time     Min time     Max time
    Copy:           25576.0     0.006524     0.006256     0.008151
    ...
    Triad:          21177.1     0.011542     0.011333     0.012044

and "Solution Validates: ..." or "Failed Validation on array ..." lines. STREAM's MB is
10^6 bytes. The array size is compiled into the binary (-DSTREAM_ARRAY_SIZE); the thread
count comes from OMP_NUM_THREADS in the daemon's environment. Triad is compared with a
floor per CPU model ("model name" in /proc/cpuinfo).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from healthd.checks.base import (
    Check,
    CheckContext,
    Fault,
    Result,
    Status,
    Tier,
    bounds,
    ok,
    register,
    setting,
)
from healthd.checks.deep_common import (
    DeepToolConfig,
    command_failed,
    deep_fault,
    find_tool,
    run_evidence,
    threshold_for,
    tool_absent,
)
from healthd.hostfs import read_text
from medic_core.proc import CommandResult

NAME = "deep_stream"
TOOLS = ("stream", "stream_c.exe")
FUNCTIONS = ("Copy", "Scale", "Add", "Triad")

_RATE = re.compile(
    r"^\s*(Copy|Scale|Add|Triad):\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$"
)
_THREADS = re.compile(r"Number of Threads (?:counted|requested)\s*=\s*(\d+)")
_ARRAY = re.compile(r"Array size\s*=\s*(\d+)")
_VERSION = re.compile(r"STREAM version \$Revision:\s*([0-9.]+)")
_MODEL = re.compile(r"^model name\s*:\s*(.+?)\s*$", re.M)


@dataclass(frozen=True, kw_only=True)
class DeepStreamConfig(DeepToolConfig):
    tool_names: tuple[str, ...] = setting(TOOLS, doc="STREAM binary names to look for")
    command_timeout: float = setting(
        300.0, minimum=1, doc="seconds STREAM may run before it is killed"
    )
    min_triad_mbps: dict[str, float] = field(
        default_factory=dict,
        metadata=bounds(
            minimum=0, doc="Triad floor (MB/s) by CPU model name as /proc/cpuinfo prints it"
        ),
    )
    default_min_triad_mbps: float = setting(
        0.0, minimum=0, doc="Triad floor for CPU models not listed; 0 = none"
    )


@dataclass(frozen=True)
class StreamRate:
    function: str
    best_mbps: float
    avg_s: float
    min_s: float
    max_s: float


@dataclass(frozen=True)
class StreamRun:
    rates: Mapping[str, StreamRate]  # by function name
    validates: bool | None  # None when the output has neither verdict line
    failures: tuple[str, ...] = ()  # "Failed Validation on array a[] ..." lines
    threads: int | None = None
    array_size: int | None = None
    version: str | None = None


@dataclass(frozen=True)
class DeepStreamObservation:
    tool: str | None
    cpu_model: str | None = None
    run: CommandResult | None = None
    result: StreamRun | None = None
    parse_error: str | None = None


def parse_stream(text: str) -> StreamRun:
    """STREAM's output -> StreamRun. Raises ValueError without all four rate lines."""
    rates: dict[str, StreamRate] = {}
    failures: list[str] = []
    validates: bool | None = None
    for line in text.splitlines():
        if match := _RATE.match(line):
            name, best, avg, low, high = match.groups()
            rates[name] = StreamRate(name, float(best), float(avg), float(low), float(high))
        elif line.startswith("Solution Validates"):
            validates = True
        elif "Failed Validation" in line:
            failures.append(line.strip())
    if failures:
        validates = False
    missing = [f for f in FUNCTIONS if f not in rates]
    if missing:
        raise ValueError(f"STREAM output lacks {', '.join(missing)}")
    threads, array, version = _THREADS.search(text), _ARRAY.search(text), _VERSION.search(text)
    return StreamRun(
        rates,
        validates,
        tuple(failures),
        int(threads.group(1)) if threads else None,
        int(array.group(1)) if array else None,
        version.group(1) if version else None,
    )


def cpu_model(cpuinfo: str | None) -> str | None:
    match = _MODEL.search(cpuinfo or "")
    return match.group(1) if match else None


@register(
    name=NAME,
    tiers=(Tier.DEEP,),
    interval=86400,
    timeout=600,
    needs=("host", "commands"),
    faults={
        "mem.bandwidth.validation": Fault(
            Status.CRITICAL, "STREAM results failed validation", "drain"
        ),
        "mem.bandwidth": Fault(
            Status.CRITICAL, "STREAM Triad below the floor for the CPU model", "drain"
        ),
        "check.command_failed": Fault(
            Status.UNKNOWN, "the tool failed, timed out or printed nothing parseable"
        ),
    },
)
class DeepStreamCheck(Check[DeepStreamObservation, DeepStreamConfig]):
    """Host memory bandwidth (STREAM): Triad against a floor per CPU model, validation."""

    config_type = DeepStreamConfig

    def gather(self, ctx: CheckContext, cfg: DeepStreamConfig) -> DeepStreamObservation:
        tool = find_tool(cfg.tool_names, cfg.search_dirs)
        if tool is None:
            return DeepStreamObservation(None)
        model = cpu_model(read_text(ctx.roots.root, "proc/cpuinfo"))
        run = ctx.commands([tool], timeout=cfg.command_timeout)
        if not run.ok:
            return DeepStreamObservation(tool, model, run)
        try:
            return DeepStreamObservation(tool, model, run, parse_stream(run.stdout))
        except ValueError as exc:
            return DeepStreamObservation(tool, model, run, parse_error=str(exc))

    @staticmethod
    def evaluate(observation: DeepStreamObservation, cfg: DeepStreamConfig) -> list[Result]:
        if observation.tool is None:
            return [tool_absent(NAME, " or ".join(cfg.tool_names), cfg.search_dirs)]
        stream = observation.result
        if stream is None:
            return [command_failed(NAME, "STREAM", observation.run, observation.parse_error)]
        floor = threshold_for(observation.cpu_model, cfg.min_triad_mbps, cfg.default_min_triad_mbps)
        triad = stream.rates["Triad"].best_mbps
        evidence = {
            "cpu_model": observation.cpu_model,
            "best_rate_mbps": {f: stream.rates[f].best_mbps for f in FUNCTIONS},
            "threads": stream.threads,
            "array_size": stream.array_size,
            "stream_version": stream.version,
            "min_triad_mbps": floor,
            **run_evidence(observation.run),
        }
        results: list[Result] = []
        if stream.validates is False:
            results.append(
                deep_fault(
                    NAME,
                    Status.CRITICAL,
                    "mem.bandwidth.validation",
                    f"STREAM results failed validation: {stream.failures[0]}",
                    evidence={**evidence, "failures": list(stream.failures)},
                )
            )
        if floor is not None and triad < floor:
            results.append(
                deep_fault(
                    NAME,
                    Status.CRITICAL,
                    "mem.bandwidth",
                    f"STREAM Triad {triad:g} MB/s, expected at least {floor:g} MB/s"
                    f" ({observation.cpu_model})",
                    evidence=evidence,
                )
            )
        if not results:
            limit = f", floor {floor:g}" if floor is not None else ", no floor for this CPU"
            results.append(ok(NAME, f"STREAM Triad {triad:g} MB/s{limit}", evidence=evidence))
        return results

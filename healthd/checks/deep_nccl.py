"""NCCL all-reduce across the node's GPUs: nccl-tests' `all_reduce_perf -b 8 -e 1G -f 2 -g <n>`.

all_reduce_perf prints '#' header lines (the devices, one "#  Rank  0 Group  0 Pid ... on
<host> device  0 [<bus>] <GPU model>" line per rank), a column header ("size count type
redop root time algbw busbw #wrong" for out-of-place, then "time algbw busbw #wrong" for
in-place), one row per message size, then "# Out of bounds values : N OK|FAILED" and
"# Avg bus bandwidth    : X". The average is over every size, small ones included, so it
is kept as evidence; the verdict uses the bus bandwidth at the largest size, where the
links are saturated, compared with a floor per GPU model.
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
from healthd.hostfs import list_dir
from medic_core.proc import CommandResult

NAME = "deep_nccl"
TOOL = "all_reduce_perf"

# Bus bandwidth floors (GB/s) at the largest message size, single node, all GPUs. Measured
# references: 8x H100 80GB HBM3 (NVSwitch) 466-471 GB/s at 1-2 GiB, 4x H100 356 GB/s at
# 1 GiB (see docs/deep-checks.md); the floor sits below the 4-GPU figure so that both
# shapes pass and a halved NVLink fabric does not.
DEFAULT_MIN_BUSBW_GBPS: Mapping[str, float] = {
    "NVIDIA H100 80GB HBM3": 300.0,
}

_MPI_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s+(.+?)\s*$"
)
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(\w*)")


@dataclass(frozen=True, kw_only=True)
class DeepNcclConfig(DeepToolConfig):
    gpus: int | None = setting(
        None, minimum=1, doc="GPUs to use (-g); default: the /dev/nvidiaN devices"
    )
    min_bytes: str = setting("8", doc="smallest message size (-b)")
    max_bytes: str = setting("1G", doc="largest message size (-e)")
    command_timeout: float = setting(
        600.0, minimum=1, doc="seconds all_reduce_perf may run before it is killed"
    )
    min_busbw_gbps: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_MIN_BUSBW_GBPS),
        metadata=bounds(
            minimum=0,
            doc="bus bandwidth floor (GB/s) at the largest size, by GPU model as NCCL "
            "prints it; merged over the defaults; 0 = no floor",
        ),
    )
    default_min_busbw_gbps: float = setting(
        0.0, minimum=0, doc="floor for GPU models not in min_busbw_gbps; 0 = none"
    )

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "min_busbw_gbps", {**DEFAULT_MIN_BUSBW_GBPS, **self.min_busbw_gbps}
        )


@dataclass(frozen=True)
class NcclDevice:
    rank: int
    host: str
    device: int
    bus_id: str
    model: str


@dataclass(frozen=True)
class NcclSample:
    """One message size: out-of-place and in-place time (us), algbw and busbw (GB/s) and
    wrong-element counts (None where validation was off and the tool printed N/A)."""

    size: int
    count: int
    dtype: str
    redop: str
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int | None
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    ip_wrong: int | None

    @property
    def busbw(self) -> float:
        """The lower of the two: a regression in either placement counts."""
        return min(self.oop_busbw, self.ip_busbw)

    @property
    def wrong(self) -> int:
        return (self.oop_wrong or 0) + (self.ip_wrong or 0)


@dataclass(frozen=True)
class NcclRun:
    devices: tuple[NcclDevice, ...]
    samples: tuple[NcclSample, ...]
    avg_busbw: float | None
    out_of_bounds: int | None

    @property
    def model(self) -> str | None:
        """The GPU model most ranks run on."""
        models = [d.model for d in self.devices]
        return max(sorted(set(models)), key=models.count) if models else None


@dataclass(frozen=True)
class DeepNcclObservation:
    tool: str | None
    gpus: int  # GPUs the run was asked for; 0 when the node has none
    run: CommandResult | None = None
    result: NcclRun | None = None
    parse_error: str | None = None


def _number(text: str) -> float:
    return float(text)


def _wrong(text: str) -> int | None:
    return None if text.upper() == "N/A" else int(text)


def parse_all_reduce_perf(text: str) -> NcclRun:
    """all_reduce_perf's output -> NcclRun (mpirun's "[1,0]<stdout>:" prefixes and NCCL
    INFO lines are tolerated). Raises ValueError when there is no result table."""
    devices: list[NcclDevice] = []
    samples: list[NcclSample] = []
    columns: list[str] | None = None
    avg: float | None = None
    oob: int | None = None
    for raw in text.splitlines():
        line = _MPI_PREFIX.sub("", raw).rstrip()
        if line.startswith("#"):
            if match := _RANK.match(line):
                rank, host, dev, bus, model = match.groups()
                devices.append(NcclDevice(int(rank), host, int(dev), bus, model))
            elif match := _AVG.match(line):
                avg = float(match.group(1))
            elif match := _OOB.match(line):
                oob = int(match.group(1))
            else:
                words = line.lstrip("#").split()
                if "size" in words and "busbw" in words:
                    columns = words
            continue
        words = line.split()
        if columns is None or not words or not words[0].isdigit():
            continue
        if len(words) != len(columns):
            raise ValueError(f"row has {len(words)} fields, header has {len(columns)}: {line!r}")
        samples.append(_sample(columns, words))
    if not samples:
        raise ValueError("no all_reduce_perf result rows in the output")
    return NcclRun(tuple(devices), tuple(samples), avg, oob)


def _sample(columns: list[str], words: list[str]) -> NcclSample:
    def at(name: str, nth: int) -> str:
        positions = [i for i, c in enumerate(columns) if c == name]
        return words[positions[min(nth, len(positions) - 1)]]

    return NcclSample(
        size=int(at("size", 0)),
        count=int(at("count", 0)),
        dtype=at("type", 0),
        redop=at("redop", 0),
        oop_time_us=_number(at("time", 0)),
        oop_algbw=_number(at("algbw", 0)),
        oop_busbw=_number(at("busbw", 0)),
        oop_wrong=_wrong(at("#wrong", 0)),
        ip_time_us=_number(at("time", 1)),
        ip_algbw=_number(at("algbw", 1)),
        ip_busbw=_number(at("busbw", 1)),
        ip_wrong=_wrong(at("#wrong", 1)),
    )


def count_gpus(ctx: CheckContext) -> int:
    """The /dev/nvidiaN device nodes below the host root."""
    names = list_dir(ctx.roots.root, "dev") or []
    return sum(1 for n in names if re.fullmatch(r"nvidia\d+", n))


@register(
    name=NAME,
    tiers=(Tier.DEEP,),
    interval=86400,
    timeout=900,
    needs=("host", "commands"),
    faults={
        "nccl.allreduce.wrong": Fault(
            Status.CRITICAL, "all-reduce returned wrong or out-of-bounds values", "drain"
        ),
        "nccl.allreduce.bw": Fault(
            Status.CRITICAL,
            "bus bandwidth at the largest size below the floor for the GPU model",
            "drain",
        ),
        "check.command_failed": Fault(
            Status.UNKNOWN, "the tool failed, timed out or printed nothing parseable"
        ),
    },
)
class DeepNcclCheck(Check[DeepNcclObservation, DeepNcclConfig]):
    """NCCL all-reduce bus bandwidth across the node's GPUs (nccl-tests all_reduce_perf)."""

    config_type = DeepNcclConfig

    def gather(self, ctx: CheckContext, cfg: DeepNcclConfig) -> DeepNcclObservation:
        gpus = cfg.gpus if cfg.gpus is not None else count_gpus(ctx)
        tool = find_tool((TOOL,), cfg.search_dirs)
        if tool is None or gpus == 0:
            return DeepNcclObservation(tool, gpus)
        argv = [tool, "-b", cfg.min_bytes, "-e", cfg.max_bytes, "-f", "2", "-g", str(gpus)]
        run = ctx.commands(argv, timeout=cfg.command_timeout)
        if run.timed_out or run.start_error:
            return DeepNcclObservation(tool, gpus, run)
        try:
            return DeepNcclObservation(tool, gpus, run, parse_all_reduce_perf(run.stdout))
        except ValueError as exc:
            return DeepNcclObservation(tool, gpus, run, parse_error=str(exc))

    @staticmethod
    def evaluate(observation: DeepNcclObservation, cfg: DeepNcclConfig) -> list[Result]:
        if observation.tool is None:
            return [tool_absent(NAME, TOOL, cfg.search_dirs)]
        if observation.gpus == 0:
            return [tool_absent(NAME, "a GPU (/dev/nvidiaN)", ["/dev"])]
        run = observation.result
        if run is None:
            return [command_failed(NAME, TOOL, observation.run, observation.parse_error)]
        largest = max(run.samples, key=lambda s: s.size)
        model = run.model
        floor = threshold_for(model, cfg.min_busbw_gbps, cfg.default_min_busbw_gbps)
        evidence = {
            "gpus": observation.gpus,
            "model": model,
            "devices": [f"{d.device} [{d.bus_id}] {d.model}" for d in run.devices],
            "largest_size_bytes": largest.size,
            "busbw_gbps": largest.busbw,
            "algbw_gbps": min(largest.oop_algbw, largest.ip_algbw),
            "avg_busbw_gbps": run.avg_busbw,
            "min_busbw_gbps": floor,
            **run_evidence(observation.run),
        }
        results: list[Result] = []
        wrong = sum(s.wrong for s in run.samples) + (run.out_of_bounds or 0)
        if wrong:
            bad = [s.size for s in run.samples if s.wrong]
            results.append(
                deep_fault(
                    NAME,
                    Status.CRITICAL,
                    "nccl.allreduce.wrong",
                    f"all-reduce over {observation.gpus} GPUs returned {wrong} wrong values"
                    f" (sizes {', '.join(map(str, bad)) or 'n/a'})",
                    evidence={**evidence, "wrong": wrong, "out_of_bounds": run.out_of_bounds},
                )
            )
        if floor is not None and largest.busbw < floor:
            results.append(
                deep_fault(
                    NAME,
                    Status.CRITICAL,
                    "nccl.allreduce.bw",
                    f"all-reduce bus bandwidth {largest.busbw:g} GB/s at {largest.size} bytes"
                    f" over {observation.gpus} x {model}, expected at least {floor:g} GB/s",
                    evidence=evidence,
                )
            )
        if not wrong and observation.run is not None and not observation.run.ok:
            # exits non-zero for wrong values (reported above) and for NCCL errors
            return [command_failed(NAME, TOOL, observation.run)]
        if not results:
            limit = f" (floor {floor:g})" if floor is not None else " (no floor for this model)"
            results.append(
                ok(
                    NAME,
                    f"all-reduce bus bandwidth {largest.busbw:g} GB/s at {largest.size} bytes"
                    f" over {observation.gpus} GPUs{limit}",
                    evidence=evidence,
                )
            )
        return results

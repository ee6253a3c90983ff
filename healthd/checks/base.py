"""The check vocabulary, the context checks see the world through, typed per-check
configuration, and the registry every check module adds itself to.

A check is a class registered with `@register(...)`. It has two halves:

* `gather(ctx, cfg) -> Observation` reads the host, only through `ctx` (roots below which
  /sys, /proc and /dev are read, a command runner, a clock, mount probes, later NVML). It may
  keep state between runs on the instance (previous counters, the last kernel log sequence
  number) and hands that state to `evaluate` inside the observation.
* `evaluate(observation, cfg) -> list[Result]` is a pure static method: the verdict follows
  from the observation and the configuration alone, so tests feed it observations directly.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from healthd.hostfs import HostRoots, MountOps, OsMountOps
from medic_core import proc
from medic_core.status import Status as Status
from medic_core.status import worst as worst
from medic_core.typed_config import (
    FieldProblem as FieldProblem,
)
from medic_core.typed_config import (
    bounds as bounds,
)
from medic_core.typed_config import (
    describe_config as describe_config,
)
from medic_core.typed_config import parse_table
from medic_core.typed_config import setting as setting
from medic_core.vocabulary import RECOMMENDATION_WORDS as RECOMMENDATION_WORDS
from medic_core.vocabulary import Recommendation as Recommendation

# --- vocabulary ----------------------------------------------------------------------------


class Tier(StrEnum):
    LAUNCH = "launch"  # gates a job's start; must fit the prolog's time budget
    PERIODIC = "periodic"  # passive, safe while jobs run
    DEEP = "deep"  # offline sweeps on an idle node


class Kind(StrEnum):
    """node-problem-detector's distinction: a CONDITION is the node's current state and
    replaces the previous verdict for (check, fault_class, target); an EVENT is something
    that happened since the last run (a kernel log line) and is not repeated next time."""

    CONDITION = "condition"
    EVENT = "event"


# Recommended remediation per fault class; the longest dotted prefix wins, so "fs" covers
# every fs.* class without its own entry. The one place this mapping lives.
REMEDIATIONS: Mapping[str, Recommendation] = {
    "ib.port.down": Recommendation.RECHECK,  # a link may come back: drain, re-check, a human
    "ib.port.missing": Recommendation.REBOOT,
    "ib.port.rate": Recommendation.DRAIN,
    "ib.errors": Recommendation.NONE,
    "fs": Recommendation.DRAIN,
    "fs.full": Recommendation.NONE,
    "fs.inodes": Recommendation.NONE,
    "mem.total.low": Recommendation.DRAIN,
    "mem.edac.ue": Recommendation.RMA,
    "mem.edac.ce_rate": Recommendation.NONE,
    "cpu.offline": Recommendation.REBOOT,
    "cpu.count": Recommendation.DRAIN,
    "kernel": Recommendation.NONE,
    "kernel.mce": Recommendation.DRAIN,
    "kernel.mce.corrected": Recommendation.NONE,
    "kernel.soft_lockup": Recommendation.REBOOT,
    "kernel.hard_lockup": Recommendation.REBOOT,
    "kernel.oops": Recommendation.REBOOT,
    "kernel.pcie.aer_fatal": Recommendation.DRAIN,
    "kernel.fs_error": Recommendation.DRAIN,
    "service.down": Recommendation.RESTART_SERVICE,
    "check": Recommendation.NONE,  # check.error, check.timeout, ...: never a hardware verdict
}


def remediation_for(fault_class: str | None) -> Recommendation | None:
    if not fault_class:
        return None
    parts = fault_class.split(".")
    for end in range(len(parts), 0, -1):
        found = REMEDIATIONS.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class Result:
    check: str
    status: Status
    fault_class: str | None  # dotted, e.g. "ib.port.down"; None for OK / NOT_APPLICABLE
    target: str | None  # "mlx5_0/1", "/lustre", a GPU index; None for the whole node
    message: str  # one line
    evidence: Mapping[str, Any] = field(default_factory=dict)
    remediation: Recommendation | None = None
    kind: Kind = Kind.CONDITION

    def __post_init__(self) -> None:
        if "\n" in self.message:
            object.__setattr__(self, "message", " ".join(self.message.split()))


def ok(
    check: str,
    message: str,
    *,
    target: str | None = None,
    evidence: Mapping[str, Any] | None = None,
    kind: Kind = Kind.CONDITION,
) -> Result:
    return Result(check, Status.OK, None, target, message, dict(evidence or {}), None, kind)


def not_applicable(check: str, message: str, evidence: Mapping[str, Any] | None = None) -> Result:
    return Result(check, Status.NOT_APPLICABLE, None, None, message, dict(evidence or {}))


def fault(
    check: str,
    status: Status,
    fault_class: str,
    message: str,
    *,
    target: str | None = None,
    evidence: Mapping[str, Any] | None = None,
    kind: Kind = Kind.CONDITION,
) -> Result:
    """A finding, with the remediation the table recommends for its fault class."""
    return Result(
        check,
        status,
        fault_class,
        target,
        message,
        dict(evidence or {}),
        remediation_for(fault_class),
        kind,
    )


# --- declared fault classes --------------------------------------------------------------

_FAULT_KEY = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*(\.\*)?$")


@dataclass(frozen=True)
class Fault:
    """One fault class a check can emit, as it declares it in `register(faults=...)`.

    `status`: what the finding is reported as (several when thresholds or configuration
    decide). `recommendation`: the recommendation word for findings that carry their own
    (GPU checks' `gpu_fault`, deep checks' `deep_fault` where REMEDIATIONS has no entry),
    per status when it depends on the status; None when `remediation_for` (REMEDIATIONS)
    decides. A key ending in `.*` declares a family whose members come from data (the XID
    catalog, kernel_log_rules.json)."""

    status: Status | tuple[Status, ...]
    meaning: str  # one line
    recommendation: str | Mapping[Status, str] | None = None

    @property
    def statuses(self) -> tuple[Status, ...]:
        return self.status if isinstance(self.status, tuple) else (self.status,)

    def words(self) -> tuple[str, ...]:
        """The declared recommendation words (none when REMEDIATIONS decides)."""
        if self.recommendation is None:
            return ()
        if isinstance(self.recommendation, str):
            return (self.recommendation,)
        return tuple(self.recommendation.values())


# Fault classes the runner, the daemon and the shared GPU helpers report for any check;
# never a hardware verdict (REMEDIATIONS: "check" -> none).
RUNNER_FAULTS: Mapping[str, Fault] = {
    "check.error": Fault(
        Status.UNKNOWN, "gather or evaluate raised, or evaluate returned no results"
    ),
    "check.timeout": Fault(Status.UNKNOWN, "no answer within the timeout; the thread is left"),
    "check.hung": Fault(
        Status.UNKNOWN, "an earlier run has not returned; not started again until it does"
    ),
    "check.unavailable": Fault(
        Status.UNKNOWN, "the context lacks something the check needs (e.g. nvml)"
    ),
    "check.busy": Fault(
        Status.UNKNOWN, "the daemon has no fresh result: a run could not start in time"
    ),
    "check.nvml.*": Fault(
        Status.UNKNOWN,
        "an NVML reading failed on a GPU: check.nvml.timeout, .gpu_lost, .unavailable, .error",
    ),
}


def covers(declared: str, fault_class: str) -> bool:
    """Whether a declared key (`gpu.ecc.dbe`, or a family `gpu.xid.*`) covers a class."""
    if declared.endswith(".*"):
        return fault_class.startswith(declared[:-1])
    return declared == fault_class


def declared_fault(faults: Mapping[str, Fault], fault_class: str) -> Fault | None:
    """The declaration covering `fault_class`: the exact key, else the longest family."""
    if fault_class in faults:
        return faults[fault_class]
    families = [k for k in faults if k.endswith(".*") and covers(k, fault_class)]
    return faults[max(families, key=len)] if families else None


def undeclared(spec: CheckSpec, result: Result) -> bool:
    """True when `result` carries a fault class that neither the check nor the runner
    declares (the reference in docs/checks.md would not mention it)."""
    if result.fault_class is None:
        return False
    return (
        declared_fault(spec.faults, result.fault_class) is None
        and declared_fault(RUNNER_FAULTS, result.fault_class) is None
    )


def _check_faults(name: str, faults: Mapping[str, Fault]) -> None:
    for key, declared in faults.items():
        where = f"check {name!r}: fault class {key!r}"
        if not _FAULT_KEY.match(key):
            raise ValueError(f"{where} is not dotted lower case (a family ends in .*)")
        if not isinstance(declared, Fault):
            raise ValueError(f"{where}: declare it as Fault(status, meaning)")
        if not declared.meaning.strip() or "\n" in declared.meaning:
            raise ValueError(f"{where}: the meaning must be one non-empty line")
        unknown = [w for w in declared.words() if w not in RECOMMENDATION_WORDS]
        if unknown:
            raise ValueError(f"{where}: unknown recommendation {unknown[0]!r}")


# --- the context: every side effect of a check goes through here --------------------------


class CommandRunner(Protocol):
    def __call__(self, argv: Sequence[str], *, timeout: float) -> proc.CommandResult: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def now(self) -> dt.datetime: ...


class ProcCommandRunner:
    def __call__(self, argv: Sequence[str], *, timeout: float) -> proc.CommandResult:
        return proc.run(argv, timeout=timeout)


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


# What a check may declare in `needs`; the runner reports UNKNOWN for a check whose needs
# the context does not provide (no NVML on this node, say).
CAPABILITIES = frozenset({"host", "commands", "clock", "mounts", "nvml"})
GPU_NEED = "nvml"  # a check that needs NVML is a GPU check


def gpu_checks_skipped(gpus: str, driver: bool) -> str:
    """Why this node runs no GPU checks, or "" when it runs them: the one rule of the daemon,
    the prolog's inline run and `medic check`. `gpus` is `[healthd] gpus`; `driver` whether
    NVML loaded (an NVML that loads but fails or hangs is a GPU node in trouble: its GPU
    checks run and say so). "none" is a CPU node; "auto" without a driver is one too;
    "required" never is (no driver: the GPU checks report it)."""
    if gpus == "none":
        return "not a GPU node ([healthd] gpus = none)"
    if gpus == "auto" and not driver:
        return "no NVIDIA driver on this node ([healthd] gpus = auto)"
    return ""


@dataclass(frozen=True)
class CheckContext:
    roots: HostRoots
    commands: CommandRunner = field(default_factory=ProcCommandRunner)
    clock: Clock = field(default_factory=SystemClock)
    mounts: MountOps = field(default_factory=OsMountOps)
    # The GPU checks' NVML client; typed by its own module, None where there is no NVML.
    nvml: Any | None = None
    # Why this node runs no GPU checks (`gpu_checks_skipped`), "" on a GPU node: the runner
    # leaves the GPU checks out instead of reporting them UNKNOWN.
    gpu_skip: str = ""
    # Where a check may keep state across daemon restarts (the trends check's series);
    # None: in memory only (`medic check`, tests).
    state_dir: Path | None = None

    @classmethod
    def for_root(cls, host_root: Path | str, **kwargs: Any) -> CheckContext:
        return cls(roots=HostRoots(Path(host_root)), **kwargs)

    def require_nvml(self) -> Any:
        """The NVML client, for checks that declared needs=("nvml",) (the runner does not
        call them without one)."""
        if self.nvml is None:
            raise RuntimeError("this context has no NVML client")
        return self.nvml

    def provides(self, capability: str) -> bool:
        if capability == "nvml":
            return self.nvml is not None
        return capability in CAPABILITIES


# --- typed per-check configuration ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CheckConfig:
    """Keys every `[checks.<name>]` table accepts; a check's own config subclasses this."""

    enabled: bool = setting(True, doc="run this check at all")
    interval: float | None = setting(
        None, minimum=1, doc="seconds between periodic runs (default: the check's own)"
    )
    timeout: float | None = setting(
        None, minimum=0.1, doc="seconds before the run is abandoned as UNKNOWN (default: own)"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        """Cross-field problems as (key, problem, fix); a subclass overrides this."""
        return iter(())

    def for_cpu_node(self) -> Self:
        """This configuration on a node declared a CPU node (`[healthd] gpus = "none"`):
        without what only a GPU node has (the services check's GPU daemons). A subclass
        overrides this; by default nothing changes."""
        return self


C = TypeVar("C", bound=CheckConfig)


def parse_check_config(
    config_type: type[C], table: Mapping[str, Any], *, prefix: str, source: Path | None
) -> C:
    return parse_table(config_type, table, prefix=prefix, source=source)


# --- checks and the registry ---------------------------------------------------------------

O = TypeVar("O")  # noqa: E741  (the observation type)


class Check(Generic[O, C]):
    """Base of every check. Subclasses set `config_type` and implement both halves; one
    instance lives as long as the daemon, so instance attributes carry state between runs."""

    config_type: ClassVar[type[CheckConfig]] = CheckConfig
    spec: ClassVar[CheckSpec]

    def gather(self, ctx: CheckContext, cfg: C) -> O:
        raise NotImplementedError

    @staticmethod
    def evaluate(observation: O, cfg: C) -> list[Result]:
        raise NotImplementedError


@dataclass(frozen=True)
class CheckSpec:
    name: str
    tiers: frozenset[Tier]
    interval: float  # default seconds between periodic runs
    timeout: float  # default seconds before a run is UNKNOWN
    needs: tuple[str, ...]
    description: str
    check_class: type[Check[Any, Any]]
    module: str
    # fault class (or family "x.*") -> what the check declares about it; see Fault
    faults: Mapping[str, Fault] = field(default_factory=dict)

    @property
    def config_type(self) -> type[CheckConfig]:
        return self.check_class.config_type

    def create(self) -> Check[Any, Any]:
        return self.check_class()

    def default_config(self) -> CheckConfig:
        return self.config_type()

    @property
    def is_gpu_check(self) -> bool:
        return GPU_NEED in self.needs

    def interval_for(self, cfg: CheckConfig) -> float:
        return cfg.interval if cfg.interval is not None else self.interval

    def timeout_for(self, cfg: CheckConfig) -> float:
        return cfg.timeout if cfg.timeout is not None else self.timeout


_REGISTRY: dict[str, CheckSpec] = {}

K = TypeVar("K", bound=type[Check[Any, Any]])


def register(
    *,
    name: str,
    tiers: Sequence[Tier],
    interval: float,
    timeout: float,
    faults: Mapping[str, Fault],
    needs: Sequence[str] = ("host",),
    description: str | None = None,
) -> Callable[[K], K]:
    """Class decorator: add a check to the registry (its module's import is enough).

    `faults` declares every fault class the check itself can emit (the runner's are in
    RUNNER_FAULTS); docs/checks.md is generated from it and tests hold the source to it."""

    def add(cls: K) -> K:
        unknown = set(needs) - CAPABILITIES
        if unknown:
            raise ValueError(f"check {name!r}: unknown needs {sorted(unknown)}")
        _check_faults(name, faults)
        if not tiers or timeout <= 0 or interval <= 0:
            raise ValueError(f"check {name!r}: needs a tier, a timeout and an interval")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.module != cls.__module__:
            where = f"{existing.module}, {cls.__module__}"
            raise ValueError(f"check {name!r} registered twice: {where}")
        doc = description or (cls.__doc__ or "").strip().splitlines()[0:1]
        spec = CheckSpec(
            name=name,
            tiers=frozenset(tiers),
            interval=float(interval),
            timeout=float(timeout),
            needs=tuple(needs),
            description=doc if isinstance(doc, str) else "".join(doc),
            check_class=cls,
            module=cls.__module__,
            faults=dict(faults),
        )
        cls.spec = spec
        _REGISTRY[name] = spec
        return cls

    return add


def registered() -> tuple[CheckSpec, ...]:
    """The checks registered so far, by name (see healthd.checks.registry(), which imports
    every check module first)."""
    return tuple(_REGISTRY[n] for n in sorted(_REGISTRY))

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

import dataclasses
import datetime as dt
import re
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from healthd.hostfs import HostRoots, MountOps, OsMountOps
from medic_core import proc
from medic_core.config import ConfigError
from medic_core.status import Status as Status
from medic_core.status import worst as worst

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


class Remediation(StrEnum):
    NONE = "none"  # report only
    DRAIN = "drain"  # take the node out of service for a human
    RESTART_SERVICE = "restart_service"
    REBOOT = "reboot"
    RMA = "rma"  # hardware replacement


# Recommended remediation per fault class; the longest dotted prefix wins, so "fs" covers
# every fs.* class without its own entry. The one place this mapping lives.
REMEDIATIONS: Mapping[str, Remediation] = {
    "ib.port.down": Remediation.REBOOT,
    "ib.port.missing": Remediation.REBOOT,
    "ib.port.rate": Remediation.DRAIN,
    "ib.errors": Remediation.NONE,
    "fs": Remediation.DRAIN,
    "fs.full": Remediation.NONE,
    "fs.inodes": Remediation.NONE,
    "mem.total.low": Remediation.DRAIN,
    "mem.edac.ue": Remediation.RMA,
    "mem.edac.ce_rate": Remediation.NONE,
    "cpu.offline": Remediation.REBOOT,
    "cpu.count": Remediation.DRAIN,
    "kernel": Remediation.NONE,
    "kernel.mce": Remediation.DRAIN,
    "kernel.mce.corrected": Remediation.NONE,
    "kernel.soft_lockup": Remediation.REBOOT,
    "kernel.hard_lockup": Remediation.REBOOT,
    "kernel.oops": Remediation.REBOOT,
    "kernel.pcie.aer_fatal": Remediation.DRAIN,
    "kernel.fs_error": Remediation.DRAIN,
    "service.down": Remediation.RESTART_SERVICE,
    "check": Remediation.NONE,  # check.error, check.timeout, ...: never a hardware verdict
}


# Recommendation words a finding may carry in evidence["recommendation"] (GPU and deep
# checks): the Remediation values plus the GPU resets (see healthd.checks.gpu_common).
RECOMMENDATION_WORDS: tuple[str, ...] = (
    *(r.value for r in Remediation),
    "gpu_reset",
    "gpu_reset_when_idle",
)


def remediation_for(fault_class: str | None) -> Remediation | None:
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
    remediation: Remediation | None = None
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


@dataclass(frozen=True)
class CheckContext:
    roots: HostRoots
    commands: CommandRunner = field(default_factory=ProcCommandRunner)
    clock: Clock = field(default_factory=SystemClock)
    mounts: MountOps = field(default_factory=OsMountOps)
    # The GPU checks' NVML client; typed by its own module, None where there is no NVML.
    nvml: Any | None = None

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


def bounds(
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    doc: str = "",
) -> dict[str, Any]:
    """Field metadata the config parser enforces: numeric bounds, allowed strings, allowed
    table keys, and one line of documentation."""
    return {"minimum": minimum, "maximum": maximum, "choices": choices, "keys": keys, "doc": doc}


def setting(
    default: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: Sequence[str] | None = None,
    doc: str = "",
) -> Any:
    """A configuration field with an immutable default (for a dict default use
    `field(default_factory=..., metadata=bounds(...))`)."""
    return field(
        default=default,
        metadata=bounds(minimum=minimum, maximum=maximum, choices=choices, doc=doc),
    )


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


class FieldProblem(ValueError):
    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(f"{key}: {problem}; {fix}")
        self.key, self.problem, self.fix = key, problem, fix


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _convert(value: Any, tp: Any, key: str, meta: Mapping[str, Any]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(value, inner[0], key, meta)
    if origin is tuple:
        if not isinstance(value, list):
            raise FieldProblem(key, f"expected a list, got {value!r}", "write a TOML array")
        item = typing.get_args(tp)[0]
        return tuple(_convert(v, item, key, meta) for v in value)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise FieldProblem(key, f"expected a table, got {value!r}", "write a TOML table")
        item = typing.get_args(tp)[1]
        allowed = meta.get("keys")
        out = {}
        for k, v in value.items():
            if allowed is not None and k not in allowed:
                raise FieldProblem(f"{key}.{k}", "unknown key", f"use one of: {', '.join(allowed)}")
            out[k] = _convert(v, item, f"{key}.{k}", meta)
        return out
    ok_type = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(tp)
    if ok_type is None:
        raise TypeError(f"{key}: configuration type {tp!r} is not supported")
    if not ok_type:
        raise FieldProblem(key, f"expected {_TYPE_WORDS[tp]}, got {value!r}", "fix the value")
    if tp is float:
        value = float(value)
    if tp in (int, float):
        low, high = meta.get("minimum"), meta.get("maximum")
        if low is not None and value < low:
            raise FieldProblem(key, f"{value} is below the minimum {low}", f"use at least {low}")
        if high is not None and value > high:
            raise FieldProblem(key, f"{value} is above the maximum {high}", f"use at most {high}")
    choices = meta.get("choices")
    if tp is str and choices is not None and value not in choices:
        raise FieldProblem(key, f"{value!r} is not allowed", f"use one of: {', '.join(choices)}")
    return value


C = TypeVar("C", bound=CheckConfig)


def parse_check_config(
    config_type: type[C], table: Mapping[str, Any], *, prefix: str, source: Path | None
) -> C:
    """Build a check's config from its TOML table; errors are ConfigError naming the key
    (`checks.ib.min_rate_gbps`) and the file."""
    hints = typing.get_type_hints(config_type)
    fields = {f.name: f for f in dataclasses.fields(config_type)}
    values: dict[str, Any] = {}
    try:
        for key, raw in table.items():
            if key not in fields:
                raise FieldProblem(key, "unknown key", f"use one of: {', '.join(sorted(fields))}")
            values[key] = _convert(raw, hints[key], key, fields[key].metadata)
        cfg = config_type(**values)
        for problem in cfg.problems():
            raise FieldProblem(*problem)
    except FieldProblem as exc:
        raise ConfigError(source, f"{prefix}.{exc.key}", exc.problem, exc.fix) from exc
    return cfg


def describe_config(config_type: type[CheckConfig]) -> list[tuple[str, str, str]]:
    """(key, default, doc) for every key, for docs and `medic checks list`."""
    rows = []
    for f in dataclasses.fields(config_type):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        rows.append((f.name, repr(default), str(f.metadata.get("doc", ""))))
    return rows


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

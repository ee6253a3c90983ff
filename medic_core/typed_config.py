"""Typed settings tables: a frozen dataclass per TOML table, each field with its default,
bounds and one line of documentation; `parse_table` builds one from its table and names the
file, the key and the fix of every problem (ConfigError, one line each).

Every number has a range and a unit: the field's own `minimum`/`maximum` where it gives
them, else its unit's (UNITS), the unit named by the field (`unit=`) or found from its name
(UNIT_OF_NAME). A number no rule names (a site check's own key) gets NUMBER's range: finite
and bounded all the same."""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from medic_core.config import ConfigError, shown


@dataclass(frozen=True)
class Unit:
    """What a number counts, and the range a number of it may take when its field gives no
    bound of its own."""

    symbol: str  # written after the number in a message ("" for a plain count)
    minimum: float
    maximum: float


DAY = 86400
UNITS: dict[str, Unit] = {
    "s": Unit("s", 0, DAY),  # a timeout, interval, window or wait: a day at most
    "days": Unit("days", 0, 3650),
    "count": Unit("", 0, 1_000_000_000),
    "share": Unit("", 0, 1),
    "percent": Unit("%", 0, 100),
    "factor": Unit("x", 1, 1000),
    "rate": Unit("", 0, 1_000_000_000),  # Gbit/s, MB/s, TFLOPS, errors per hour
    "port": Unit("", 0, 65535),
    "celsius": Unit("C", 0, 150),
    "bytes": Unit("B", 0, 1 << 30),
    "KiB": Unit("KiB", 0, 1 << 20),
    "MiB": Unit("MiB", 0, 1 << 20),
    "GiB": Unit("GiB", 0, 1 << 20),
    "code": Unit("", 0, 65535),  # an exit status, an XID
    "number": Unit("", -1_000_000_000, 1_000_000_000),  # a site check's number no rule names
}
# Field name -> unit, first match wins (a field's own `unit=` comes before all of them).
UNIT_OF_NAME: tuple[tuple[str, str], ...] = (
    (r"hang_window", "count"),  # step times in the median, not seconds
    (r".*_percent", "percent"),
    (r".*_days|hold_days", "days"),
    (r"(.*_)?share|jitter|min_fraction_of_rate", "share"),
    (r".*_kib", "KiB"),
    (r".*_mib", "MiB"),
    (r".*_gib", "GiB"),
    (r"message_size", "bytes"),
    (r".*_(gbps|mbps|tflops)|.*per_hour", "rate"),
    (r".*_temperature_c", "celsius"),
    (r"(.*_)?port", "port"),
    (r".*_(ratio|factor)", "factor"),
    (r".*_codes|ignore_xids", "code"),
    (r"(.*_)?(timeout|interval|seconds|wait|window|every|budget|age|floor|poll|delay|span)"
     r"|backoff_(base|cap)|retry_after_max|cooldown|purge_after|immediate", "s"),
    (r"(.*_)?(count|limit|limits|steps|repeats|jobs|nodes|drained|restarts|episodes|gpus"
     r"|attempts|requalifications|links|ports|gen|width|iterations|keep|points|lost|timeouts"
     r"|pages|size|n|level|window)|hang_window|max_gpus", "count"),
)  # fmt: skip
_UNIT_RULES = tuple((re.compile(pattern), unit) for pattern, unit in UNIT_OF_NAME)


def unit_of(name: str, meta: Mapping[str, Any]) -> str:
    """The unit of field `name`: its own `unit`, else the first UNIT_OF_NAME rule it
    matches, else "number"."""
    if meta.get("unit"):
        return str(meta["unit"])
    for pattern, unit in _UNIT_RULES:
        if pattern.fullmatch(name):
            return unit
    return "number"


def field_range(f: dataclasses.Field[Any], tp: Any = None) -> tuple[float, float, str]:
    """(minimum, maximum, unit) a number of field `f` must keep to."""
    unit = unit_of(f.name, f.metadata)
    low, high = f.metadata.get("minimum"), f.metadata.get("maximum")
    return (
        UNITS[unit].minimum if low is None else low,
        UNITS[unit].maximum if high is None else high,
        unit,
    )


def _number(value: float, unit: str) -> str:
    symbol = UNITS[unit].symbol
    return f"{value} {symbol}" if symbol else str(value)


class Table(Protocol):
    def problems(self) -> Iterator[tuple[str, str, str]]:
        """Cross-field problems as (key, problem, fix)."""
        ...


def bounds(
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    unit: str | None = None,
    doc: str = "",
) -> dict[str, Any]:
    """Field metadata the config parser enforces: numeric bounds (else the unit's), allowed
    strings, allowed table keys, the unit (else found from the name), and one line of
    documentation."""
    if unit is not None and unit not in UNITS:
        raise ValueError(f"unit {unit!r}: not one of {', '.join(UNITS)}")
    return {
        "minimum": minimum, "maximum": maximum, "choices": choices, "keys": keys,
        "unit": unit, "doc": doc,
    }  # fmt: skip


def setting(
    default: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: Sequence[str] | None = None,
    unit: str | None = None,
    doc: str = "",
) -> Any:
    """A configuration field with an immutable default (for a dict default use
    `field(default_factory=..., metadata=bounds(...))`)."""
    return field(
        default=default,
        metadata=bounds(minimum=minimum, maximum=maximum, choices=choices, unit=unit, doc=doc),
    )


class FieldProblem(ValueError):
    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(f"{key}: {problem}; {fix}")
        self.key, self.problem, self.fix = key, problem, fix


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _convert(value: Any, tp: Any, key: str, meta: Mapping[str, Any], unit: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(value, inner[0], key, meta, unit)
    if origin is tuple:
        if not isinstance(value, list):
            raise FieldProblem(key, f"expected a list, got {shown(value)}", "write a TOML array")
        item = typing.get_args(tp)[0]
        return tuple(_convert(v, item, key, meta, unit) for v in value)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise FieldProblem(key, f"expected a table, got {shown(value)}", "write a TOML table")
        item = typing.get_args(tp)[1]
        allowed = meta.get("keys")
        out = {}
        for k, v in value.items():
            if allowed is not None and k not in allowed:
                raise FieldProblem(f"{key}.{k}", "unknown key", f"use one of: {', '.join(allowed)}")
            out[k] = _convert(v, item, f"{key}.{k}", meta, unit)
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
        raise FieldProblem(key, f"expected {_TYPE_WORDS[tp]}, got {shown(value)}", "fix the value")
    if tp is float:
        if (
            isinstance(value, int)
            and not -UNITS["number"].maximum <= value <= UNITS["number"].maximum
        ):
            value = math.inf  # an integer too large for a float: past any range
        value = float(value)
        if not math.isfinite(value):  # nan passes every bound check; inf is no setting
            raise FieldProblem(key, f"{value} is not a finite number", "give a plain number")
    if tp in (int, float):
        unit_ = UNITS[unit]
        low = unit_.minimum if meta.get("minimum") is None else meta["minimum"]
        high = unit_.maximum if meta.get("maximum") is None else meta["maximum"]
        if value < low:
            raise FieldProblem(
                key, f"{_number(value, unit)} is below the minimum {_number(low, unit)}",
                f"use at least {low}",
            )  # fmt: skip
        if value > high:
            raise FieldProblem(
                key, f"{shown(value)} is above the maximum {_number(high, unit)}",
                f"use at most {high}",
            )  # fmt: skip
    choices = meta.get("choices")
    if tp is str and choices is not None and value not in choices:
        raise FieldProblem(
            key, f"{shown(value)} is not allowed", f"use one of: {', '.join(choices)}"
        )
    return value


C = TypeVar("C", bound=Table)


def parse_table(
    config_type: type[C], table: Mapping[str, Any], *, prefix: str, source: Path | None
) -> C:
    """Build a settings table (a check's config, `[hooks]`, ...) from its TOML table; errors
    are ConfigError naming the key (`checks.ib.min_rate_gbps`) and the file."""
    hints = typing.get_type_hints(config_type)
    fields = {f.name: f for f in dataclasses.fields(config_type)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    found: list[FieldProblem] = []
    for key, raw in table.items():
        try:
            if key not in fields:
                raise FieldProblem(key, "unknown key", f"use one of: {', '.join(sorted(fields))}")
            meta = fields[key].metadata
            values[key] = _convert(raw, hints[key], key, meta, unit_of(key, meta))
        except FieldProblem as exc:
            found.append(exc)
    if not found:  # cross-field rules read whole values: only when every key parsed
        cfg = config_type(**values)
        found += [FieldProblem(*problem) for problem in cfg.problems()]
    if found:
        raise ConfigError.of(
            [ConfigError(source, f"{prefix}.{p.key}", p.problem, p.fix) for p in found]
        )
    return cfg


def describe_config(config_type: type[Any]) -> list[tuple[str, str, str]]:
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

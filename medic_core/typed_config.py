"""Typed settings tables: a frozen dataclass per TOML table, each field with its default,
bounds and one line of documentation; `parse_table` builds one from its table and names the
file, the key and the fix of the first problem (ConfigError)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from medic_core.config import ConfigError


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
        if not math.isfinite(value):  # nan passes every bound check; inf is no setting
            raise FieldProblem(key, f"{value} is not a finite number", "give a plain number")
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


C = TypeVar("C", bound=Table)


def parse_table(
    config_type: type[C], table: Mapping[str, Any], *, prefix: str, source: Path | None
) -> C:
    """Build a settings table (a check's config, `[hooks]`, ...) from its TOML table; errors
    are ConfigError naming the key (`checks.ib.min_rate_gbps`) and the file."""
    hints = typing.get_type_hints(config_type)
    fields = {f.name: f for f in dataclasses.fields(config_type)}  # type: ignore[arg-type]
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

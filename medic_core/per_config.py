"""Settings parsed once per configuration: the cache every settings table's `from_config`
goes through (a MedicConfig is immutable; a reload makes a new one)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from medic_core.config import MedicConfig

SettingsT = TypeVar("SettingsT")
ParsedT = TypeVar("ParsedT")


def per_config(
    parse: Callable[[type[SettingsT], MedicConfig], ParsedT],
) -> Callable[[type[SettingsT], MedicConfig], ParsedT]:
    """Parse a table once per configuration object. A MedicConfig is immutable and a reload
    makes a new one, so the result cannot go stale; the daemon's hang watch, ladder and
    every launch request asked for their settings again each time (5 % of the daemon's
    CPU went into get_type_hints)."""
    last: dict[type[SettingsT], tuple[MedicConfig, ParsedT]] = {}

    @functools.wraps(parse)
    def parsed(cls: type[SettingsT], config: MedicConfig) -> ParsedT:
        hit = last.get(cls)
        if hit is not None and hit[0] is config:
            return hit[1]
        value = parse(cls, config)
        last[cls] = (config, value)
        return value

    return parsed

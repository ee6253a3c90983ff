"""healthd's checks. Every module in this package that does not start with "_" (and is not
`base`) is a check module; importing it registers its check, and `registry()` imports them
all with pkgutil, so adding a check is adding a file."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from healthd.checks.base import (
    Check,
    CheckConfig,
    CheckContext,
    CheckSpec,
    Clock,
    CommandRunner,
    Kind,
    Recommendation,
    Result,
    Status,
    Tier,
    fault,
    gpu_checks_skipped,
    not_applicable,
    ok,
    parse_check_config,
    register,
    registered,
    remediation_for,
    setting,
    worst,
)
from medic_core.config import ConfigError, MedicConfig

__all__ = [
    "Check",
    "CheckConfig",
    "CheckContext",
    "CheckSpec",
    "Clock",
    "CommandRunner",
    "Kind",
    "Recommendation",
    "Result",
    "Status",
    "Tier",
    "fault",
    "get",
    "gpu_checks_skipped",
    "load_check_configs",
    "not_applicable",
    "ok",
    "register",
    "registry",
    "remediation_for",
    "setting",
    "worst",
]

_NOT_CHECKS = frozenset({"base", "reference"})


def discover() -> None:
    """Import every check module in this package (idempotent)."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_CHECKS:
            continue
        importlib.import_module(f"{__name__}.{info.name}")


def registry() -> tuple[CheckSpec, ...]:
    """Every check: name, tiers, interval, timeout, needs, description, config type."""
    discover()
    return registered()


def get(name: str) -> CheckSpec:
    for spec in registry():
        if spec.name == name:
            return spec
    raise KeyError(name)


def load_check_configs(config: MedicConfig) -> dict[str, CheckConfig]:
    """Each check's config from the `[checks.<name>]` tables, defaults for the rest; on a
    node declared a CPU node (`[healthd] gpus = "none"`) without what only a GPU node has
    (`CheckConfig.for_cpu_node`: the services check's GPU daemons)."""
    from medic_core.settings import DaemonSettings

    cpu_node = DaemonSettings.from_config(config).gpus == "none"
    specs = {spec.name: spec for spec in registry()}
    table: Any = config.table("checks")
    if not isinstance(table, Mapping):
        raise ConfigError(config.source, "checks", "expected a table", "write [checks.<name>]")
    for name, sub in table.items():
        if name not in specs:
            raise ConfigError(
                config.source,
                f"checks.{name}",
                "unknown check",
                f"use one of: {', '.join(sorted(specs))}",
            )
        if not isinstance(sub, Mapping):
            raise ConfigError(
                config.source, f"checks.{name}", "expected a table", f"write [checks.{name}]"
            )
    configs = {
        name: parse_check_config(
            spec.config_type, table.get(name, {}), prefix=f"checks.{name}", source=config.source
        )
        for name, spec in specs.items()
    }
    if cpu_node:
        configs = {name: cfg.for_cpu_node() for name, cfg in configs.items()}
    return configs

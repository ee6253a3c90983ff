"""healthd's checks. Every module in this package that does not start with "_" (and is not
`base`) is a check module; importing it registers its check, and `registry()` imports them
all with pkgutil, so adding a check is adding a file.

A site adds checks without touching this package: Python checks through the `medic.checks`
entry-point group (healthd.checks.site, loaded by `registry()`), and command checks as
`[checks.command.<name>]` tables (healthd.checks.command; `specs_for` adds them to the
registered checks for a runner)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
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
from healthd.checks.command import NAME_RE as COMMAND_NAME
from healthd.checks.command import PREFIX as COMMAND_PREFIX
from healthd.checks.command import TABLE as COMMAND_TABLE
from healthd.checks.command import CommandCheckConfig, command_spec
from medic_core.config import ConfigError, MedicConfig

__all__ = [
    "Check",
    "CheckConfig",
    "CheckContext",
    "CheckSpec",
    "CheckTables",
    "Clock",
    "CommandRunner",
    "Kind",
    "Recommendation",
    "Result",
    "Status",
    "Tier",
    "check_tables",
    "disabled_by",
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
    "specs_for",
    "worst",
]

_NOT_CHECKS = frozenset({"base", "reference", "command", "site"})
# Modules of this package that several checks share and that register none.
_HELPERS = frozenset({"gpu_common", "deep_common"})
# The entry-point group of a site's Python checks (healthd.checks.site loads them).
SITE_GROUP = "medic.checks"


def discover() -> None:
    """Import every check module in this package (idempotent)."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_CHECKS:
            continue
        importlib.import_module(f"{__name__}.{info.name}")


def registry(site: bool = True) -> tuple[CheckSpec, ...]:
    """Every check: name, tiers, interval, timeout, needs, description, config type; with
    `site`, the site's entry-point checks too (loaded on the first call)."""
    discover()
    if site:
        from healthd.checks.site import load_site_checks

        load_site_checks()
    return registered()


def shipped_checks() -> frozenset[str]:
    """The shipped checks' names, none imported: each check module registers the one check
    of its own name (tests/test_checks_registry.py holds them to it)."""
    return frozenset(
        info.name
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_") and info.name not in _NOT_CHECKS | _HELPERS
    )


def specs_for(configs: Mapping[str, CheckConfig]) -> tuple[CheckSpec, ...]:
    """The checks a runner with these configs runs: the registry's, and one per site
    command table (`command.<name>`, its spec built from its table)."""
    commands = [
        command_spec(name, cfg)
        for name, cfg in sorted(configs.items())
        if isinstance(cfg, CommandCheckConfig)
    ]
    return (*registry(), *commands)


def _command_configs(table: Any, source: Any) -> dict[str, CheckConfig]:
    """`[checks.command.<name>]` tables, each parsed and checked (ConfigError names the
    file, the table, the key and the fix)."""
    if not isinstance(table, Mapping):
        raise ConfigError(
            source, f"checks.{COMMAND_TABLE}", "expected a table", "write [checks.command.<name>]"
        )
    configs: dict[str, CheckConfig] = {}
    problems: list[ConfigError] = []
    for name, sub in table.items():
        where = f"checks.{COMMAND_TABLE}.{name}"
        if not COMMAND_NAME.match(name):
            problems.append(ConfigError(
                source,
                where,
                "a command check's name must be 1-64 of a-z, 0-9 and _",
                "rename the table, e.g. [checks.command.gpfs_state]",
            ))  # fmt: skip
        elif not isinstance(sub, Mapping):
            problems.append(ConfigError(source, where, "expected a table", f"write [{where}]"))
        else:
            try:
                configs[COMMAND_PREFIX + name] = parse_check_config(
                    CommandCheckConfig, sub, prefix=where, source=source
                )
            except ConfigError as exc:
                problems += [exc, *exc.others]
    if problems:
        raise ConfigError.of(problems)
    return configs


def get(name: str) -> CheckSpec:
    for spec in registry():
        if spec.name == name:
            return spec
    raise KeyError(name)


# `[checks] disabled = ["gpu_ecc", "command.gpfs"]`: the fleet's kill switches in one list,
# beside each check's own `[checks.<name>] enabled = false`.
DISABLED = "disabled"


def _disabled_list(
    value: Any, configs: Collection[str], source: Any
) -> tuple[set[str], list[ConfigError]]:
    where = f"checks.{DISABLED}"
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        fix = 'a list of check names, e.g. disabled = ["gpu_ecc"]'
        return set(), [ConfigError(source, where, f"expected {fix}, got {value!r}", "write " + fix)]
    unknown = [v for v in value if v not in configs]
    if unknown:
        known = ", ".join(sorted(configs))
        problem = f"{', '.join(map(repr, unknown))}: no such check"
        return set(), [ConfigError(source, where, problem, f"use any of: {known}")]
    return set(value), []


def disabled_by(config: MedicConfig, name: str) -> str:
    """Which switch turned check `name` off (for `medic checks`, `medic check` and
    `medic config check`): `[checks] disabled`, else its own table's `enabled`."""
    table: Any = config.table("checks")
    listed = table.get(DISABLED, []) if isinstance(table, Mapping) else []
    if isinstance(listed, list) and name in listed:
        return f"[checks] {DISABLED}"
    return f"[checks.{name}] enabled = false"


@dataclass(frozen=True)
class CheckTables:
    """Every check's config as `load_check_configs` gives it, but for the shipped checks
    without a table of their own, which `check_tables` leaves unimported (issue 27: `medic
    config check` in <= 0.15 s): each is its defaults, enabled unless `[checks] disabled`
    lists it (tests/test_checks_registry.py holds every shipped check's defaults valid)."""

    configs: Mapping[str, CheckConfig]  # parsed: the checks with a table, site and command
    at_defaults: frozenset[str]  # shipped checks with no table, not imported
    listed_off: frozenset[str]  # `[checks] disabled`

    def names(self) -> list[str]:
        return sorted({*self.configs, *self.at_defaults})

    def disabled(self) -> list[str]:
        off = [name for name, cfg in self.configs.items() if not cfg.enabled]
        return sorted([*off, *(self.at_defaults & self.listed_off)])


def load_check_configs(config: MedicConfig) -> dict[str, CheckConfig]:
    """Each check's config from the `[checks.<name>]` tables, defaults for the rest, and one
    per `[checks.command.<name>]` table (keyed `command.<name>`); on a
    node declared a CPU node (`[healthd] gpus = "none"`) without what only a GPU node has
    (`CheckConfig.for_cpu_node`: the services check's GPU daemons)."""
    return dict(_parse_checks(config, {spec.name: spec for spec in registry()}).configs)


def check_tables(config: MedicConfig) -> CheckTables:
    """The same tables, the same problems as `load_check_configs`, importing only the
    shipped checks that have a table (and every check when a site ships its own: then the
    daemon's order of loading, shipped checks first, decides which name is whose)."""
    if site_checks_declared():
        return _parse_checks(config, {spec.name: spec for spec in registry()})
    table: Any = config.table("checks")
    shipped = shipped_checks()
    for name in sorted(shipped & set(table if isinstance(table, Mapping) else ())):
        importlib.import_module(f"{__name__}.{name}")
    specs = {spec.name: spec for spec in registered()}
    return _parse_checks(config, specs, shipped - set(specs))


def site_checks_declared() -> bool:
    """Whether a distribution on sys.path may declare `medic.checks` entry points, found
    without importlib.metadata (which alone costs `medic config check` a tenth of its start):
    each *.dist-info or *.egg-info directory's entry_points.txt is searched for the group's
    name. What it cannot read that way (a zip on sys.path, an unreadable directory) counts as
    yes: then every check loads, as the daemon loads them."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except FileNotFoundError:
            continue
        except OSError:  # a zip or egg file, a directory this process may not read
            return True
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(entry or ".", name, "entry_points.txt"), "rb") as f:
                    if SITE_GROUP.encode() in f.read():
                        return True
            except (FileNotFoundError, NotADirectoryError):  # no entry points; a PKG-INFO file
                continue
            except OSError:
                return True
    return False


def _parse_checks(
    config: MedicConfig, specs: Mapping[str, CheckSpec], at_defaults: frozenset[str] = frozenset()
) -> CheckTables:
    from medic_core.settings import DaemonSettings

    problems: list[ConfigError] = []  # every table's, one line each (medic config check)
    try:
        cpu_node = DaemonSettings.from_config(config).gpus == "none"
    except ConfigError as exc:
        problems += [exc, *exc.others]
        cpu_node = False
    table: Any = config.table("checks")
    known = {*specs, *at_defaults}
    if not isinstance(table, Mapping):
        raise ConfigError(config.source, "checks", "expected a table", "write [checks.<name>]")
    bad = set()
    for name, sub in table.items():
        if (name == COMMAND_TABLE and name not in specs) or name == DISABLED:
            continue
        if name not in known:
            problems.append(ConfigError(
                config.source,
                f"checks.{name}",
                "unknown check",
                f"use one of: {', '.join(sorted(known))}",
            ))  # fmt: skip
        elif not isinstance(sub, Mapping):
            bad.add(name)
            problems.append(ConfigError(
                config.source, f"checks.{name}", "expected a table", f"write [checks.{name}]"
            ))  # fmt: skip
    configs: dict[str, CheckConfig] = {}
    for name, spec in specs.items():
        if name in bad:
            continue
        try:
            configs[name] = parse_check_config(
                spec.config_type, table.get(name, {}), prefix=f"checks.{name}", source=config.source
            )
        except ConfigError as exc:
            problems += [exc, *exc.others]
    if COMMAND_TABLE not in specs:
        try:
            configs.update(_command_configs(table.get(COMMAND_TABLE, {}), config.source))
        except ConfigError as exc:
            problems += [exc, *exc.others]
    off, listed_problems = _disabled_list(
        table.get(DISABLED, []), {*configs, *at_defaults}, config.source
    )
    problems += listed_problems
    if problems:
        raise ConfigError.of(problems)
    configs = {
        n: dataclasses.replace(c, enabled=False) if n in off else c for n, c in configs.items()
    }
    if cpu_node:
        configs = {name: cfg.for_cpu_node() for name, cfg in configs.items()}
    return CheckTables(configs, at_defaults, frozenset(off))

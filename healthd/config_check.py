"""The one validator of medic.toml: `medic config check`, the daemon's start and every reload
(SIGHUP) run it, so a file one of them accepts the others accept too.

It parses every table (each with its own rules: types, ranges and units, choices, unknown
keys; see medic_core.typed_config) and then checks what only this host can tell: every argv
this node runs (the ladder's repair commands, the isolation command, site command checks)
starts with an absolute path to an executable file that exists. The sweep's probe is left
alone: srun runs it on the swept node, whose files this host cannot see.

Every problem is one ConfigError line (file, key, problem, fix); `validate_config` raises
the first carrying the rest (ConfigError.lines()), never another exception.

The problems are found without importing the shipped checks that have no table in the file
(healthd.checks.check_tables: their defaults are valid), so that `medic config check` starts
in <= 0.15 s (issue 27); `validate_config` then loads every check for the daemon.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from typing import Any

from healthd.checks import CheckTables, check_tables, load_check_configs
from healthd.checks.base import CheckConfig
from healthd.checks.command import CommandCheckConfig
from medic_core.config import ConfigError, MedicConfig, shown
from medic_core.hygiene_settings import HygieneSettings
from medic_core.inventory import FleetSettings
from medic_core.pair_settings import PairSettings
from medic_core.settings import (
    BurnInSettings,
    DaemonSettings,
    EvidenceSettings,
    HookSettings,
    IsolationSettings,
    RemediationSettings,
    SpareSettings,
    SweepSettings,
    WebhookSettings,
)
from medic_core.store_reader import checked_store_url

SLURM_KEYS = ("conf",)


def program_problems(argv: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """(problem, fix) when argv's program is not an absolute path to an executable file
    that exists on this host (the daemon's PATH is not an operator's shell's)."""
    if not argv or not argv[0]:
        return  # the table's own rules name an empty argv
    program = argv[0]
    if not program.startswith("/"):
        yield (
            f"program {shown(program)} is not an absolute path",
            "give its full path (the daemon's PATH is not your shell's)",
        )
        return
    try:
        st = os.stat(program)
    except FileNotFoundError:
        yield f"program {program} does not exist", "install it or give the path where it is"
        return
    except OSError as exc:  # a directory on the way this process may not search, a loop
        yield f"program {program}: {exc.strerror or exc}", "give a path root can reach"
        return
    if not stat.S_ISREG(st.st_mode):
        yield f"program {program} is not a file", "give the path of the program itself"
    elif not os.access(program, os.X_OK):
        yield f"program {program} is not executable", f"chmod +x {program}, or fix the path"


def _slurm_and_lab(config: MedicConfig) -> Iterator[ConfigError]:
    for key, value in config.table("slurm").items():
        if key not in SLURM_KEYS:
            yield ConfigError(config.source, f"slurm.{key}", "unknown key", "use conf")
        elif not isinstance(value, str) or not value.startswith("/"):
            yield ConfigError(
                config.source, "slurm.conf", f"expected an absolute path, got {shown(value)}",
                'give the path of slurm.conf, e.g. "/etc/slurm/slurm.conf"',
            )  # fmt: skip
    for key in config.table("lab"):
        yield ConfigError(
            config.source, f"lab.{key}", "unknown key", "nothing reads [lab]: remove it"
        )


def config_problems(config: MedicConfig) -> list[ConfigError]:
    """Every problem of `config`, one line each, in the file's order of tables (empty: good)."""
    return _problems_and_checks(config)[0]


def _problems_and_checks(config: MedicConfig) -> tuple[list[ConfigError], CheckTables | None]:
    problems: list[ConfigError] = []

    def parsed(parse: Callable[[], Any]) -> Any:
        try:
            return parse()
        except ConfigError as exc:
            problems.extend([exc, *exc.others])
            return None

    def programs(prefix: str, **argvs: tuple[str, ...]) -> None:
        for key, argv in argvs.items():
            for problem, fix in program_problems(argv):
                problems.append(ConfigError(config.source, f"{prefix}.{key}", problem, fix))

    parsed(lambda: DaemonSettings.from_config(config))
    parsed(lambda: HookSettings.from_config(config))
    remediation = parsed(lambda: RemediationSettings.from_config(config))
    if remediation is not None:
        programs(
            "remediation", gpu_reset=remediation.gpu_reset, driver_reload=remediation.driver_reload
        )
    isolation = parsed(lambda: IsolationSettings.from_config(config))
    if isolation is not None and (isolation.enabled or isolation.apply):
        programs("remediation.isolation", apply=isolation.apply)
    parsed(lambda: SpareSettings.from_config(config))
    parsed(lambda: BurnInSettings.from_config(config))
    parsed(lambda: EvidenceSettings.from_config(config))
    parsed(lambda: SweepSettings.from_config(config))
    parsed(lambda: PairSettings.from_config(config))
    parsed(lambda: WebhookSettings.from_config(config))
    parsed(lambda: checked_store_url(config))
    parsed(lambda: FleetSettings.from_config(config))
    parsed(lambda: HygieneSettings.from_config(config))
    problems.extend(_slurm_and_lab(config))
    checks: CheckTables | None = parsed(lambda: check_tables(config))
    for name, check in (checks.configs if checks else {}).items():
        if isinstance(check, CommandCheckConfig) and check.enabled:
            programs(f"checks.{name}", argv=check.argv)
    unique: dict[str, ConfigError] = {}
    for problem in problems:  # the checks' loader reads [healthd] too: its problems once
        unique.setdefault(str(problem), problem)
    return list(unique.values()), checks


def validate_config(config: MedicConfig) -> dict[str, CheckConfig]:
    """Every check's config when `config` is good; else ConfigError: the first problem,
    carrying the others (`lines()`)."""
    problems = config_problems(config)
    if problems:
        raise ConfigError.of(problems)
    return load_check_configs(config)


def validated_checks(config: MedicConfig) -> CheckTables:
    """`validate_config` for `medic config check`: the same problems raised the same way,
    the checks as `check_tables` gives them (those without a table not imported)."""
    problems, checks = _problems_and_checks(config)
    if problems or checks is None:
        raise ConfigError.of(problems)
    return checks

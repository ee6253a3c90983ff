"""`medic config check`: validate medic.toml as the daemon does at start and on a reload.

Apart from cli.admin so that it loads none of what the other admin commands need (the node
views, Slurm's client, the remediation policy): issue 27 asks it to start in <= 0.15 s
(tests/test_cli_startup_imports.py, bench/cli_startup.py).
"""

from __future__ import annotations

from pathlib import Path

import click

from cli.common import EXIT_PROBLEM, config_option, warn
from medic_core.config import ConfigError, MedicConfig, load_config


def check_config(config: MedicConfig) -> list[str]:
    """Validate every table the way the daemon does at start and on a reload; returns what
    was checked. Raises ConfigError (one line per problem: file, key, problem, fix)."""
    from healthd.config_check import validated_checks  # the daemon's own, start and reload
    from medic_core.settings import RemediationSettings, WebhookSettings
    from medic_core.store_reader import checked_store_url

    checks = validated_checks(config)
    webhook = WebhookSettings.from_config(config)
    shown = checked_store_url(config)
    names, off = checks.names(), checks.disabled()
    observed = RemediationSettings.from_config(config).observe_only
    return [
        f"{len(names) - len(off)} of {len(names)} checks enabled"
        + (f" (disabled: {', '.join(off)})" if off else ""),
        f"store {shown}",
        "webhook " + ("on" if webhook else "off"),
        *(["observe only: Medic changes nothing in Slurm"] if observed else []),
    ]


@click.group("config")
def config_group() -> None:
    """Medic's configuration file."""


@config_group.command("check")
@config_option
def config_check(config_path: Path | None) -> None:
    """Load medic.toml and validate every table as the daemon does; OK or the error."""
    from medic_core.settings import deprecations

    try:
        config = load_config(config_path)
        summary = check_config(config)
    except ConfigError as exc:
        for line in exc.lines():  # every problem, one line each
            click.echo(f"medic: {line}", err=True)
        raise SystemExit(EXIT_PROBLEM) from exc
    except ValueError as exc:
        click.echo(f"medic: {exc}", err=True)
        raise SystemExit(EXIT_PROBLEM) from exc
    source = config.source or "<built-in defaults: no config file>"
    for line in deprecations(config):
        warn(line)
    click.echo(f"OK {source}: {', '.join(summary)}")


# `config` is the name operators type; `config_group` keeps the Python name free.
config = config_group

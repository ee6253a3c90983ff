"""`medic checks`: the registered health checks (`list`) and their reference (`docs`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from healthd.checks import disabled_by, load_check_configs, registry, specs_for
from healthd.checks.base import CheckConfig
from healthd.checks.reference import DOC_PATH, ordered_tiers, render_reference, write_reference
from medic_core.config import ConfigError, load_config


@click.group("checks")
def checks() -> None:
    """The health checks: what runs, when, and what each can report."""


def _configs(path: Path | None) -> tuple[dict[str, CheckConfig], dict[str, str]]:
    """Each check's config, and the switch that turned each disabled one off."""
    if path is None:
        return {spec.name: spec.default_config() for spec in registry()}, {}
    try:
        config = load_config(path)
        configs = load_check_configs(config)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    off = {name: disabled_by(config, name) for name, cfg in configs.items() if not cfg.enabled}
    return configs, off


@checks.command("list")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="medic.toml to take enabled/interval/timeout from (default: built-in defaults)",
)
@click.option("--json", "as_json", is_flag=True, help="one JSON array instead of a table")
def list_checks(config_path: Path | None, as_json: bool) -> None:
    """Every registered check (and, with --config, its site command checks): tiers,
    interval, timeout, needs, enabled."""
    configs, off = _configs(config_path)
    rows: list[dict[str, Any]] = []
    for spec in specs_for(configs):
        cfg = configs[spec.name]
        rows.append(
            {
                "name": spec.name,
                "tiers": [t.value for t in ordered_tiers(spec)],
                "interval": spec.interval_for(cfg),
                "timeout": spec.timeout_for(cfg),
                "needs": list(spec.needs),
                "enabled": cfg.enabled,
                "disabled_by": off.get(spec.name, ""),
                "description": spec.description,
                "faults": sorted(spec.faults),
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    header = ("NAME", "TIERS", "INTERVAL", "TIMEOUT", "NEEDS", "ENABLED")
    table = [header] + [
        (
            r["name"],
            ",".join(r["tiers"]),
            f"{r['interval']:g}s",
            f"{r['timeout']:g}s",
            ",".join(r["needs"]),
            "yes" if r["enabled"] else f"no: {r['disabled_by']}" if r["disabled_by"] else "no",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@checks.command("docs")
@click.option(
    "--write",
    is_flag=True,
    help="rewrite the generated block of docs/checks.md in place instead of printing",
)
@click.option(
    "--path",
    "doc_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DOC_PATH,
    show_default=True,
    help="the page whose generated block --write replaces",
)
def docs(write: bool, doc_path: Path) -> None:
    """The checks reference (the generated part of docs/checks.md)."""
    if not write:
        click.echo(render_reference(), nl=False)
        return
    try:
        changed = write_reference(doc_path)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{doc_path}: {exc}") from exc
    click.echo(f"{doc_path}: {'updated' if changed else 'already up to date'}")
    if doc_path == DOC_PATH:  # the project's own docs: the XID action table too
        from cli.xid_table import DOC_PATH as ACTIONS_PATH
        from cli.xid_table import write_xid_actions

        try:
            changed = write_xid_actions()
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"{ACTIONS_PATH}: {exc}") from exc
        click.echo(f"{ACTIONS_PATH}: {'updated' if changed else 'already up to date'}")

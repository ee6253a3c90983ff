"""`medic report`'s section "Post-job hygiene" (remediation.hygiene_report)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import click

from cli.admin import load, opened_store
from cli.common import table
from remediation.hygiene_report import HygieneRow, hygiene_in


def hygiene_rows(
    params: Mapping[str, Any], since: dt.datetime, until: dt.datetime
) -> list[HygieneRow]:
    config = load(params["config_path"])
    with opened_store(config, params["store_url"]) as store:
        return hygiene_in(store, since, until)


def print_hygiene(rows: Sequence[HygieneRow], top: int) -> None:
    """The section; nothing when no epilog cleaned anything in the window."""
    if not rows:
        return
    drains = sum(r.drains for r in rows)
    click.echo("")
    click.echo(
        f"Post-job hygiene: {sum(r.jobs for r in rows)} jobs left something; {drains} drains"
        " as user_problem (user problems, not hardware faults: not in MTTR or lemons)"
    )
    shown = [
        [r.node, str(r.jobs), str(r.processes), str(r.files), str(r.drains), str(r.resumed),
         "-" if r.median_out is None else f"{r.median_out:.0f}s"]
        for r in rows[:top]
    ]  # fmt: skip
    headers = ["NODE", "JOBS", "PROCESSES", "FILES", "USER_PROBLEM", "RESUMED", "MEDIAN OUT"]
    for line in table(headers, shown):
        click.echo(line)
    if len(rows) > top:
        click.echo(f"({top} of {len(rows)}; --top for more)")

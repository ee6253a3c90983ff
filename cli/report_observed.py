"""`medic report`'s section "What Medic would have done" (observe-only mode:
remediation.observe, remediation.observed_report)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import click

from cli.admin import load, opened_store
from cli.common import table, when
from remediation.observed_report import Would, would_have_done


def would_in(params: Mapping[str, Any], since: dt.datetime, until: dt.datetime) -> list[Would]:
    """What observe-only mode recorded in the report's window, from the store it reads."""
    config = load(params["config_path"])
    with opened_store(config, params["store_url"]) as store:
        return would_have_done(store, since, until)


def print_would(rows: Sequence[Would], top: int) -> None:
    """The section; nothing when observe-only mode recorded nothing in the window."""
    if not rows:
        return
    times = sum(w.times for w in rows)
    click.echo("")
    click.echo(f"What Medic would have done (observe only): {len(rows)} decisions, {times} times")
    shown = [
        [w.node, w.actor, w.action, w.subject, str(w.times), when(w.first), w.decision[:80]]
        for w in rows[:top]
    ]
    headers = ["NODE", "ACTOR", "WOULD", "SUBJECT", "TIMES", "FIRST", "DECISION"]
    for line in table(headers, shown):
        click.echo(line)
    if len(rows) > top:
        click.echo(f"({top} of {len(rows)}; --top for more)")


def print_sections(
    params: Mapping[str, Any], result: Any, would: Sequence[Would], top: int
) -> None:
    """The sections after the report's own: this one, then post-job hygiene's."""
    from cli.report_hygiene import hygiene_rows, print_hygiene

    print_would(would, top)
    print_hygiene(hygiene_rows(params, result.since, result.until), top)

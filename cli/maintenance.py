"""`medic maintenance`: a planned window on some nodes (remediation.maintenance)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import click

from cli.admin import EXIT_USAGE, AdminError, config_option, load, now_utc, when
from cli.report_whatif import parse_hours

POLL = 1.0  # seconds between looks while waiting for the lead and the start


def _seconds(option: str, text: str) -> float:
    return parse_hours(option, text, default_unit="m") * 3600


def _start(text: str, now: dt.datetime) -> dt.datetime:
    """`+10m` (from now), or an ISO time (without a zone: local time)."""
    if text.startswith("+"):
        return now + dt.timedelta(seconds=_seconds("--start", text[1:]))
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise AdminError(
            f"--start {text!r}: expected +DURATION (+30m) or an ISO time (2026-12-01T06:00)",
            code=EXIT_USAGE,
        ) from None
    return value if value.tzinfo else value.astimezone()


@click.command("maintenance")
@click.option("--nodes", required=True, help="The window's nodes, a Slurm host list (n[1-4]).")
@click.option("--start", "start_text", required=True, help="+30m from now, or an ISO time.")
@click.option("--duration", "duration_text", required=True, help="How long: 2h, 90m.")
@click.option(
    "--lead",
    "lead_text",
    default="10m",
    show_default=True,
    help="Requeue resilient jobs this long before the start (their checkpoint's time).",
)
@click.option("--name", default="", help="The reservation's name (default medic-maint-<start>).")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait for the lead time, requeue, and wait for the start; --no-wait requeues only"
    " if the lead time has come.",
)
@config_option
def maintenance(
    nodes: str,
    start_text: str,
    duration_text: str,
    lead_text: str,
    name: str,
    wait: bool,
    config_path: Path | None,
) -> None:
    """A maintenance window: Slurm's maintenance reservation on the nodes, resilient jobs
    requeued from their checkpoint before it starts."""
    from cli.common import slurm_client
    from medic_core.slurm import SlurmError, expand_hostlist
    from remediation.actions import slurm_env
    from remediation.maintenance import NAME, MaintenanceSlurm, requeue_before

    now = now_utc()
    start = _start(start_text, now)
    minutes = max(1, round(_seconds("--duration", duration_text) / 60))
    lead = _seconds("--lead", lead_text)
    try:
        names = expand_hostlist(nodes)
    except ValueError as exc:
        raise AdminError(f"--nodes {nodes!r}: {exc}", code=EXIT_USAGE) from None
    if not names:
        raise AdminError("--nodes: no node named", code=EXIT_USAGE)
    if start <= now:
        raise AdminError(f"--start {when(start)} is not in the future", code=EXIT_USAGE)
    name = name or f"medic-maint-{start.astimezone(dt.UTC):%Y%m%dT%H%M%S}"
    if not NAME.fullmatch(name):
        raise AdminError(f"--name {name!r}: 1-64 of letters, digits, _ - .", code=EXIT_USAGE)
    config = load(config_path)
    timeout = slurm_client(config).timeout
    slurm = MaintenanceSlurm(env=slurm_env(config), timeout=timeout)
    try:
        slurm.create_window(name, nodes, round((start - now_utc()).total_seconds()), minutes)
    except SlurmError as exc:
        raise AdminError(
            f"reservation {name}: Slurm refused it", str(exc), "fix and retry"
        ) from exc
    click.echo(f"reservation {name}: {nodes} from {when(start)} for {minutes} min (MAINT)")
    due = start - dt.timedelta(seconds=lead)
    if now_utc() < due and not wait:
        click.echo(f"resilient jobs not requeued yet: run again with --wait, or after {when(due)}")
        return
    while now_utc() < due:
        time.sleep(min(POLL, (due - now_utc()).total_seconds()))
    plan, failed = requeue_before(slurm, names, name)
    for job_id in plan.requeue:
        if job_id not in dict(failed):
            click.echo(f"job {job_id}: requeued (resilient: restarts from its checkpoint)")
    for job_id, why in [*plan.left, *failed]:
        click.echo(f"job {job_id}: left: {why}")
    if not wait:
        return
    while now_utc() < start:
        time.sleep(min(POLL, max(0.0, (start - now_utc()).total_seconds())))
    busy = sorted({j.job_id for n in names for j in slurm.jobs_on(n)})
    state = f"jobs still on them: {', '.join(busy)}" if busy else "no job on them"
    click.echo(f"window {name} started: {nodes}, {state}")

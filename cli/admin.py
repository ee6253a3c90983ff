"""`medic events|jobs|remediation|config`, and what every admin command shares: the config
and store options, aligned tables, errors in three lines (what, why, what to do) and the exit
codes (0 ok, 1 problem found or refused, 2 usage or configuration error).

`medic nodes` lives in cli/nodes.py and `medic node ...` in cli/node_commands.py, both
with the same helpers; `medic config` lives in cli/config_cmd.py (re-exported here), which
imports none of this.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli import node_view
from cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    AdminError,
    actor,
    age,
    clip,
    config_option,
    echo_json,
    echo_table,
    iso,
    json_option,
    load,
    now_utc,
    opened_store,
    rung_name,
    slurm_client,
    store_option,
    table,
    warn,
    when,
)
from cli.complete import complete_node
from cli.config_cmd import config  # `medic config` lives in its own, lighter module
from medic_core.resilient import parse_resilient
from medic_core.slurm import JobInfo, SlurmError

# The store (SQLAlchemy), the episodes and the settings load inside the commands that use
# them: `medic report`, `medic config check` and every --help import this module
# (tests/test_cli_startup_imports.py).
if TYPE_CHECKING:
    from medic_core.store import Event, Store
    from remediation import episodes as ep

_DURATION = re.compile(r"^(\d+)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: dt.datetime) -> dt.datetime:
    """`90s`, `30m`, `1h`, `2d`, `1w`, or an ISO time (without a zone: local time)."""
    match = _DURATION.match(text.strip().lower())
    if match:
        return now - dt.timedelta(seconds=int(match.group(1)) * _UNIT[match.group(2)])
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a duration (30m, 1h, 2d, 1w) nor an ISO time "
            "(2025-03-01T04:00); give one of those"
        ) from None
    return value if value.tzinfo else value.astimezone()


def event_json(e: Event) -> dict[str, Any]:
    return {
        "id": e.id,
        "at": iso(e.at),
        "node": e.node,
        "kind": e.kind,
        "severity": e.severity.value,
        "fault_class": e.fault_class,
        "target": e.target,
        "message": e.message,
        "source": e.source,
        "evidence": e.evidence,
    }


def event_rows(events: Iterable[Event], with_node: bool = True) -> list[list[str]]:
    rows = []
    for e in events:
        row = [when(e.at)]
        if with_node:
            row.append(e.node)
        row += [
            e.kind,
            e.severity.value,
            e.fault_class or "-",
            e.target or "-",
            clip(e.message, 80),
        ]
        rows.append(row)
    return rows


EVENT_HEADERS = ("TIME", "NODE", "KIND", "SEVERITY", "FAULT", "TARGET", "MESSAGE")


# --- medic events ---------------------------------------------------------------------------


@click.command("events")
@click.option("--since", "since_text", default="24h", show_default=True,
              help="How far back: 30m, 1h, 2d, 1w, or an ISO time.")  # fmt: skip
@click.option("--node", help="Only this node's events.", shell_complete=complete_node)
@click.option("--kind", help="Only events of this kind (gpu_xid, kernel_log, gate, job_action, "
              "remediation, admin, ...).")  # fmt: skip
@click.option("--limit", default=200, show_default=True, type=click.IntRange(1, 100_000),
              help="At most this many, newest first.")  # fmt: skip
@json_option
@store_option
@config_option
def events(
    since_text: str,
    node: str | None,
    kind: str | None,
    limit: int,
    as_json: bool,
    store_url: str | None,
    config_path: Path | None,
) -> None:
    """What happened: events from the store, newest first."""
    now = now_utc()
    since = parse_since(since_text, now)
    config = load(config_path)
    with opened_store(config, store_url) as store:
        found = store.events(node=node, since=since, kind=kind, limit=limit)
    if as_json:
        echo_json([event_json(e) for e in found])
        return
    if not found:
        click.echo(f"no events since {when(since)}")
        return
    echo_table(EVENT_HEADERS, event_rows(found))
    if len(found) == limit:
        click.echo(f"(the newest {limit}; --limit or --since for more)")


# --- medic jobs -----------------------------------------------------------------------------

JOB_EVENT_KINDS = ("job_action", "gate")


def job_events(store: Store, job_ids: Sequence[str], since: dt.datetime) -> dict[str, list[Event]]:
    """job_action and gate events of these jobs since `since`, oldest first, by job id."""
    from sqlalchemy import select

    from medic_core.store import Event, Severity
    from medic_core.store.models import EventRow

    by_job: dict[str, list[Event]] = {j: [] for j in job_ids}
    if not job_ids:
        return by_job
    query = (
        select(EventRow)
        .where(EventRow.kind.in_(JOB_EVENT_KINDS), EventRow.at >= since)
        .where(EventRow.target.in_([f"job:{j}" for j in job_ids]))
        .order_by(EventRow.at, EventRow.id)
    )
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    for row in rows:
        m = row._mapping
        event = Event(
            id=int(m["id"]), node=m["node"], at=_aware(m["at"]), kind=m["kind"],
            fault_class=m["fault_class"], target=m["target"], severity=Severity(m["severity"]),
            message=m["message"], evidence=dict(m["evidence"] or {}), source=m["source"],
        )  # fmt: skip
        by_job[m["target"].removeprefix("job:")].append(event)
    return by_job


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def job_json(
    job: JobInfo, asked: int | None, history: Sequence[Event], max_restarts: int | None = None
) -> dict[str, Any]:
    """`restarts_used`: what Medic charged (the job's ledger, the budget the decision core
    counts); `slurm_restarts`: Slurm's own count, which a prolog refusal raises too."""
    from remediation.decide import Ledger, capped_budget

    return {
        "job_id": job.job_id,
        "name": job.name,
        "user": job.user,
        "state": job.state,
        "reason": job.reason,
        "nodes": job.nodes,
        "partition": job.partition,
        "resilient": asked is not None,
        "restarts_asked": asked,
        "restarts_allowed": capped_budget(asked, max_restarts) if asked is not None else None,
        "restarts_used": Ledger.parse(job.admin_comment).restarts,
        "slurm_restarts": job.restart_count,
        "admin_comment": job.admin_comment,
        "events": [event_json(e) for e in history],
    }


def newest_action(history: Sequence[Event]) -> Event | None:
    """The newest of a job's events by time; at the same time, an action (a requeue) wins
    over a gate decision, then the later record."""
    if not history:
        return None
    return max(history, key=lambda e: (e.at, e.kind == "job_action", e.id or 0))


def _last_action(history: Sequence[Event]) -> str:
    last = newest_action(history)
    if last is None:
        return "-"
    what = last.evidence.get("action") if last.kind == "job_action" else None
    if last.kind == "gate":
        what = "gate allowed" if last.evidence.get("allow") else "gate refused"
    fault = f" ({last.fault_class})" if last.fault_class else ""
    return f"{when(last.at)} {last.node}: {what or last.message}{fault}"


@click.command("jobs")
@click.option("--all", "show_all", is_flag=True, help="Every job, not only resilient ones.")
@click.option("--since", "since_text", default="7d", show_default=True,
              help="How far back to look for job_action and gate events.")  # fmt: skip
@json_option
@store_option
@config_option
def jobs(
    show_all: bool,
    since_text: str,
    as_json: bool,
    store_url: str | None,
    config_path: Path | None,
) -> None:
    """Resilient jobs (the medic:resilient=N tag): restarts charged, state, Medic's actions.

    MEDIC_RESTARTS: what Medic charged (the job's ledger) of what it allows (the tag, capped
    by [remediation] max_restarts); SLURM_RESTARTS: Slurm's own count, which a prolog
    refusal raises too."""
    from medic_core.settings import RemediationSettings
    from remediation.decide import Ledger, capped_budget

    now = now_utc()
    since = parse_since(since_text, now)
    config = load(config_path)
    try:
        found = slurm_client(config).jobs()
    except SlurmError as exc:
        raise AdminError(
            "cannot list jobs", str(exc), "check that slurmctld answers (squeue) and [slurm] conf"
        ) from exc
    listed = [(j, parse_resilient(j.comment)) for j in found]
    if not show_all:
        listed = [(j, n) for j, n in listed if n is not None]
    with opened_store(config, store_url) as store:
        history = job_events(store, [j.job_id for j, _ in listed], since)
    cap = RemediationSettings.from_config(config).max_restarts
    if as_json:
        echo_json([job_json(j, n, history[j.job_id], cap) for j, n in listed])
        return
    if not listed:
        click.echo("no resilient jobs in the queue" if not show_all else "no jobs in the queue")
        return
    rows = []
    for job, asked in listed:
        charged = Ledger.parse(job.admin_comment).restarts
        restarts = f"{charged}/{capped_budget(asked, cap)}" if asked is not None else "-"
        rows.append(
            [job.job_id, clip(job.name, 24), job.user, job.state, restarts,
             str(job.restart_count), job.nodes or "-", _last_action(history[job.job_id])]
        )  # fmt: skip
    header = ("JOB", "NAME", "USER", "STATE", "MEDIC_RESTARTS", "SLURM_RESTARTS", "NODES",
              "LAST MEDIC ACTION")  # fmt: skip
    echo_table(header, rows)


# --- medic remediation ----------------------------------------------------------------------


@click.group("remediation")
def remediation() -> None:
    """The remediation ladder: what it is doing, and its fleet-wide pause switch."""


def _control_json(control: ep.Control) -> dict[str, Any]:
    return {
        "paused": control.paused,
        "reason": control.reason,
        "actor": control.actor,
        "since": iso(control.since),
    }


def _control_line(control: ep.Control, now: dt.datetime) -> str:
    if not control.paused:
        tail = (
            f" (resumed {age(control.since, now)} ago by {control.actor})" if control.since else ""
        )
        return f"remediation: running{tail}"
    return (
        f"remediation: PAUSED since {when(control.since)} by {control.actor or '?'}: "
        f"{control.reason or '(no reason given)'}"
    )


# The words `medic remediation status` lists: the ladder has, or had, the node.
LADDER_WORDS = (
    node_view.REPAIRING, node_view.PAUSED, node_view.WAITING_CAP, node_view.NEEDS_HUMAN,
    node_view.RMA,
)  # fmt: skip


@remediation.command("status")
@click.option("--no-slurm", "store_only", is_flag=True, help="Do not ask Slurm; the store only.")
@json_option
@store_option
@config_option
def remediation_status(
    store_only: bool, as_json: bool, store_url: str | None, config_path: Path | None
) -> None:
    """The pause switch and every node the ladder is repairing, or that waits for a human or
    an RMA, with the same word `medic nodes` gives it."""
    from remediation import episodes as ep

    now = now_utc()
    config = load(config_path)
    slurm_nodes = None
    if not store_only:
        try:
            slurm_nodes = slurm_client(config).nodes()
        except SlurmError as exc:
            warn("Slurm did not answer: the store's view only", str(exc),
                 "check slurmctld (sinfo) and [slurm] conf, or pass --no-slurm")  # fmt: skip
    with opened_store(config, store_url) as store:
        control = ep.EpisodeStore(store).control()
        facts = node_view.gather(store)
    states = node_view.states_of(slurm_nodes, facts, now)
    shown = sorted(
        ((name, s) for name, s in states.items() if s.word in LADDER_WORDS),
        key=lambda pair: (pair[1].episode.opened_at if pair[1].episode else now, pair[0]),
    )
    if as_json:
        echo_json(
            {
                **_control_json(control),
                "episodes": [
                    {**episode_json(s.episode), "medic": s.word, "why": s.why}
                    for _, s in shown
                    if s.episode is not None
                ],
                "nodes": [{"node": name, **s.to_json()} for name, s in shown],
            }
        )
        return
    click.echo(_control_line(control, now))
    if not shown:
        click.echo("no node being repaired, waiting for a human or in RMA")
        return
    click.echo(node_view.summary_counts(s for _, s in shown))
    echo_table(
        ("NODE", "MEDIC", "EPISODE", "STATE", "RUNG", "FAULT", "TARGET", "OPENED", "UPDATED",
         "WHY"),
        (
            [name, s.word] + (
                [str(e.id), e.state, rung_name(e.rung), e.fault_class, e.target or "-",
                 when(e.opened_at), f"{age(e.updated_at, now)} ago"]
                if (e := s.episode) is not None else ["-"] * 7
            ) + [clip(s.why, 90)]
            for name, s in shown
        ),
    )  # fmt: skip


def episode_json(e: ep.Episode, steps: Sequence[ep.Step] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": e.id,
        "node": e.node,
        "state": e.state,
        "open": e.open,
        "fault_class": e.fault_class,
        "target": e.target,
        "check": e.check,
        "recommendation": e.recommendation,
        "first_rung": rung_name(e.first_rung),
        "rung": rung_name(e.rung),
        "attempts": dict(e.attempts),
        "message": e.message,
        "failed_requalifications": e.failed_requalifications,
        "ticket_id": e.ticket_id,
        "opened_at": iso(e.opened_at),
        "updated_at": iso(e.updated_at),
        "closed_at": iso(e.closed_at),
    }
    if steps is not None:
        out["steps"] = [
            {
                "id": s.id,
                "rung": rung_name(s.rung),
                "action": s.action,
                "attempt": s.attempt,
                "state": s.state,
                "argv": list(s.argv),
                "returncode": s.returncode,
                "output": s.output,
                "started_at": iso(s.started_at),
                "ended_at": iso(s.ended_at),
            }
            for s in steps
        ]
    return out


@remediation.command("pause")
@click.option("--reason", required=True, help="Why (shown to everyone who asks for the status).")
@store_option
@config_option
def remediation_pause(reason: str, store_url: str | None, config_path: Path | None) -> None:
    """Stop every node's ladder from taking new actions (drains and requeues go on)."""
    if not reason.strip():
        raise AdminError("--reason is empty", "a pause must say why", "give --reason TEXT",
                         EXIT_USAGE)  # fmt: skip
    from remediation import episodes as ep

    config = load(config_path)
    with opened_store(config, store_url) as store:
        control = ep.EpisodeStore(store).set_paused(True, reason, actor())
    click.echo(_control_line(control, now_utc()))


@remediation.command("resume")
@click.option("--reason", default="", help="Why (optional).")
@store_option
@config_option
def remediation_resume(reason: str, store_url: str | None, config_path: Path | None) -> None:
    """Let the ladder act again."""
    from remediation import episodes as ep

    config = load(config_path)
    with opened_store(config, store_url) as store:
        control = ep.EpisodeStore(store).set_paused(False, reason, actor())
    click.echo(_control_line(control, now_utc()))


__all__ = [
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "AdminError",
    "actor",
    "age",
    "clip",
    "config",
    "config_option",
    "echo_json",
    "echo_table",
    "events",
    "iso",
    "jobs",
    "json_option",
    "load",
    "now_utc",
    "opened_store",
    "remediation",
    "rung_name",
    "slurm_client",
    "store_option",
    "table",
    "warn",
    "when",
]

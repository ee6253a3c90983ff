"""The rows `medic report` needs, read from the store with a few narrow queries.

What is read: job_action events in the window (the interrupting ones and the rest, for the
jobs each node touched), the gate and job_summary events of the interrupted jobs only, the
fault events of the nodes those happened on, the episodes and RMA tickets that overlap the
window, their steps, and the number of nodes the store knows. Nothing is read per job or
per node in a loop: 10,000 nodes and 90 days stay a handful of indexed queries.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import (
    BindParameter,
    Executable,
    String,
    TextClause,
    any_,
    bindparam,
    func,
    literal_column,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY

from medic_core.store import Store
from medic_core.store.models import ConditionRow, EventRow, RmaTicketRow, UTCDateTime
from remediation import episodes as ep
from remediation.report.jobs import FAULT_LOOKBACK
from remediation.report.rows import (
    INTERRUPTING,
    REBOOT_SEEN,
    EpisodeRow,
    FaultSeen,
    JobAction,
    JobEnd,
    JobStart,
    StepRow,
    TicketRow,
)

HOOK_KINDS = ("gate", "job_summary", "job_action", "remediation", "admin")
# The run a fault ended may have started before the window: its gate is looked for this far.
RUN_LOOKBACK = dt.timedelta(days=7)
# Share of the events table in the window above which SQLite reads the whole table.
SCAN_SHARE = 0.3
_CHUNK = 500  # values per IN (...): under SQLite's and PostgreSQL's parameter limits


def _utc(value: Any) -> dt.datetime:
    assert isinstance(value, dt.datetime)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _chunks(values: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(values), _CHUNK):
        yield values[i : i + _CHUNK]


def scan_whole_table(store: Store, since: dt.datetime, until: dt.datetime) -> bool:
    """True on SQLite when most events are in the window: reading the table in order is
    then faster than following the (kind, at) index to rows all over it (3x on the
    10,000-node bench), and SQLite keeps no statistics on time ranges to choose this by
    itself. PostgreSQL's planner does choose."""
    if store.backend != "sqlite":
        return False
    with store.engine.connect() as conn:
        total = conn.execute(select(func.count()).select_from(EventRow)).scalar() or 0
        inside = (
            conn.execute(
                select(func.count()).where(EventRow.at >= since, EventRow.at <= until)
            ).scalar()
            or 0
        )
    return total > 0 and inside >= SCAN_SHARE * total


def _events(scan: bool, columns: str, where: str) -> TextClause:
    """A SQLite query on events, read in table order when `scan`."""
    table = "events NOT INDEXED" if scan else "events"
    return text(f"SELECT {columns} FROM {table} WHERE {where}")


def job_actions(
    store: Store, since: dt.datetime, until: dt.datetime, *, scan: bool = False
) -> list[JobAction]:
    """The job_action events naming a job in the window."""
    action = EventRow.evidence["action"].as_string()
    known_at = EventRow.evidence["known_at"].as_string()
    fault_at = EventRow.evidence["fault_at"].as_string()
    query: Executable = select(
        EventRow.node,
        EventRow.at,
        EventRow.target,
        EventRow.fault_class,
        action,
        known_at,
        fault_at,
    ).where(
        EventRow.kind == "job_action",
        EventRow.at >= since,
        EventRow.at <= until,
        action.is_not(None),
    )
    if scan:
        query = (
            _events(
                True,
                "node, at, target, fault_class, json_extract(evidence, '$.action'),"
                " json_extract(evidence, '$.known_at'), json_extract(evidence, '$.fault_at')",
                "kind = 'job_action' AND at >= :since AND at <= :until"
                " AND json_extract(evidence, '$.action') IS NOT NULL",
            )
            .bindparams(_when("since", since), _when("until", until))
            .columns(at=UTCDateTime())
        )
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        JobAction(
            job_id=target.removeprefix("job:"),
            node=node,
            at=_utc(at),
            action=str(what),
            fault_class=fault_class,
            known_at=_parse_time(known),
            fault_at=_parse_time(happened),
        )
        for node, at, target, fault_class, what, known, happened in rows
        if target.startswith("job:")
    ]


def _when(name: str, value: dt.datetime) -> BindParameter[dt.datetime]:
    return bindparam(name, value, type_=UTCDateTime())


def _one_of(store: Store, column: Any, values: Sequence[str]) -> Any:
    """`column IN values` with the values as one bound parameter (a JSON array on SQLite, an
    array on PostgreSQL): one pass over the rows however many values, and no limit on
    their number."""
    if store.backend == "postgresql":
        return column == any_(bindparam("values", list(values), type_=ARRAY(String)))
    each = func.json_each(bindparam("values", json.dumps(list(values)), type_=String))
    return column.in_(select(literal_column("value")).select_from(each))


def job_records(
    store: Store,
    job_ids: Iterable[str],
    since: dt.datetime,
    until: dt.datetime,
    *,
    scan: bool = False,
) -> tuple[list[JobStart], list[JobEnd]]:
    """Gate decisions and job summaries of these jobs."""
    targets = sorted({f"job:{j}" for j in job_ids})
    starts: list[JobStart] = []
    ends: list[JobEnd] = []
    if not targets:
        return starts, ends
    allow = EventRow.evidence["allow"].as_boolean()
    query: Executable = select(
        EventRow.kind, EventRow.node, EventRow.at, EventRow.target, allow
    ).where(
        EventRow.kind.in_(("gate", "job_summary")),
        EventRow.at >= since - RUN_LOOKBACK,
        EventRow.at <= until,
        _one_of(store, EventRow.target, targets),
    )
    if scan:
        query = (
            _events(
                True,
                "kind, node, at, target, json_extract(evidence, '$.allow')",
                "kind IN ('gate', 'job_summary') AND at >= :since AND at <= :until"
                " AND target IN (SELECT value FROM json_each(:targets))",
            )
            .bindparams(
                _when("since", since - RUN_LOOKBACK),
                _when("until", until),
                bindparam("targets", json.dumps(targets)),
            )
            .columns(at=UTCDateTime())
        )
    with store.engine.connect() as conn:
        for kind, node, at, target, allowed in conn.execute(query):
            job_id = target.removeprefix("job:")
            if kind == "gate":
                starts.append(JobStart(job_id, node, _utc(at), bool(allowed)))
            else:
                ends.append(JobEnd(job_id, node, _utc(at)))
    return starts, ends


def faults(
    store: Store, nodes: Iterable[str], since: dt.datetime, until: dt.datetime
) -> list[FaultSeen]:
    """Fault events (a class, not INFO, not a hook's or an admin's record) of these nodes."""
    out: list[FaultSeen] = []
    names = sorted(set(nodes))
    if not names:
        return out
    fault_at = EventRow.evidence["fault_at"].as_string()
    query = select(EventRow.node, EventRow.at, EventRow.fault_class, fault_at).where(
        _one_of(store, EventRow.node, names),
        EventRow.at >= since - FAULT_LOOKBACK,
        EventRow.at <= until,
        EventRow.fault_class != "",
        EventRow.severity != "INFO",
        EventRow.kind.not_in(HOOK_KINDS),
    )
    with store.engine.connect() as conn:
        for node, at, fault_class, happened in conn.execute(query):
            out.append(FaultSeen(node, _utc(at), fault_class, _parse_time(happened)))
    return out


def _parse_time(text: object) -> dt.datetime | None:
    """An evidence time (ISO 8601 with its zone); None when absent or not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo else None


def episodes_and_steps(
    store: Store, since: dt.datetime, until: dt.datetime
) -> tuple[list[EpisodeRow], list[StepRow]]:
    """Episodes that overlap the window (one waiting for a human still does: its closed_at
    is when it began to wait), and their steps."""
    e = ep.episodes
    query = select(
        e.c.id,
        e.c.node,
        e.c.state,
        e.c.fault_class,
        e.c.opened_at,
        e.c.closed_at,
        e.c.failed_requalifications,
        e.c.rung,
        e.c.ticket_id,
        e.c.target,
    ).where(
        e.c.opened_at <= until,
        or_(e.c.closed_at.is_(None), e.c.closed_at >= since, e.c.state == ep.NEEDS_HUMAN),
    )
    s = ep.steps
    with store.engine.connect() as conn:
        episodes = [
            EpisodeRow(
                id=int(i),
                node=node,
                state=state,
                fault_class=fault_class,
                opened_at=_utc(opened),
                closed_at=_utc(closed) if closed else None,
                failed_requalifications=int(failed),
                rung=int(rung),
                ticket_id=None if ticket is None else int(ticket),
                target=target or "",
            )
            for i, node, state, fault_class, opened, closed, failed, rung, ticket, target in (
                conn.execute(query)
            )
        ]
        opened_ids = [str(x.id) for x in episodes if since <= x.opened_at <= until]
        steps = []
        for chunk in _chunks(opened_ids):
            # A step's output only where it says what the report needs (a reboot's new boot).
            seen = s.c.output.contains(REBOOT_SEEN)
            step_query = (
                select(
                    s.c.episode_id,
                    s.c.rung,
                    s.c.action,
                    s.c.state,
                    s.c.started_at,
                    s.c.ended_at,
                    seen,
                )
                .where(s.c.episode_id.in_([int(i) for i in chunk]))
                .order_by(s.c.id)
            )
            for episode_id, rung, action, state, started, ended, was_seen in conn.execute(
                step_query
            ):
                steps.append(
                    StepRow(
                        int(episode_id),
                        int(rung),
                        action,
                        state,
                        _utc(started),
                        _utc(ended) if ended else None,
                        REBOOT_SEEN if was_seen else "",
                    )
                )
    return episodes, steps


def tickets(store: Store, since: dt.datetime, until: dt.datetime) -> list[TicketRow]:
    t = RmaTicketRow
    query = select(t.id, t.node, t.created_at, t.closed_at).where(
        t.created_at <= until, or_(t.closed_at.is_(None), t.closed_at >= since)
    )
    with store.engine.connect() as conn:
        return [
            TicketRow(int(i), node, _utc(created), _utc(closed) if closed else None)
            for i, node, created, closed in conn.execute(query)
        ]


def fleet_nodes(store: Store) -> int:
    """Nodes the store knows (each daemon writes its node's conditions)."""
    with store.engine.connect() as conn:
        count = conn.execute(select(func.count(func.distinct(ConditionRow.node)))).scalar()
    return int(count or 0)


def interrupted_job_ids(actions: Sequence[JobAction]) -> list[str]:
    return sorted({a.job_id for a in actions if a.action in INTERRUPTING})

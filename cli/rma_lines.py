"""`medic rma list`'s rows: `ticket_lines()`, the tickets' columns without their evidence
(which can be large) and each ticket's newest audit row, in one query whatever the
history's size (bench/cli_rma.py times it on a 10,000-node fleet), and the cells and
summary line they print as (`medic node show` lists a node's tickets with them too)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cli.common import age, clip, iso, when
from medic_core.store_reader import Reader, placeholders, reader_of
from remediation.ticket_states import TicketState

if TYPE_CHECKING:
    from medic_core.store import Store

STATE_WORDS = tuple(s.value for s in TicketState)
LIST_HEADERS = (
    "TICKET", "NODE", "STATE", "FAULT", "GPUS", "VENDOR REF", "OPENED", "UPDATED", "BY",
    "SUMMARY",
)  # fmt: skip


@dataclass(frozen=True)
class TicketLine:
    """One row of `medic rma list`: a ticket without its evidence, and its last change."""

    id: int
    node: str
    state: str
    fault_class: str
    summary: str
    gpus: tuple[int, ...]
    resolution: str
    requalify: bool
    external_id: str
    external_url: str
    created_at: dt.datetime
    updated_at: dt.datetime
    closed_at: dt.datetime | None
    last_actor: str
    last_note: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "node": self.node,
            "state": self.state,
            "fault_class": self.fault_class,
            "summary": self.summary,
            "gpus": list(self.gpus),
            "resolution": self.resolution,
            "requalify": self.requalify,
            "vendor_ref": self.external_id,
            "vendor_url": self.external_url,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "closed_at": iso(self.closed_at),
            "last_actor": self.last_actor,
            "last_note": self.last_note,
        }


def ticket_lines(
    source: Store | Reader, states: Sequence[str] | None = None, node: str | None = None
) -> list[TicketLine]:
    """Tickets by id, in `states` (all when None), of `node` (all when None)."""
    if not isinstance(source, Reader):
        with reader_of(source) as reader:
            return ticket_lines(reader, states, node)
    where: list[str] = []
    params: list[Any] = []
    newest_where = ""
    if states is not None:
        where.append(f"t.state IN ({placeholders(states)})")
        newest_where = (
            f" WHERE ticket_id IN (SELECT id FROM rma_tickets WHERE state IN"
            f" ({placeholders(states)}))"
        )
        params += states  # the subquery's, first in the text
    if node is not None:
        where.append("t.node = ?")
    query = (
        "SELECT t.id, t.node, t.state, t.fault_class, t.summary, t.gpus, t.resolution,"
        " t.requalify, t.external_id, t.external_url, t.created_at, t.updated_at,"
        " t.closed_at, a.actor, a.note"
        " FROM rma_tickets AS t"
        " LEFT OUTER JOIN (SELECT ticket_id, max(id) AS id FROM rma_audit"
        f"{newest_where} GROUP BY ticket_id) AS newest ON newest.ticket_id = t.id"
        " LEFT OUTER JOIN rma_audit AS a ON a.id = newest.id"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " ORDER BY t.id"
    )
    if states is not None:
        params += states
    if node is not None:
        params.append(node)
    reader = source
    return [_line(reader, r) for r in reader.rows(query, params)]


def _line(reader: Reader, r: Any) -> TicketLine:
    # Unpacked by position: a Row's attribute access is most of the cost on 3,000 tickets.
    (
        id_,
        node,
        state,
        fault_class,
        summary,
        gpus,
        resolution,
        requalify,
        external_id,
        external_url,
        created_at,
        updated_at,
        closed_at,
        last_actor,
        last_note,
    ) = r
    when = reader.when
    created, updated = when(created_at), when(updated_at)
    assert created is not None and updated is not None
    return TicketLine(
        int(id_), node, state, fault_class, summary,
        tuple(int(g.get("index", -1)) for g in reader.data(gpus) or ()), resolution,
        bool(requalify), external_id, external_url, created, updated, when(closed_at),
        last_actor or "", last_note or "",
    )  # fmt: skip


def state_cell(state: str, resolution: str, requalify: bool) -> str:
    """`closed (replaced)`, `closed (cancelled), requalify` for a closed ticket."""
    if state != TicketState.CLOSED.value:
        return state
    word = f"{state} ({resolution})" if resolution else state
    return f"{word}, requalify" if requalify else word


def gpus_cell(gpus: Sequence[int]) -> str:
    return ",".join(str(g) for g in gpus) if gpus else "-"


def list_rows(lines: Iterable[TicketLine], now: dt.datetime) -> list[list[str]]:
    return [
        [
            str(t.id), t.node, state_cell(t.state, t.resolution, t.requalify), t.fault_class,
            gpus_cell(t.gpus), t.external_id or "-", when(t.created_at),
            f"{age(t.updated_at, now)} ago", t.last_actor or "-", clip(t.summary, 60),
        ]
        for t in lines
    ]  # fmt: skip


def list_summary(lines: Sequence[TicketLine]) -> str:
    """`3 tickets: 1 open, 1 submitted, 1 closed (1 waiting for re-qualification)`."""
    counts = {w: 0 for w in STATE_WORDS}
    for t in lines:
        counts[t.state] = counts.get(t.state, 0) + 1
    parts = [f"{n} {w}" for w, n in counts.items() if n]
    waiting = sum(1 for t in lines if t.requalify)
    tail = f" ({waiting} waiting for re-qualification)" if waiting else ""
    noun = "ticket" if len(lines) == 1 else "tickets"
    return f"{len(lines)} {noun}: {', '.join(parts)}{tail}"

"""A ticket's life in the store: open one (one per node and fault class), move it along
NEXT_STATES (closing marks its node for re-qualification), attach the node's evidence
bundle, clear re-qualification once the node passed, each change with its audit and outbox
rows in one transaction (remediation.tickets.outbox); and the reads of tickets and their
audit trail."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from medic_core.store import Store
from medic_core.store.engine import writer
from medic_core.store.models import (
    NAME_LEN,
    NODE_LEN,
    RmaAuditRow,
    RmaTicketRow,
    check_evidence,
    check_text,
    utc,
)
from remediation.ticket_states import NEXT_STATES, TicketState
from remediation.tickets.outbox import (
    EVENT_EVIDENCE,
    EVENT_OPENED,
    EVENT_REQUALIFIED,
    EVENT_TRANSITION,
    record_change,
)
from remediation.tickets.values import CANCELLED, REPLACED, AuditEntry, Gpu, Ticket, TicketError

EXTERNAL_ID_LEN = 255


def _state(value: TicketState | str) -> TicketState:
    try:
        return TicketState(value)
    except ValueError:
        known = ", ".join(s.value for s in TicketState)
        raise TicketError(f"unknown ticket state {value!r}; use one of {known}") from None


def _name(value: str, what: str, max_len: int) -> str:
    check_text(value, what, max_len)
    if not value.strip():
        raise ValueError(f"{what} must not be empty")
    return value


def _gpu(value: Gpu | Mapping[str, Any]) -> Gpu:
    if isinstance(value, Gpu):
        gpu = value
    elif isinstance(value, Mapping):
        unknown = set(value) - {"index", "uuid", "serial", "pci_bus_id"}
        if unknown:
            raise ValueError(
                f"GPU {dict(value)!r}: unknown keys {sorted(unknown)}; "
                "use index, uuid, serial, pci_bus_id"
            )
        gpu = Gpu(
            index=value.get("index", -1),  # checked below
            uuid=value.get("uuid", ""),
            serial=value.get("serial", ""),
            pci_bus_id=value.get("pci_bus_id", ""),
        )
    else:
        raise ValueError(f"a GPU must be a Gpu or a mapping, got {type(value).__name__}")
    if isinstance(gpu.index, bool) or not isinstance(gpu.index, int) or gpu.index < 0:
        raise ValueError(f"GPU index must be a whole number >= 0, got {gpu.index!r}")
    for what in ("uuid", "serial", "pci_bus_id"):
        check_text(getattr(gpu, what), f"GPU {gpu.index} {what}", 255)
    return gpu


def _now(at: dt.datetime | None) -> dt.datetime:
    return utc(at, "time") if at is not None else dt.datetime.now(dt.UTC)


def _ticket(row: RmaTicketRow) -> Ticket:
    return Ticket(
        id=row.id,
        node=row.node,
        state=TicketState(row.state),
        fault_class=row.fault_class,
        summary=row.summary,
        gpus=tuple(_gpu(g) for g in row.gpus or ()),
        evidence=dict(row.evidence or {}),
        resolution=row.resolution,
        requalify=bool(row.requalify),
        external_id=row.external_id,
        external_url=row.external_url,
        created_at=row.created_at,
        updated_at=row.updated_at,
        closed_at=row.closed_at,
    )


def _entry(row: RmaAuditRow) -> AuditEntry:
    return AuditEntry(
        id=row.id,
        ticket_id=row.ticket_id,
        at=row.at,
        actor=row.actor,
        from_state=TicketState(row.from_state) if row.from_state is not None else None,
        to_state=TicketState(row.to_state),
        note=row.note,
    )


def _insert_if_none_open(dialect: str, values: dict[str, Any]) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING against the partial unique index of tickets that are
    not closed: two daemons opening the same ticket at once make one."""
    index = [RmaTicketRow.node, RmaTicketRow.fault_class]
    where = RmaTicketRow.state != TicketState.CLOSED.value
    if dialect == "postgresql":
        pg = postgresql.insert(RmaTicketRow).values(values)
        return pg.on_conflict_do_nothing(index_elements=index, index_where=where).returning(
            RmaTicketRow.id
        )
    lite = sqlite.insert(RmaTicketRow).values(values)
    return lite.on_conflict_do_nothing(index_elements=index, index_where=where).returning(
        RmaTicketRow.id
    )


def _open_row(session: Session, node: str, fault_class: str) -> RmaTicketRow | None:
    query = select(RmaTicketRow).where(
        RmaTicketRow.node == node,
        RmaTicketRow.fault_class == fault_class,
        RmaTicketRow.state != TicketState.CLOSED.value,
    )
    return session.scalars(query).one_or_none()


def open_ticket(
    store: Store,
    node: str,
    fault_class: str,
    summary: str,
    gpus: Iterable[Gpu | Mapping[str, Any]],
    evidence: Mapping[str, Any],
    actor: str,
    *,
    at: dt.datetime | None = None,
) -> Ticket:
    """Open a ticket in state `open`, or return the one already open for this node and fault
    class (unchanged: its evidence is what the vendor has already seen)."""
    _name(node, "node", NODE_LEN)
    _name(fault_class, "fault class", NAME_LEN)
    check_text(summary, "summary")
    _name(actor, "actor", NODE_LEN)
    checked_gpus = [_gpu(g).as_dict() for g in gpus]
    checked_evidence = check_evidence(evidence)
    now = _now(at)
    values = {
        "node": node,
        "state": TicketState.OPEN.value,
        "fault_class": fault_class,
        "summary": summary,
        "gpus": checked_gpus,
        "evidence": checked_evidence,
        "resolution": "",
        "requalify": False,
        "external_id": "",
        "external_url": "",
        "created_at": now,
        "updated_at": now,
        "closed_at": None,
    }
    with Session(writer(store.engine)) as session, session.begin():
        existing = _open_row(session, node, fault_class)
        if existing is not None:
            return _ticket(existing)
        dialect = session.get_bind().dialect.name
        inserted = session.execute(_insert_if_none_open(dialect, values)).first()
        if inserted is None:  # another writer opened it between our read and our insert
            row = _open_row(session, node, fault_class)
            assert row is not None
            return _ticket(row)
        row = session.get_one(RmaTicketRow, int(inserted[0]))
        record_change(
            session,
            _ticket(row),
            event=EVENT_OPENED,
            at=now,
            actor=actor,
            from_state=None,
            note=summary,
        )
        return _ticket(row)


def transition(
    store: Store,
    ticket_id: int,
    to_state: TicketState | str,
    actor: str,
    note: str = "",
    external_id: str | None = None,
    *,
    external_url: str | None = None,
    at: dt.datetime | None = None,
) -> Ticket:
    """Move a ticket to `to_state`, enforcing NEXT_STATES; raises TicketError for an
    unknown ticket or an illegal move. Closing from any state but `replaced` cancels the
    ticket and needs a note saying why. Closing (either way) marks the node as needing
    re-qualification. `external_id`/`external_url` record the ticketing system's reference."""
    target = _state(to_state)
    _name(actor, "actor", NODE_LEN)
    check_text(note, "note")
    if external_id is not None:
        check_text(external_id, "external id", EXTERNAL_ID_LEN)
    if external_url is not None:
        check_text(external_url, "external url")
    now = _now(at)
    with Session(writer(store.engine)) as session, session.begin():
        query = select(RmaTicketRow).where(RmaTicketRow.id == ticket_id).with_for_update()
        row = session.scalars(query).one_or_none()
        if row is None:
            raise TicketError(f"RMA ticket {ticket_id} does not exist")
        current = TicketState(row.state)
        legal = NEXT_STATES[current]
        if target not in legal:
            allowed = ", ".join(s.value for s in legal) or "none: it is closed"
            raise TicketError(
                f"RMA ticket {ticket_id} ({row.node}): cannot go from {current.value} to "
                f"{target.value}; legal next states: {allowed}"
            )
        if target is TicketState.CLOSED:
            if current is TicketState.REPLACED:
                row.resolution = REPLACED
            else:
                if not note.strip():
                    raise TicketError(
                        f"RMA ticket {ticket_id} ({row.node}): closing from {current.value} "
                        "cancels it; give a note saying why"
                    )
                row.resolution = CANCELLED
            row.requalify = True
            row.closed_at = now
        row.state = target.value
        row.updated_at = now
        if external_id is not None:
            row.external_id = external_id
        if external_url is not None:
            row.external_url = external_url
        session.flush()
        record_change(
            session,
            _ticket(row),
            event=EVENT_TRANSITION,
            at=now,
            actor=actor,
            from_state=current,
            note=note,
        )
        return _ticket(row)


def attach_bundle(
    store: Store,
    ticket_id: int,
    bundle: Mapping[str, Any],
    actor: str,
    *,
    at: dt.datetime | None = None,
) -> Ticket:
    """Record the node's evidence bundle in the ticket's evidence (`bundle`), with an audit
    row and a `ticket.evidence` event for the webhook, in one transaction. The state does not
    change; a closed ticket takes it too (the bundle was asked for while it was open)."""
    _name(actor, "actor", NODE_LEN)
    now = _now(at)
    with Session(writer(store.engine)) as session, session.begin():
        query = select(RmaTicketRow).where(RmaTicketRow.id == ticket_id).with_for_update()
        row = session.scalars(query).one_or_none()
        if row is None:
            raise TicketError(f"RMA ticket {ticket_id} does not exist")
        row.evidence = check_evidence({**dict(row.evidence or {}), "bundle": dict(bundle)})
        row.updated_at = now
        session.flush()
        state = TicketState(row.state)
        note = f"evidence bundle {bundle.get('path', '')} sha256 {bundle.get('sha256', '')}"
        record_change(
            session,
            _ticket(row),
            event=EVENT_EVIDENCE,
            at=now,
            actor=actor,
            from_state=state,
            note=note[:1000],
        )
        return _ticket(row)


def get(store: Store, ticket_id: int) -> Ticket | None:
    with Session(store.engine) as session:
        row = session.get(RmaTicketRow, ticket_id)
        return _ticket(row) if row is not None else None


def list_tickets(
    store: Store,
    state: TicketState | str | Iterable[TicketState | str] | None = None,
    node: str | None = None,
) -> list[Ticket]:
    """Tickets by id; `state` may be one or several."""
    query = select(RmaTicketRow).order_by(RmaTicketRow.id)
    if state is not None:
        wanted = [state] if isinstance(state, str) else list(state)
        query = query.where(RmaTicketRow.state.in_([_state(s).value for s in wanted]))
    if node is not None:
        query = query.where(RmaTicketRow.node == node)
    with Session(store.engine) as session:
        return [_ticket(row) for row in session.scalars(query)]


def audit(store: Store, ticket_id: int) -> list[AuditEntry]:
    """The ticket's audit trail, oldest first."""
    query = select(RmaAuditRow).where(RmaAuditRow.ticket_id == ticket_id).order_by(RmaAuditRow.id)
    with Session(store.engine) as session:
        return [_entry(row) for row in session.scalars(query)]


def requalified(
    store: Store, node: str, actor: str, note: str = "", *, at: dt.datetime | None = None
) -> list[int]:
    """The node passed re-qualification: clear the flag of its closed tickets, with an
    audit row (closed -> closed) each. Returns the ids of the tickets cleared."""
    _name(actor, "actor", NODE_LEN)
    now = _now(at)
    text = note or "node re-qualified"
    with Session(writer(store.engine)) as session, session.begin():
        query = (
            select(RmaTicketRow)
            .where(RmaTicketRow.node == node, RmaTicketRow.requalify.is_(True))
            .order_by(RmaTicketRow.id)
            .with_for_update()
        )
        rows = list(session.scalars(query))
        for row in rows:
            row.requalify = False
            row.updated_at = now
            session.flush()
            record_change(
                session,
                _ticket(row),
                event=EVENT_REQUALIFIED,
                at=now,
                actor=actor,
                from_state=TicketState.CLOSED,
                note=text,
            )
        return [row.id for row in rows]

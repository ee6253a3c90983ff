"""RMA tickets: a node's hardware sent back, with its evidence, an audit trail and outbound
notifications (schema version 3; see docs/rma.md).

    open --> submitted --> acknowledged --> replaced --> closed      (resolution "replaced")
      |          |               |                          ^
      +----------+---------------+--------------------------+        (resolution "cancelled",
                                                                       a note is required)

Every change writes, in one transaction: the ticket, one audit row (who, when, from, to,
note) and one outbox row (the webhook payload, delivered later by
`remediation.webhook.deliver_pending`), so a crash between the change and the POST loses
nothing. Closing a ticket, either way, marks its node as needing re-qualification: the
ladder and the HealthCheckProgram must not resume the node until `requalified()` clears it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from medic_core.store import Store
from medic_core.store.engine import writer
from medic_core.store.models import (
    NAME_LEN,
    NODE_LEN,
    RmaAuditRow,
    RmaOutboxRow,
    RmaTicketRow,
    check_evidence,
    check_text,
    utc,
)
from medic_core.vocabulary import Component, ComponentKind
from remediation.episodes import Episode, read_open_episode
from remediation.policy import part_name
from remediation.ticket_states import NEXT_STATES, TicketState

EXTERNAL_ID_LEN = 255


REPLACED = "replaced"
CANCELLED = "cancelled"

EVENT_OPENED = "ticket.opened"
EVENT_TRANSITION = "ticket.transition"
EVENT_REQUALIFIED = "ticket.requalified"
EVENT_EVIDENCE = "ticket.evidence"  # the node's evidence bundle was written (its path, sha256)

OUTBOX_PENDING = "pending"
OUTBOX_DELIVERED = "delivered"
OUTBOX_FAILED = "failed"  # refused by the receiver (4xx); see retry_failed()


class TicketError(ValueError):
    """An illegal request about a ticket; the message is one line and says what is allowed."""


@dataclass(frozen=True)
class Gpu:
    """One GPU named in a ticket: what a vendor needs to find the part."""

    index: int
    uuid: str = ""
    serial: str = ""
    pci_bus_id: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "serial": self.serial,
            "pci_bus_id": self.pci_bus_id,
        }


def ticket_component(component: Component, gpus: Sequence[Mapping[str, Any]]) -> Component:
    """The part a ticket is for: the fault's component, a GPU's identity completed from the
    GPU the ticket names (an XID finding knows the index only; NVML knows the serial)."""
    if component.kind is not ComponentKind.GPU:
        return component
    gpu = next((g for g in gpus if str(g.get("index")) == component.name), None)
    if gpu is None:
        return component

    def text(key: str) -> str:
        value = gpu.get(key)
        return value if isinstance(value, str) else ""

    return Component(
        component.kind,
        component.name,
        uuid=component.uuid or text("uuid"),
        serial=component.serial or text("serial"),
        guid=component.guid,
        slot=component.slot or text("pci_bus_id"),
    )


def component_json(component: Component) -> dict[str, str]:
    """The component as a ticket's evidence and the webhook payload carry it: `id`
    (`gpu:3`, `hca:mlx5_0/1`, `host`), each identity known, and `describe` for people."""
    known = {
        "uuid": component.uuid,
        "serial": component.serial,
        "guid": component.guid,
        "slot": component.slot,
    }
    return {
        "id": str(component),
        "kind": component.kind.value,
        "name": component.name,
        **{k: v for k, v in known.items() if v},
        "describe": component.describe(),
    }


def rma_summary(node: str, fault_class: str, component: Component, reason: str) -> str:
    """The vendor-facing one line: which part, where, what fault, and why it goes back:
    `GPU 3 (serial 1650...) on n2: gpu.ecc.dbe; lemon: 3 gpu-memory episodes on GPU 3
    (serial 1650...) in 7 days`."""
    return f"{part_name(component)} on {node}: {fault_class}; {reason}"


@dataclass(frozen=True)
class Ticket:
    id: int
    node: str
    state: TicketState
    fault_class: str
    summary: str
    gpus: tuple[Gpu, ...]
    evidence: dict[str, Any]
    resolution: str  # "" until closed; then "replaced" or "cancelled"
    requalify: bool  # closed, and the node has not re-qualified since
    external_id: str  # the ticketing system's id, once known
    external_url: str
    created_at: dt.datetime
    updated_at: dt.datetime
    closed_at: dt.datetime | None

    @property
    def is_open(self) -> bool:
        return self.state is not TicketState.CLOSED

    @property
    def component(self) -> dict[str, Any]:
        """The part the ticket is for (component_json), {} when the opener named none (an
        operator's `medic rma open`, a ticket from before components were recorded)."""
        found = self.evidence.get("component")
        return dict(found) if isinstance(found, Mapping) else {}

    @property
    def reason(self) -> str:
        """Why the part goes back (the lemon rule, or the rungs tried), "" when not said."""
        found = self.evidence.get("reason")
        return found if isinstance(found, str) else ""

    @property
    def bundle(self) -> dict[str, Any]:
        """The node's evidence bundle (remediation.evidence: path, sha256, bytes, parts), {}
        until the node has written it."""
        found = self.evidence.get("bundle")
        return dict(found) if isinstance(found, Mapping) else {}

    def as_dict(self) -> dict[str, Any]:
        """The ticket as JSON (without its evidence, which payloads carry separately)."""
        return {
            "id": self.id,
            "node": self.node,
            "state": self.state.value,
            "fault_class": self.fault_class,
            "summary": self.summary,
            "component": self.component,
            "reason": self.reason,
            "bundle": self.bundle,
            "gpus": [g.as_dict() for g in self.gpus],
            "resolution": self.resolution,
            "external_id": self.external_id,
            "external_url": self.external_url,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
        }


@dataclass(frozen=True)
class AuditEntry:
    id: int
    ticket_id: int
    at: dt.datetime
    actor: str
    from_state: TicketState | None  # None: the ticket was created
    to_state: TicketState
    note: str


def evidence_bundle(
    *,
    conditions: Sequence[Mapping[str, Any]] = (),
    xids: Sequence[Mapping[str, Any]] = (),
    nvml: Mapping[str, Any] | None = None,
    checks: Sequence[Mapping[str, Any]] = (),
    history: Sequence[Mapping[str, Any]] = (),
    actions: Sequence[Mapping[str, Any]] = (),
    **extra: Any,
) -> dict[str, Any]:
    """The evidence a vendor asks for, under fixed keys: the node's conditions, XIDs (with
    the kernel-log lines that reported them), NVML fields per GPU, check outputs, the fault
    history (events) and the repair actions tried (the ladder's steps)."""
    bundle: dict[str, Any] = {
        "conditions": [dict(c) for c in conditions],
        "xids": [dict(x) for x in xids],
        "nvml": dict(nvml or {}),
        "checks": [dict(c) for c in checks],
        "history": [dict(h) for h in history],
        "actions": [dict(a) for a in actions],
    }
    bundle.update(extra)
    return bundle


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


def _record(
    session: Session,
    ticket: RmaTicketRow,
    *,
    event: str,
    at: dt.datetime,
    actor: str,
    from_state: TicketState | None,
    note: str,
) -> None:
    """The audit row and the outbox row of one change, in the caller's transaction."""
    session.add(
        RmaAuditRow(
            ticket_id=ticket.id,
            at=at,
            actor=actor,
            from_state=from_state.value if from_state is not None else None,
            to_state=ticket.state,
            note=note,
        )
    )
    delivery_id = str(uuid.uuid4())
    snapshot = _ticket(ticket)
    payload = {
        "event": event,
        "delivery_id": delivery_id,
        "ticket": snapshot.as_dict(),
        "transition": {
            "from": from_state.value if from_state is not None else None,
            "to": ticket.state,
            "actor": actor,
            "note": note,
            "at": at.isoformat(),
        },
        "evidence": snapshot.evidence,
    }
    session.add(
        RmaOutboxRow(
            ticket_id=ticket.id,
            delivery_id=delivery_id,
            event=event,
            payload=payload,
            state=OUTBOX_PENDING,
            attempts=0,
            last_status=None,
            last_error="",
            created_at=at,
            next_attempt_at=at,
            last_attempt_at=None,
            delivered_at=None,
        )
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
        _record(
            session, row, event=EVENT_OPENED, at=now, actor=actor, from_state=None, note=summary
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
        _record(
            session,
            row,
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
        _record(session, row, event=EVENT_EVIDENCE, at=now, actor=actor, from_state=state,
                note=note[:1000])  # fmt: skip
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


# Built once: the ladder asks at every tick and the launch gate after job starts. Ids only,
# from the (state, node) index.
_OPEN_IDS = (
    select(RmaTicketRow.id)
    .where(RmaTicketRow.node == bindparam("node"), RmaTicketRow.state != TicketState.CLOSED.value)
    .order_by(RmaTicketRow.id)
)
_REQUALIFY = (
    select(RmaTicketRow.id)
    .where(RmaTicketRow.node == bindparam("node"), RmaTicketRow.requalify.is_(True))
    .limit(1)
)


def open_tickets(store: Store, node: str) -> list[int]:
    """Ids of `node`'s tickets not closed, by id: while there is one, the node stays out."""
    with store.engine.connect() as conn:
        return list(conn.scalars(_OPEN_IDS, {"node": node}))


def needs_requalification(store: Store, node: str) -> bool:
    """True while a closed ticket of `node` waits for the node to pass re-qualification:
    the ladder and the HealthCheckProgram must not resume the node before."""
    with store.engine.connect() as conn:
        return conn.scalars(_REQUALIFY, {"node": node}).first() is not None


@dataclass(frozen=True)
class NodeRails:
    """What keeps a node out of service or holds its repair, as one read sees it."""

    episode: Episode | None  # its open remediation episode
    open_tickets: list[int]  # ids of its RMA tickets not closed: it stays out
    requalify: bool  # a closed ticket waits for it to pass re-qualification


def read_rails(store: Store, node: str) -> NodeRails:
    """`node`'s open episode, open tickets and re-qualification flag in one transaction (one
    consistent snapshot, one connection): what the ladder reads at each tick and the launch
    gate after job starts."""
    with store.engine.connect() as conn:
        episode = read_open_episode(conn, node)
        ids = list(conn.scalars(_OPEN_IDS, {"node": node}))
        requalify = conn.scalars(_REQUALIFY, {"node": node}).first() is not None
    return NodeRails(episode, ids, requalify)


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
            _record(
                session,
                row,
                event=EVENT_REQUALIFIED,
                at=now,
                actor=actor,
                from_state=TicketState.CLOSED,
                note=text,
            )
        return [row.id for row in rows]


def retry_failed(store: Store, ticket_id: int | None = None) -> int:
    """Put deliveries the receiver refused (4xx) back in the queue, after fixing the cause
    (the secret, the receiver). Returns how many."""
    query = update(RmaOutboxRow).where(RmaOutboxRow.state == OUTBOX_FAILED)
    if ticket_id is not None:
        query = query.where(RmaOutboxRow.ticket_id == ticket_id)
    with writer(store.engine).begin() as conn:
        result = conn.execute(
            query.values(state=OUTBOX_PENDING, next_attempt_at=dt.datetime.now(dt.UTC))
        )
        return result.rowcount


__all__ = [
    "CANCELLED",
    "NEXT_STATES",
    "REPLACED",
    "AuditEntry",
    "Gpu",
    "NodeRails",
    "Ticket",
    "TicketError",
    "TicketState",
    "attach_bundle",
    "audit",
    "component_json",
    "evidence_bundle",
    "get",
    "list_tickets",
    "needs_requalification",
    "open_ticket",
    "open_tickets",
    "read_rails",
    "requalified",
    "rma_summary",
    "ticket_component",
    "transition",
]

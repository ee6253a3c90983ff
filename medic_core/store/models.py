"""The store's vocabulary: the typed values its API takes and returns, and the ORM mapping of
the current schema.

The dataclasses are what callers see; the `*Row` classes never leave a session. The mapping
describes the schema as the newest migration leaves it (`migrations.py` builds it with its own
frozen table definitions; a test checks that the two agree).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from medic_core.status import Severity as Severity
from medic_core.status import Status as Status

# Deterministic constraint and index names, so later migrations can name what they alter.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Sizes: generous for names, bounded so PostgreSQL and SQLite agree on what is accepted.
NODE_LEN = 255
NAME_LEN = 128  # condition type, event kind, fault class, source
TARGET_LEN = 255
STATUS_LEN = 16


def utc(value: datetime, what: str = "time") -> datetime:
    """`value` as an aware UTC datetime; a naive datetime is refused (its zone is a guess)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} {value.isoformat()} has no time zone; pass an aware datetime")
    return value.astimezone(UTC)


def check_evidence(evidence: Mapping[str, Any] | None, what: str = "evidence") -> dict[str, Any]:
    """A JSON object both databases accept, as a plain dict; raises ValueError otherwise."""
    if evidence is None:
        return {}
    if not isinstance(evidence, Mapping):
        raise ValueError(f"{what} must be a mapping, got {type(evidence).__name__}")
    try:
        text = json.dumps(dict(evidence), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from exc
    if "\\u0000" in text:
        raise ValueError(f"{what} contains a NUL character, which PostgreSQL cannot store")
    decoded: dict[str, Any] = json.loads(text)
    return decoded


def check_text(value: str, what: str, max_len: int | None = None) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL character, which PostgreSQL cannot store")
    if max_len is not None and len(value) > max_len:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {max_len}")
    return value


@dataclass(frozen=True)
class ConditionUpdate:
    """One observation of a condition, as a check reports it."""

    type: str  # check/fault family: "gpu.xid", "ib.port"
    status: Status | str  # any str enum with the same values will do
    target: str = ""  # GPU index, port, mount point; "" for node-wide conditions
    reason: str = ""  # fault class: "gpu.xid.79"; "" when OK
    message: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Condition:
    node: str
    type: str
    target: str
    status: Status
    reason: str
    message: str
    evidence: dict[str, Any]
    since: datetime  # when status or reason last changed
    updated_at: datetime  # when last observed


@dataclass(frozen=True)
class ConditionChange:
    """A transition of a condition's status or reason. `previous_status` is None when the
    condition was observed for the first time."""

    node: str
    type: str
    target: str
    previous_status: Status | None
    previous_reason: str | None
    previous_since: datetime | None
    status: Status
    reason: str
    message: str
    at: datetime


@dataclass(frozen=True)
class Event:
    id: int
    node: str
    at: datetime
    kind: str  # "gpu.xid", "kmsg", "check.crash"
    fault_class: str  # "gpu.xid.79", or ""
    target: str
    severity: Severity
    message: str
    evidence: dict[str, Any]
    source: str  # "nvml-event", "kmsg", "check:<name>"


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on every backend.

    PostgreSQL stores `timestamptz`. SQLite has no time type: SQLAlchemy stores naive ISO text,
    which sorts correctly only if every value is in the same zone, so values are converted to
    UTC and stripped of their zone on the way in, and given UTC back on the way out.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = utc(value)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def json_type() -> JSON:
    """JSON on SQLite (text), JSONB on PostgreSQL."""
    return JSON().with_variant(JSONB(), "postgresql")


def id_type() -> BigInteger:
    """BIGINT identity on PostgreSQL; INTEGER on SQLite, where only INTEGER PRIMARY KEY is the
    auto-assigned rowid."""
    return BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ConditionRow(Base):
    __tablename__ = "conditions"
    __table_args__ = (
        UniqueConstraint("node", "type", "target"),
        # `medic nodes --status CRITICAL` across a fleet; (node, ...) is served by the unique.
        Index(None, "status", "node"),
        # Each node's newest report (`medic nodes`: is its daemon silent?), from the index.
        Index(None, "node", "updated_at"),
    )

    id: Mapped[int] = mapped_column(id_type(), primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(NODE_LEN))
    type: Mapped[str] = mapped_column(String(NAME_LEN))
    target: Mapped[str] = mapped_column(String(TARGET_LEN))
    status: Mapped[str] = mapped_column(String(STATUS_LEN))
    reason: Mapped[str] = mapped_column(String(NAME_LEN))
    message: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(json_type())
    since: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())

    def to_condition(self) -> Condition:
        return Condition(
            node=self.node,
            type=self.type,
            target=self.target,
            status=Status(self.status),
            reason=self.reason,
            message=self.message,
            evidence=dict(self.evidence),
            since=self.since,
            updated_at=self.updated_at,
        )


class EventRow(Base):
    __tablename__ = "events"
    __table_args__ = (
        Index(None, "node", "at"),
        Index(None, "kind", "at"),
        Index(None, "at"),  # time-window queries across nodes, and prune
        {"sqlite_autoincrement": True},  # ids never reused, even after a prune
    )

    id: Mapped[int] = mapped_column(id_type(), primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(NODE_LEN))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    kind: Mapped[str] = mapped_column(String(NAME_LEN))
    fault_class: Mapped[str] = mapped_column(String(NAME_LEN))
    target: Mapped[str] = mapped_column(String(TARGET_LEN))
    severity: Mapped[str] = mapped_column(String(STATUS_LEN))
    message: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(json_type())
    source: Mapped[str] = mapped_column(String(NAME_LEN))

    def to_event(self) -> Event:
        return Event(
            id=self.id,
            node=self.node,
            at=self.at,
            kind=self.kind,
            fault_class=self.fault_class,
            target=self.target,
            severity=Severity(self.severity),
            message=self.message,
            evidence=dict(self.evidence),
            source=self.source,
        )


# -- RMA tickets (schema version 3; the API is remediation.tickets) -------------------------

RMA_STATE_LEN = 16
_NOT_CLOSED = text("state <> 'closed'")


class RmaTicketRow(Base):
    __tablename__ = "rma_tickets"
    __table_args__ = (
        # At most one ticket that is not closed per node and fault class.
        Index(
            "ux_rma_tickets_open_node_fault_class",
            "node",
            "fault_class",
            unique=True,
            sqlite_where=_NOT_CLOSED,
            postgresql_where=_NOT_CLOSED,
        ),
        Index(None, "state", "node"),
        Index(None, "node", "requalify"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(id_type(), primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(NODE_LEN))
    state: Mapped[str] = mapped_column(String(RMA_STATE_LEN))
    fault_class: Mapped[str] = mapped_column(String(NAME_LEN))
    summary: Mapped[str] = mapped_column(Text)
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(json_type())
    evidence: Mapped[dict[str, Any]] = mapped_column(json_type())
    resolution: Mapped[str] = mapped_column(String(RMA_STATE_LEN))  # "", replaced, cancelled
    requalify: Mapped[bool] = mapped_column(Boolean)  # closed; the node must re-qualify
    external_id: Mapped[str] = mapped_column(String(255))
    external_url: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class RmaAuditRow(Base):
    __tablename__ = "rma_audit"
    __table_args__ = (Index(None, "ticket_id", "id"),)

    id: Mapped[int] = mapped_column(id_type(), primary_key=True, autoincrement=True)
    ticket_id: Mapped[int] = mapped_column(
        id_type(), ForeignKey("rma_tickets.id", ondelete="CASCADE")
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    actor: Mapped[str] = mapped_column(String(NODE_LEN))
    from_state: Mapped[str | None] = mapped_column(String(RMA_STATE_LEN))  # None: created
    to_state: Mapped[str] = mapped_column(String(RMA_STATE_LEN))
    note: Mapped[str] = mapped_column(Text)


class RmaOutboxRow(Base):
    """One webhook notification, written in the transaction that made the change, so a
    crash before the POST does not lose it."""

    __tablename__ = "rma_outbox"
    __table_args__ = (
        UniqueConstraint("delivery_id"),
        Index(None, "state", "id"),
        Index(None, "ticket_id", "id"),
    )

    id: Mapped[int] = mapped_column(id_type(), primary_key=True, autoincrement=True)
    ticket_id: Mapped[int] = mapped_column(
        id_type(), ForeignKey("rma_tickets.id", ondelete="CASCADE")
    )
    delivery_id: Mapped[str] = mapped_column(String(36))  # uuid4; X-Medic-Delivery
    event: Mapped[str] = mapped_column(String(32))  # ticket.opened, ticket.transition
    payload: Mapped[dict[str, Any]] = mapped_column(json_type())
    state: Mapped[str] = mapped_column(String(RMA_STATE_LEN))  # pending, delivered, failed
    attempts: Mapped[int] = mapped_column(Integer)
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())  # also the claim lease
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


# -- drain records (schema version 7; the API is Store.record_drain and its siblings) -------

_STILL_OPEN = text("closed_at IS NULL")


@dataclass(frozen=True)
class DrainRecord:
    """One drain Medic made: written before Slurm was asked, closed by the resume that
    gave the node back (or by the next drain of the node, which replaces it)."""

    id: int
    node: str
    reason: str  # as Slurm stores it (drain_reason.as_slurm_stores)
    actor: str  # daemon, ladder, hook, isolator, burn-in, cli:<login>(uid N)
    episode_id: int | None
    drained_at: datetime
    held: str = ""  # why only a human may give it back (a needs-human episode closed)
    closed_at: datetime | None = None
    closed_by: str = ""
    note: str = ""

    @property
    def open(self) -> bool:
        return self.closed_at is None


class DrainRecordRow(Base):
    __tablename__ = "drain_records"
    __table_args__ = (
        # At most one open record per node: a new drain replaces the previous one.
        Index(
            "ux_drain_records_open_node",
            "node",
            unique=True,
            sqlite_where=_STILL_OPEN,
            postgresql_where=_STILL_OPEN,
        ),
        Index(None, "node", "drained_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(id_type(), primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(NODE_LEN))
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(NODE_LEN))
    episode_id: Mapped[int | None] = mapped_column(BigInteger)
    drained_at: Mapped[datetime] = mapped_column(UTCDateTime())
    held: Mapped[str] = mapped_column(Text)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    closed_by: Mapped[str] = mapped_column(String(NODE_LEN))
    note: Mapped[str] = mapped_column(Text)

    def to_record(self) -> DrainRecord:
        return DrainRecord(
            id=self.id,
            node=self.node,
            reason=self.reason,
            actor=self.actor,
            episode_id=self.episode_id,
            drained_at=self.drained_at,
            held=self.held,
            closed_at=self.closed_at,
            closed_by=self.closed_by,
            note=self.note,
        )


# -- node inventory (schema version 8; the API is Store.record_inventory and inventories) ---


@dataclass(frozen=True)
class StoredInventory:
    """A node's inventory as its daemon last recorded it (medic_core.inventory's JSON)."""

    node: str
    inventory: dict[str, Any]
    changed_at: datetime  # when it last differed from the one before
    seen_at: datetime  # when the daemon last looked


class NodeInventoryRow(Base):
    __tablename__ = "node_inventory"

    node: Mapped[str] = mapped_column(String(NODE_LEN), primary_key=True)
    inventory: Mapped[dict[str, Any]] = mapped_column(json_type())
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime())

    def to_stored(self) -> StoredInventory:
        return StoredInventory(
            node=self.node,
            inventory=dict(self.inventory),
            changed_at=self.changed_at,
            seen_at=self.seen_at,
        )

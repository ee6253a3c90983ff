"""Version 3: RMA tickets, their audit trail, and the outbox of webhook deliveries.

Frozen: this module describes the schema as version 3 created it.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from medic_core.store.models import NAMING_CONVENTION

DESCRIPTION = "RMA tickets, audit trail and webhook outbox"


def upgrade(conn: Connection) -> None:
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    ident = BigInteger().with_variant(Integer(), "sqlite")
    data = JSON().with_variant(JSONB(), "postgresql")
    when = DateTime(timezone=True)
    not_closed = text("state <> 'closed'")
    Table(
        "rma_tickets",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column("node", String(255), nullable=False),
        Column("state", String(16), nullable=False),
        Column("fault_class", String(128), nullable=False),
        Column("summary", Text, nullable=False),
        Column("gpus", data, nullable=False),
        Column("evidence", data, nullable=False),
        Column("resolution", String(16), nullable=False),
        Column("requalify", Boolean, nullable=False),
        Column("external_id", String(255), nullable=False),
        Column("external_url", Text, nullable=False),
        Column("created_at", when, nullable=False),
        Column("updated_at", when, nullable=False),
        Column("closed_at", when, nullable=True),
        # At most one ticket that is not closed per node and fault class.
        Index(
            "ux_rma_tickets_open_node_fault_class",
            "node",
            "fault_class",
            unique=True,
            sqlite_where=not_closed,
            postgresql_where=not_closed,
        ),
        Index(None, "state", "node"),
        Index(None, "node", "requalify"),
        sqlite_autoincrement=True,  # ticket ids are quoted by people: never reused
    )
    Table(
        "rma_audit",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column(
            "ticket_id",
            ident,
            ForeignKey("rma_tickets.id", ondelete="CASCADE"),
            nullable=False,
        ),
        Column("at", when, nullable=False),
        Column("actor", String(255), nullable=False),
        Column("from_state", String(16), nullable=True),
        Column("to_state", String(16), nullable=False),
        Column("note", Text, nullable=False),
        Index(None, "ticket_id", "id"),
    )
    Table(
        "rma_outbox",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column(
            "ticket_id",
            ident,
            ForeignKey("rma_tickets.id", ondelete="CASCADE"),
            nullable=False,
        ),
        Column("delivery_id", String(36), nullable=False, unique=True),
        Column("event", String(32), nullable=False),
        Column("payload", data, nullable=False),
        Column("state", String(16), nullable=False),
        Column("attempts", Integer, nullable=False),
        Column("last_status", Integer, nullable=True),
        Column("last_error", Text, nullable=False),
        Column("created_at", when, nullable=False),
        Column("next_attempt_at", when, nullable=False),
        Column("last_attempt_at", when, nullable=True),
        Column("delivered_at", when, nullable=True),
        Index(None, "state", "id"),
        Index(None, "ticket_id", "id"),
    )
    metadata.create_all(conn)

"""Version 1: conditions (one row per node, type and target) and events (append-only).

Frozen: this module describes the schema as version 1 created it and must never change once
released. Later versions add modules of their own; `models.py` follows the newest.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB

from medic_core.store.models import NAMING_CONVENTION

DESCRIPTION = "conditions and events"


def upgrade(conn: Connection) -> None:
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    ident = BigInteger().with_variant(Integer(), "sqlite")
    evidence = JSON().with_variant(JSONB(), "postgresql")
    when = DateTime(timezone=True)
    Table(
        "conditions",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column("node", String(255), nullable=False),
        Column("type", String(128), nullable=False),
        Column("target", String(255), nullable=False),
        Column("status", String(16), nullable=False),
        Column("reason", String(128), nullable=False),
        Column("message", Text, nullable=False),
        Column("evidence", evidence, nullable=False),
        Column("since", when, nullable=False),
        Column("updated_at", when, nullable=False),
        UniqueConstraint("node", "type", "target"),
        Index(None, "status", "node"),
    )
    Table(
        "events",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column("node", String(255), nullable=False),
        Column("at", when, nullable=False),
        Column("kind", String(128), nullable=False),
        Column("fault_class", String(128), nullable=False),
        Column("target", String(255), nullable=False),
        Column("severity", String(16), nullable=False),
        Column("message", Text, nullable=False),
        Column("evidence", evidence, nullable=False),
        Column("source", String(128), nullable=False),
        Index(None, "node", "at"),
        Index(None, "kind", "at"),
        Index(None, "at"),
        # Ids never reused, even after prune empties the table: readers can page by id.
        sqlite_autoincrement=True,
    )
    metadata.create_all(conn)

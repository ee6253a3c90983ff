"""Version 4: offline sweeps (`medic sweep`): one row per sweep and one per node it planned,
with the node's state written before each action so an interrupted sweep resumes.

Frozen: this module describes the schema as version 4 created it.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

from medic_core.store.models import NAMING_CONVENTION

DESCRIPTION = "offline sweeps and their nodes"


def upgrade(conn: Connection) -> None:
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    ident = BigInteger().with_variant(Integer(), "sqlite")
    data = JSON().with_variant(JSONB(), "postgresql")
    when = DateTime(timezone=True)
    Table(
        "sweeps",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column("state", String(16), nullable=False),
        Column("partition", String(255), nullable=False),
        Column("share", Float, nullable=False),
        Column("host", String(255), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("message", Text, nullable=False),
        Column("started_at", when, nullable=False),
        Column("updated_at", when, nullable=False),
        Column("finished_at", when, nullable=True),
        Index(None, "state"),
        sqlite_autoincrement=True,  # reservation names carry the id: never reused
    )
    Table(
        "sweep_nodes",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column("sweep_id", ident, ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False),
        Column("node", String(255), nullable=False),
        Column("position", Integer, nullable=False),
        Column("partitions", data, nullable=False),
        Column("state", String(16), nullable=False),
        Column("reservation", String(255), nullable=False),
        Column("risk", data, nullable=False),
        Column("status", String(16), nullable=False),
        Column("findings", data, nullable=False),
        Column("message", Text, nullable=False),
        Column("episode_id", BigInteger, nullable=True),
        Column("taken_at", when, nullable=True),
        Column("checked_at", when, nullable=True),
        Column("returned_at", when, nullable=True),
        Column("seconds", Float, nullable=True),
        Index(None, "sweep_id", "node", unique=True),
        Index(None, "node", "checked_at"),
    )
    metadata.create_all(conn)

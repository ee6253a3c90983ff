"""Version 2: the remediation ladder's episodes, their steps (intent recorded before each
action) and the global pause switch.

Frozen: this module describes the schema as version 2 created it.
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
)
from sqlalchemy.dialects.postgresql import JSONB

from medic_core.store.models import NAMING_CONVENTION

DESCRIPTION = "remediation episodes, steps and pause switch"


def upgrade(conn: Connection) -> None:
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    ident = BigInteger().with_variant(Integer(), "sqlite")
    data = JSON().with_variant(JSONB(), "postgresql")
    when = DateTime(timezone=True)
    Table(
        "remediation_episodes",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column("node", String(255), nullable=False),
        Column("state", String(32), nullable=False),
        Column("fault_class", String(128), nullable=False),
        Column("target", String(255), nullable=False),
        Column("check_name", String(128), nullable=False),
        Column("recommendation", String(64), nullable=False),
        Column("first_rung", Integer, nullable=False),
        Column("rung", Integer, nullable=False),
        Column("attempts", data, nullable=False),
        Column("message", Text, nullable=False),
        Column("evidence", data, nullable=False),
        Column("failed_requalifications", Integer, nullable=False),
        Column("ticket_id", BigInteger, nullable=True),
        Column("opened_at", when, nullable=False),
        Column("updated_at", when, nullable=False),
        Column("closed_at", when, nullable=True),
        Index(None, "node", "state"),
        Index(None, "opened_at"),
    )
    Table(
        "remediation_steps",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column(
            "episode_id",
            ident,
            ForeignKey("remediation_episodes.id", ondelete="CASCADE"),
            nullable=False,
        ),
        Column("rung", Integer, nullable=False),
        Column("action", String(64), nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("state", String(16), nullable=False),
        Column("argv", data, nullable=False),
        Column("returncode", Integer, nullable=True),
        Column("output", Text, nullable=False),
        Column("boot_id", String(64), nullable=False),
        Column("started_at", when, nullable=False),
        Column("ended_at", when, nullable=True),
        Index(None, "episode_id"),
    )
    Table(
        "remediation_control",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("paused", Boolean, nullable=False),
        Column("reason", Text, nullable=False),
        Column("actor", String(255), nullable=False),
        Column("since", when, nullable=False),
    )
    metadata.create_all(conn)

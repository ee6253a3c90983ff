"""Version 7: Medic's drain records. Each drain Medic makes is written here (node, the reason
as Slurm will store it, time, actor, episode) before Slurm is asked; a resume closes it. Medic
owns a drain only while an open record matches what Slurm shows (docs/store.md).

At most one open record per node (a partial unique index). Additive: older Medic never reads
the table.

Frozen: this module describes the schema as version 7 created it.
"""

from __future__ import annotations

from sqlalchemy import (
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
    text,
)

from medic_core.store.models import NAMING_CONVENTION

DESCRIPTION = "drain records: the drains Medic made, so it resumes only its own"


def upgrade(conn: Connection) -> None:
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    ident = BigInteger().with_variant(Integer(), "sqlite")
    when = DateTime(timezone=True)
    still_open = text("closed_at IS NULL")
    Table(
        "drain_records",
        metadata,
        Column("id", ident, primary_key=True, autoincrement=True),
        Column("node", String(255), nullable=False),
        Column("reason", Text, nullable=False),
        Column("actor", String(255), nullable=False),
        Column("episode_id", BigInteger, nullable=True),
        Column("drained_at", when, nullable=False),
        Column("held", Text, nullable=False),
        Column("closed_at", when, nullable=True),
        Column("closed_by", String(255), nullable=False),
        Column("note", Text, nullable=False),
        Index(
            "ux_drain_records_open_node",
            "node",
            unique=True,
            sqlite_where=still_open,
            postgresql_where=still_open,
        ),
        Index(None, "node", "drained_at"),
        sqlite_autoincrement=True,
    )
    metadata.create_all(conn)

"""Version 5: `schema_compat`, one row holding the oldest schema version a Medic must know to
read and write this database. A Medic that knows a version at least that high keeps running
against a newer schema (a rolling upgrade); one that knows less is refused. The migration
runner keeps the row current (see `migrations/__init__.py`); this module only creates the
table.

Frozen: this module describes the schema as version 5 created it.
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    Connection,
    DateTime,
    Integer,
    MetaData,
    Table,
)

from medic_core.store.models import NAMING_CONVENTION

DESCRIPTION = "schema compatibility: the oldest schema version a Medic must know"


def upgrade(conn: Connection) -> None:
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    Table(
        "schema_compat",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("min_compatible", Integer, nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
        CheckConstraint("id = 1", name="one_row"),
    )
    metadata.create_all(conn)

"""Version 8: each node's inventory (driver, CUDA, kernel, BIOS, each GPU's VBIOS and InfoROM,
each HCA's firmware) as its daemon last found it: one row per node, the inventory a JSON
object (medic_core.inventory), `changed_at` when it last differed, `seen_at` when the daemon
last looked. `medic fleet drift` compares them.

Additive: older Medic never reads the table.

Frozen: this module describes the schema as version 8 created it.
"""

from __future__ import annotations

from sqlalchemy import JSON, Column, Connection, DateTime, MetaData, String, Table
from sqlalchemy.dialects.postgresql import JSONB

from medic_core.store.models import NAMING_CONVENTION

DESCRIPTION = "node inventory: the versions each node runs, for fleet drift"


def upgrade(conn: Connection) -> None:
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    when = DateTime(timezone=True)
    Table(
        "node_inventory",
        metadata,
        Column("node", String(255), primary_key=True),
        Column("inventory", JSON().with_variant(JSONB(), "postgresql"), nullable=False),
        Column("changed_at", when, nullable=False),
        Column("seen_at", when, nullable=False),
    )
    metadata.create_all(conn)

"""Schema migrations: an ordered list of versioned functions, recorded in `schema_version`.

`migrate` reads the version without taking a write lock and returns at once when the database
is current. Otherwise it takes the database's write lock (SQLite: BEGIN IMMEDIATE; PostgreSQL:
a transaction-scoped advisory lock), reads the version again, and applies what is missing
inside that one transaction: DDL is transactional on both backends, so a failed migration
leaves the previous version intact, and a second process opening the database at the same time
waits for the first and then finds nothing to do.

To change the schema: add `mNNNN_<what>.py` with an `upgrade(conn)` that uses only Core DDL or
SQL frozen in that file (never `models.py`, which follows the newest version), append it to
MIGRATIONS, and update `models.py`. A test checks the migrated schema against the models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    Table,
    Text,
    func,
    insert,
    inspect,
    select,
    text,
)

from medic_core.store.engine import StoreError, writer
from medic_core.store.migrations import m0001_conditions_events as m0001
from medic_core.store.migrations import m0002_remediation as m0002
from medic_core.store.migrations import m0003_rma as m0003
from medic_core.store.migrations import m0004_sweeps as m0004
from medic_core.store.models import UTCDateTime

# pg_advisory_xact_lock key shared by every Medic that migrates a PostgreSQL database.
PG_LOCK_KEY = 0x4D45444943  # "MEDIC"


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    upgrade: Callable[[Connection], None]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, m0001.DESCRIPTION, m0001.upgrade),
    Migration(2, m0002.DESCRIPTION, m0002.upgrade),
    Migration(3, m0003.DESCRIPTION, m0003.upgrade),
    Migration(4, m0004.DESCRIPTION, m0004.upgrade),
)

_metadata = MetaData()
# The runner's own bookkeeping; frozen like a migration.
schema_version = Table(
    "schema_version",
    _metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("description", Text, nullable=False),
    Column("applied_at", UTCDateTime(), nullable=False),
)


@dataclass(frozen=True)
class MigrationResult:
    before: int
    after: int

    @property
    def applied(self) -> bool:
        return self.after != self.before


def _check_sequence(migrations: Sequence[Migration]) -> int:
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise ValueError(
                f"migration {migration.description!r} has version {migration.version}, "
                f"expected {expected}: versions run 1, 2, 3... without gaps"
            )
    return len(migrations)


def current_version(conn: Connection) -> int:
    """The schema version of the database; 0 when Medic has never migrated it."""
    if not inspect(conn).has_table(schema_version.name):
        return 0
    version = conn.execute(select(func.max(schema_version.c.version))).scalar_one()
    return int(version) if version is not None else 0


def _refuse_newer(found: int, latest: int) -> None:
    if found > latest:
        raise StoreError(
            f"the database's schema is version {found} but this Medic knows versions up to "
            f"{latest}; upgrade Medic on this host (schemas are never downgraded)"
        )


def migrate(
    engine: Engine, migrations: Sequence[Migration] = MIGRATIONS, target: int | None = None
) -> MigrationResult:
    """Bring the database to `target` (default: the newest version in `migrations`)."""
    latest = _check_sequence(migrations)
    goal = latest if target is None else target
    if not 0 <= goal <= latest:
        raise ValueError(f"target version {goal} is not between 0 and {latest}")
    with engine.connect() as conn:
        found = current_version(conn)
        conn.rollback()
    _refuse_newer(found, latest)
    if found >= goal:
        return MigrationResult(found, found)
    with writer(engine).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY})
        schema_version.create(conn, checkfirst=True)
        before = current_version(conn)
        _refuse_newer(before, latest)
        for migration in migrations[before:goal]:
            migration.upgrade(conn)
            conn.execute(
                insert(schema_version).values(
                    version=migration.version,
                    description=migration.description,
                    applied_at=datetime.now(UTC),
                )
            )
    return MigrationResult(before, max(before, goal))

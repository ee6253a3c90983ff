"""Schema migrations: an ordered list of versioned functions, recorded in `schema_version`.

`migrate` reads the version without taking a write lock and returns at once when the database
is current. Otherwise it takes the database's write lock (SQLite: BEGIN IMMEDIATE; PostgreSQL:
a transaction-scoped advisory lock), reads the version again, and applies what is missing
inside that one transaction: DDL is transactional on both backends, so a failed migration
leaves the previous version intact, and a second process opening the database at the same time
waits for the first and then finds nothing to do.

Compatibility: each Migration declares whether Medic that predates it keeps working
(`Compat.ADDITIVE`: new tables, new nullable columns, new indexes) or not (`Compat.BREAKING`:
renames, drops, type changes, new NOT NULL columns; the default, so a migration nobody
classified stops older Medic rather than letting it write what the new schema cannot hold).
From version 5 on, the database itself records in `schema_compat` the oldest version a Medic
must know: the newest BREAKING migration applied. An older Medic cannot know what a future
migration did, so it reads this: a database newer than the code is used, with one WARNING,
when the code knows at least that version, and refused otherwise. A newer database with no
record (nothing wrote one: only a Medic that knows no compatibility can have made it) is
refused, as every Medic before version 5 refuses any newer schema.

To change the schema: add `mNNNN_<what>.py` with an `upgrade(conn)` that uses only Core DDL or
SQL frozen in that file (never `models.py`, which follows the newest version), append it to
MIGRATIONS with its `Compat`, and update `models.py`. A test checks the migrated schema
against the models.
"""

from __future__ import annotations

import enum
import logging
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
    update,
)

from medic_core.store.engine import StoreError, writer
from medic_core.store.migrations import m0001_conditions_events as m0001
from medic_core.store.migrations import m0002_remediation as m0002
from medic_core.store.migrations import m0003_rma as m0003
from medic_core.store.migrations import m0004_sweeps as m0004
from medic_core.store.migrations import m0005_schema_compat as m0005
from medic_core.store.migrations import m0006_conditions_node_updated as m0006
from medic_core.store.migrations import m0007_drain_records as m0007
from medic_core.store.migrations import m0008_node_inventory as m0008
from medic_core.store.models import UTCDateTime

log = logging.getLogger("medic.store")

# pg_advisory_xact_lock key shared by every Medic that migrates a PostgreSQL database.
PG_LOCK_KEY = 0x4D45444943  # "MEDIC"


class Compat(enum.Enum):
    """What a migration does to Medic that predates it."""

    ADDITIVE = "additive"  # keeps it working: new tables, nullable columns, indexes
    BREAKING = "breaking"  # stops it: renames, drops, type changes, new NOT NULL columns


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    upgrade: Callable[[Connection], None]
    compat: Compat = Compat.BREAKING


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, m0001.DESCRIPTION, m0001.upgrade, Compat.BREAKING),  # nothing predates it
    Migration(2, m0002.DESCRIPTION, m0002.upgrade, Compat.ADDITIVE),
    Migration(3, m0003.DESCRIPTION, m0003.upgrade, Compat.ADDITIVE),
    Migration(4, m0004.DESCRIPTION, m0004.upgrade, Compat.ADDITIVE),
    Migration(5, m0005.DESCRIPTION, m0005.upgrade, Compat.ADDITIVE),
    Migration(6, m0006.DESCRIPTION, m0006.upgrade, Compat.ADDITIVE),
    Migration(7, m0007.DESCRIPTION, m0007.upgrade, Compat.ADDITIVE),
    Migration(8, m0008.DESCRIPTION, m0008.upgrade, Compat.ADDITIVE),
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
# Created by migration 5 (m0005_schema_compat), kept current by `migrate`; frozen likewise.
schema_compat = Table(
    "schema_compat",
    _metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("min_compatible", Integer, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
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


def min_compatible(migrations: Sequence[Migration], version: int) -> int:
    """The oldest schema version a Medic must know to use a database at `version`: the
    newest BREAKING migration up to it (0 when there is none)."""
    return max((m.version for m in migrations[:version] if m.compat is Compat.BREAKING), default=0)


def admits(known: int, found: int, floor: int | None) -> bool:
    """Whether a Medic that knows schema versions up to `known` may use a database at `found`
    whose recorded oldest compatible version is `floor` (None: no record)."""
    return found <= known or (floor is not None and known >= floor)


def recorded_min_compatible(conn: Connection) -> int | None:
    """The database's `schema_compat` record; None when it has none (before version 5)."""
    if not inspect(conn).has_table(schema_compat.name):
        return None
    value = conn.execute(
        select(schema_compat.c.min_compatible).where(schema_compat.c.id == 1)
    ).scalar_one_or_none()
    return int(value) if value is not None else None


@dataclass(frozen=True)
class SchemaState:
    """A database's schema as this code sees it, read without changing anything."""

    version: int  # the database's (0: never migrated)
    known: int  # the newest this code knows
    min_compatible: int | None  # the database's record; None before version 5
    pending: tuple[Migration, ...]  # what `migrate` would apply

    @property
    def admitted(self) -> bool:
        """Whether this code may use the database (once `pending` is applied)."""
        return admits(self.known, self.version, self.min_compatible)


def schema_state(engine: Engine, migrations: Sequence[Migration] = MIGRATIONS) -> SchemaState:
    known = _check_sequence(migrations)
    with engine.connect() as conn:
        version = current_version(conn)
        floor = recorded_min_compatible(conn)
        conn.rollback()
    return SchemaState(version, known, floor, tuple(migrations[version:]))


def _check_newer(found: int, latest: int, floor: int | None) -> None:
    """Refuse a newer database this Medic cannot use (StoreError, one line); warn, once per
    open, about one it can."""
    if found <= latest:
        return
    head = f"the database's schema is version {found} but this Medic knows versions up to {latest}"
    if floor is None:
        raise StoreError(
            f"{head}, and the database records no older version it still serves; upgrade "
            "Medic on this host (schemas are never downgraded)"
        )
    if not admits(latest, found, floor):
        raise StoreError(
            f"{head}, and version {floor} changed it in a way older Medic cannot use; upgrade "
            f"Medic on this host to one that knows version {floor} or later (schemas are "
            "never downgraded)"
        )
    log.warning(
        "%s; its changes since version %d keep older Medic working, so this one runs: "
        "upgrade Medic on this host",
        head,
        floor,
    )


def _record_min_compatible(conn: Connection, value: int) -> None:
    now = datetime.now(UTC)
    changed = conn.execute(
        update(schema_compat)
        .where(schema_compat.c.id == 1)
        .values(min_compatible=value, updated_at=now)
    ).rowcount
    if not changed:
        conn.execute(insert(schema_compat).values(id=1, min_compatible=value, updated_at=now))


def migrate(
    engine: Engine,
    migrations: Sequence[Migration] = MIGRATIONS,
    target: int | None = None,
    *,
    allow_breaking: bool = True,
) -> MigrationResult:
    """Bring the database to `target` (default: the newest version in `migrations`).

    A database newer than `migrations` is left as it is: used (one WARNING) when its
    `schema_compat` record admits this code, refused with StoreError otherwise. Without
    `allow_breaking` (a daemon, a hook or a command opening the store) a pending BREAKING
    migration of an existing database is refused, not applied: the first upgraded node of a
    fleet would otherwise cut off every node not upgraded yet (`medic store migrate` applies
    it, on purpose)."""
    latest = _check_sequence(migrations)
    goal = latest if target is None else target
    if not 0 <= goal <= latest:
        raise ValueError(f"target version {goal} is not between 0 and {latest}")
    with engine.connect() as conn:
        found = current_version(conn)
        floor = recorded_min_compatible(conn) if found > latest else None
        conn.rollback()
    _check_newer(found, latest, floor)
    if found >= goal:
        return MigrationResult(found, found)
    with writer(engine).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY})
        schema_version.create(conn, checkfirst=True)
        before = current_version(conn)
        if before >= goal:  # another Medic migrated while this one waited for the lock
            if before > latest:
                _check_newer(before, latest, recorded_min_compatible(conn))
            return MigrationResult(before, before)
        breaking = [m for m in migrations[before:goal] if m.compat is Compat.BREAKING]
        if breaking and before > 0 and not allow_breaking:
            raise StoreError(
                f"the database's schema is version {before} and this Medic needs {goal}, but"
                f" version {breaking[0].version} ({breaking[0].description}) is a breaking"
                " change that Medic never applies on its own: stop or upgrade every daemon,"
                " then run `medic store migrate` once (docs/store.md, upgrading a fleet)"
            )
        for migration in migrations[before:goal]:
            migration.upgrade(conn)
            conn.execute(
                insert(schema_version).values(
                    version=migration.version,
                    description=migration.description,
                    applied_at=datetime.now(UTC),
                )
            )
        if inspect(conn).has_table(schema_compat.name):
            _record_min_compatible(conn, min_compatible(migrations, goal))
    return MigrationResult(before, goal)

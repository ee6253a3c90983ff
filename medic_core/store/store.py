"""The store: conditions (current state, one row per node/type/target), events (history),
drain records and node inventories, behind one facade (Store) and opened by open_store. What
it is given is checked by store.values, a condition is written by store.conditions, a drain
record's event applied by store.drain_records; the `[store]` table is store.store_table's.

Every method runs in its own short transaction and returns plain dataclasses; no ORM object
outlives its session. All times are aware UTC datetimes; naive datetimes are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from medic_core.config import MedicConfig
from medic_core.store.conditions import apply_update, check_update
from medic_core.store.drain_records import (
    DRAIN_HELD,
    DRAIN_KINDS,
    DRAIN_RECORDED,
    DRAIN_RESUMED,
    apply_drain_event,
    drain_event,
)
from medic_core.store.engine import (
    DEFAULT_POOL,
    DEFAULT_POOL_SIZE,
    StoreError,
    describe,
    make_engine,
    parse_url,
    writer,
)
from medic_core.store.migrations import MIGRATIONS, Migration, current_version, migrate
from medic_core.store.models import (
    NODE_LEN,
    Condition,
    ConditionChange,
    ConditionRow,
    ConditionUpdate,
    DrainRecord,
    DrainRecordRow,
    Event,
    EventRow,
    NodeInventoryRow,
    Severity,
    Status,
    StoredInventory,
    check_evidence,
    utc,
)
from medic_core.store.store_table import store_settings
from medic_core.store.values import event_values, required_name, status_of

DEFAULT_EVENTS_LIMIT = 1000


def open_store(
    url: str | URL,
    *,
    migrations: Sequence[Migration] = MIGRATIONS,
    allow_breaking: bool = False,
    pool: str = DEFAULT_POOL,
    pool_size: int = DEFAULT_POOL_SIZE,
) -> Store:
    """Open the database at `url`, creating or upgrading its schema first (additive
    migrations only, unless `allow_breaking`: see migrations.migrate).

    Raises BadStoreURL for a URL Medic cannot use and StoreError when the database cannot be
    reached, its schema is newer than this Medic, or a breaking migration is pending.
    `migrations` is for tests; `pool` and `pool_size` are `[store]`'s (PostgreSQL only: see
    engine.make_engine).
    """
    parsed = parse_url(url)
    engine = make_engine(parsed, pool, pool_size)
    try:
        migrate(engine, migrations, allow_breaking=allow_breaking)
    except DBAPIError as exc:
        engine.dispose()
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise StoreError(
            f"store {describe(parsed)}: {detail}; check [store] url and that the database "
            "is reachable and writable"
        ) from exc
    except BaseException:
        engine.dispose()
        raise
    return Store(engine, parsed)


def open_configured_store(config: MedicConfig) -> Store:
    settings = store_settings(config)
    return open_store(settings.url, pool=settings.pool, pool_size=settings.pool_size)


class Store:
    def __init__(self, engine: Engine, url: URL) -> None:
        self._engine = engine
        self._writer = writer(engine)
        self._url = url

    @property
    def url(self) -> str:
        """The URL with any password hidden."""
        return describe(self._url)

    @property
    def engine(self) -> Engine:
        """For later parts of Medic that add their own tables through migrations."""
        return self._engine

    @property
    def backend(self) -> str:
        """ "sqlite" or "postgresql"."""
        return self._engine.dialect.name

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def schema_version(self) -> int:
        with self._engine.connect() as conn:
            return current_version(conn)

    # -- conditions ------------------------------------------------------------------------

    def set_condition(
        self, node: str, update: ConditionUpdate, now: datetime
    ) -> ConditionChange | None:
        """Record one observation. `since` moves only when status or reason changes; message,
        evidence and updated_at follow every observation. Returns the transition, if any
        (a first observation is one, with previous_status None)."""
        changes = self.set_conditions(node, [update], now)
        return changes[0] if changes else None

    def set_conditions(
        self, node: str, updates: Iterable[ConditionUpdate], now: datetime
    ) -> list[ConditionChange]:
        """`set_condition` for many conditions of one node, in one transaction."""
        required_name(node, "node", NODE_LEN)
        at = utc(now, "now")
        checked = [check_update(u) for u in updates]
        changes: list[ConditionChange] = []
        with Session(self._writer) as session, session.begin():
            for update, status, evidence in checked:
                change = apply_update(session, node, update, status, evidence, at)
                if change is not None:
                    changes.append(change)
        return changes

    def conditions(
        self,
        node: str | None = None,
        status: Status | str | Iterable[Status | str] | None = None,
        type: str | None = None,
    ) -> list[Condition]:
        """Conditions ordered by node, type and target; `status` may be one or several."""
        query = select(ConditionRow).order_by(
            ConditionRow.node, ConditionRow.type, ConditionRow.target
        )
        if node is not None:
            query = query.where(ConditionRow.node == node)
        if type is not None:
            query = query.where(ConditionRow.type == type)
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            query = query.where(ConditionRow.status.in_([status_of(s).value for s in wanted]))
        with Session(self._engine) as session:
            return [row.to_condition() for row in session.scalars(query)]

    # -- events ----------------------------------------------------------------------------

    def add_event(
        self,
        node: str,
        *,
        at: datetime,
        kind: str,
        severity: Severity | str,
        source: str,
        message: str = "",
        fault_class: str = "",
        target: str = "",
        evidence: Mapping[str, Any] | None = None,
    ) -> Event:
        """Append one occurrence; returns it with its id. An event of a drain record
        (DRAIN_KINDS) also opens, closes or holds the record, in the same transaction."""
        values = event_values(
            node, at, kind, severity, source, message, fault_class, target, evidence
        )
        if kind in DRAIN_KINDS:
            with Session(self._writer) as session, session.begin():
                event_id = apply_drain_event(session, values)
            return Event(id=event_id, **{**values, "severity": Severity(values["severity"])})
        with self._writer.begin() as conn:
            event_id = conn.execute(insert(EventRow).returning(EventRow.id), values).scalar_one()
        return Event(id=event_id, **{**values, "severity": Severity(values["severity"])})

    def add_events(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Append many occurrences in one transaction, in their order: each a mapping of
        add_event's keywords with `node`. All are checked first: the first one that is not
        data the store takes raises ValueError naming its place, and nothing is written.
        Returns how many were written."""
        rows = []
        for place, event in enumerate(events):
            try:
                rows.append(event_values(**event))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"event {place + 1} of the batch: {exc}") from None
        if any(row["kind"] in DRAIN_KINDS for row in rows):
            with Session(self._writer) as session, session.begin():
                for row in rows:
                    if row["kind"] in DRAIN_KINDS:
                        apply_drain_event(session, row)
                    else:
                        session.execute(insert(EventRow), row)
        elif rows:
            with self._writer.begin() as conn:
                conn.execute(insert(EventRow), rows)  # one statement, executemany
        return len(rows)

    # -- drain records ---------------------------------------------------------------------

    def record_drain(
        self,
        node: str,
        reason: str,
        *,
        at: datetime,
        actor: str,
        episode_id: int | None = None,
        note: str = "",
    ) -> DrainRecord:
        """Record a drain Medic is about to ask of Slurm (call it BEFORE Slurm): the node's
        open record, replacing the one before (closed as replaced). With its event."""
        self.add_event(node, **drain_event(DRAIN_RECORDED, reason, at, actor, episode_id, note))
        record = self.open_drain(node)
        assert record is not None
        return record

    def close_drain(
        self,
        node: str,
        reason: str,
        *,
        at: datetime,
        actor: str,
        episode_id: int | None = None,
        note: str = "",
    ) -> Event:
        """A resume of `node` by `actor`: the event, and the open record with this reason
        (if any) closed. Call it before Slurm is asked to resume."""
        return self.add_event(
            node, **drain_event(DRAIN_RESUMED, reason, at, actor, episode_id, note)
        )

    def hold_drain(self, node: str, reason: str, *, at: datetime, actor: str, note: str) -> Event:
        """Only a human may give the open record's drain back from now on (`note`: why)."""
        return self.add_event(node, **drain_event(DRAIN_HELD, reason, at, actor, None, note))

    def open_drain(self, node: str) -> DrainRecord | None:
        """The node's open drain record, if any."""
        query = select(DrainRecordRow).where(
            DrainRecordRow.node == node, DrainRecordRow.closed_at.is_(None)
        )
        with Session(self._engine) as session:
            row = session.scalars(query).one_or_none()
            return row.to_record() if row is not None else None

    def drain_holdings(self) -> dict[str, str | None]:
        """Every node this store holds drain records of (Medic drained it here at least
        once), with the reason of its open record, None when it has none open: whose a
        node's drain is, for the drain cap (remediation.decide.cap_reason)."""
        query = select(DrainRecordRow.node, DrainRecordRow.reason, DrainRecordRow.closed_at)
        out: dict[str, str | None] = {}
        with Session(self._engine) as session:
            for node, reason, closed_at in session.execute(query):
                if closed_at is None:
                    out[node] = reason
                else:
                    out.setdefault(node, None)
        return out

    def drain_records(self, node: str | None = None, limit: int = 100) -> list[DrainRecord]:
        """Drain records, newest first."""
        query = (
            select(DrainRecordRow)
            .order_by(DrainRecordRow.drained_at.desc(), DrainRecordRow.id.desc())
            .limit(limit)
        )
        if node is not None:
            query = query.where(DrainRecordRow.node == node)
        with Session(self._engine) as session:
            return [row.to_record() for row in session.scalars(query)]

    # -- node inventory --------------------------------------------------------------------

    def record_inventory(self, node: str, inventory: Mapping[str, Any], at: datetime) -> bool:
        """`node`'s inventory as its daemon found it at `at` (medic_core.inventory's JSON);
        True when it differs from the one stored (or is the first), False when only its
        `seen_at` moved."""
        required_name(node, "node", NODE_LEN)
        when = utc(at, "inventory time")
        data = check_evidence(inventory, "inventory")
        with Session(self._writer) as session, session.begin():
            row = session.get(NodeInventoryRow, node, with_for_update=True)
            if row is None:
                session.add(
                    NodeInventoryRow(node=node, inventory=data, changed_at=when, seen_at=when)
                )
                return True
            row.seen_at = when
            if row.inventory == data:
                return False
            row.inventory, row.changed_at = data, when
            return True

    def inventories(self) -> list[StoredInventory]:
        """Every node's inventory, ordered by node."""
        query = select(NodeInventoryRow).order_by(NodeInventoryRow.node)
        with Session(self._engine) as session:
            return [row.to_stored() for row in session.scalars(query)]

    def events(
        self,
        node: str | None = None,
        since: datetime | None = None,
        kind: str | None = None,
        limit: int = DEFAULT_EVENTS_LIMIT,
    ) -> list[Event]:
        """The newest `limit` events at or after `since`, newest first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive whole number, got {limit!r}")
        query = select(EventRow).order_by(EventRow.at.desc(), EventRow.id.desc()).limit(limit)
        if node is not None:
            query = query.where(EventRow.node == node)
        if since is not None:
            query = query.where(EventRow.at >= utc(since, "since"))
        if kind is not None:
            query = query.where(EventRow.kind == kind)
        with Session(self._engine) as session:
            return [row.to_event() for row in session.scalars(query)]

    def prune(self, now: datetime, keep_days: int) -> int:
        """Delete events older than `keep_days` before `now`; conditions are never pruned.
        Returns how many events were deleted."""
        if isinstance(keep_days, bool) or not isinstance(keep_days, int) or keep_days < 0:
            raise ValueError(f"keep_days must be a whole number >= 0, got {keep_days!r}")
        cutoff = utc(now, "now") - timedelta(days=keep_days)
        with self._writer.begin() as conn:
            result = conn.execute(delete(EventRow).where(EventRow.at < cutoff))
            return result.rowcount


__all__ = ["DEFAULT_EVENTS_LIMIT", "Store", "open_configured_store", "open_store"]

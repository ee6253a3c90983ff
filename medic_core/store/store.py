"""The store: conditions (current state, one row per node/type/target) and events (history).

Every method runs in its own short transaction and returns plain dataclasses; no ORM object
outlives its session. All times are aware UTC datetimes; naive datetimes are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from medic_core.config import ConfigError, MedicConfig
from medic_core.store.engine import (
    DEFAULT_POOL,
    DEFAULT_POOL_SIZE,
    POOLS,
    BadStoreURL,
    StoreError,
    describe,
    make_engine,
    parse_url,
    writer,
)
from medic_core.store.migrations import MIGRATIONS, Migration, current_version, migrate
from medic_core.store.models import (
    NAME_LEN,
    NODE_LEN,
    TARGET_LEN,
    Condition,
    ConditionChange,
    ConditionRow,
    ConditionUpdate,
    Event,
    EventRow,
    Severity,
    Status,
    check_evidence,
    check_text,
    utc,
)

DEFAULT_EVENT_RETENTION_DAYS = 90
DEFAULT_EVENTS_LIMIT = 1000
STORE_KEYS = ("url", "event_retention_days", "pool", "pool_size")
MAX_POOL_SIZE = 50


@dataclass(frozen=True)
class StoreSettings:
    """The `[store]` table of medic.toml."""

    url: str
    event_retention_days: int = DEFAULT_EVENT_RETENTION_DAYS
    pool: str = DEFAULT_POOL  # PostgreSQL: "queue" (idle connections kept) or "null"
    pool_size: int = DEFAULT_POOL_SIZE  # idle connections a "queue" pool keeps


def default_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'medic.db'}"


def store_settings(config: MedicConfig) -> StoreSettings:
    """Read and check `[store]`; raises ConfigError naming the key and the fix."""
    table = config.table("store")
    for key in table:
        if key not in STORE_KEYS:
            raise ConfigError(
                config.source, f"store.{key}", "unknown key", f"use one of: {', '.join(STORE_KEYS)}"
            )
    raw_url = table.get("url", default_url(config.paths.state_dir))
    if not isinstance(raw_url, str):
        raise ConfigError(
            config.source, "store.url", f"expected a string, got {raw_url!r}", "quote the URL"
        )
    try:
        parse_url(raw_url)
    except BadStoreURL as exc:
        raise ConfigError(config.source, "store.url", exc.problem, exc.fix) from None
    days = table.get("event_retention_days", DEFAULT_EVENT_RETENTION_DAYS)
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigError(
            config.source,
            "store.event_retention_days",
            f"expected a whole number of days >= 1, got {days!r}",
            f"give a number such as {DEFAULT_EVENT_RETENTION_DAYS}",
        )
    pool = table.get("pool", DEFAULT_POOL)
    if pool not in POOLS:
        raise ConfigError(
            config.source,
            "store.pool",
            f"expected one of {', '.join(POOLS)}, got {pool!r}",
            'use "queue" (connections kept, the default) or "null" (behind pgbouncer in'
            " transaction mode)",
        )
    size = table.get("pool_size", DEFAULT_POOL_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_POOL_SIZE:
        raise ConfigError(
            config.source,
            "store.pool_size",
            f"expected a whole number from 1 to {MAX_POOL_SIZE}, got {size!r}",
            f"give a number such as {DEFAULT_POOL_SIZE}",
        )
    return StoreSettings(url=raw_url, event_retention_days=days, pool=pool, pool_size=size)


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


def _insert_ignoring_conflict(dialect: str, values: dict[str, Any]) -> Any:
    index = [ConditionRow.node, ConditionRow.type, ConditionRow.target]
    if dialect == "postgresql":
        pg = postgresql.insert(ConditionRow).values(values)
        return pg.on_conflict_do_nothing(index_elements=index).returning(ConditionRow.id)
    lite = sqlite.insert(ConditionRow).values(values)
    return lite.on_conflict_do_nothing(index_elements=index).returning(ConditionRow.id)


def _status(value: Status | str) -> Status:
    try:
        return Status(value)
    except ValueError:
        known = ", ".join(s.value for s in Status)
        raise ValueError(f"unknown status {value!r}; use one of {known}") from None


def _severity(value: Severity | str) -> Severity:
    try:
        return Severity(value)
    except ValueError:
        known = ", ".join(s.value for s in Severity)
        raise ValueError(f"unknown severity {value!r}; use one of {known}") from None


def _name(value: str, what: str, max_len: int) -> str:
    check_text(value, what, max_len)
    if not value:
        raise ValueError(f"{what} must not be empty")
    return value


def _event_values(
    node: str,
    at: datetime,
    kind: str,
    severity: Severity | str,
    source: str,
    message: str = "",
    fault_class: str = "",
    target: str = "",
    evidence: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An event row's columns, checked; ValueError (one line) for what the store cannot take."""
    return {
        "node": _name(node, "node", NODE_LEN),
        "at": utc(at, "event time"),
        "kind": _name(kind, "event kind", NAME_LEN),
        "fault_class": check_text(fault_class, "fault class", NAME_LEN),
        "target": check_text(target, "event target", TARGET_LEN),
        "severity": _severity(severity).value,
        "message": check_text(message, "event message"),
        "evidence": check_evidence(evidence),
        "source": _name(source, "event source", NAME_LEN),
    }


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
        _name(node, "node", NODE_LEN)
        at = utc(now, "now")
        checked = [self._check_update(u) for u in updates]
        changes: list[ConditionChange] = []
        with Session(self._writer) as session, session.begin():
            for update, status, evidence in checked:
                change = self._apply(session, node, update, status, evidence, at)
                if change is not None:
                    changes.append(change)
        return changes

    @staticmethod
    def _check_update(update: ConditionUpdate) -> tuple[ConditionUpdate, Status, dict[str, Any]]:
        _name(update.type, "condition type", NAME_LEN)
        check_text(update.target, "condition target", TARGET_LEN)
        check_text(update.reason, "condition reason", NAME_LEN)
        check_text(update.message, "condition message")
        return update, _status(update.status), check_evidence(update.evidence)

    @staticmethod
    def _apply(
        session: Session,
        node: str,
        update: ConditionUpdate,
        status: Status,
        evidence: dict[str, Any],
        at: datetime,
    ) -> ConditionChange | None:
        query = (
            select(ConditionRow)
            .where(
                ConditionRow.node == node,
                ConditionRow.type == update.type,
                ConditionRow.target == update.target,
            )
            .with_for_update()
        )
        row = session.scalars(query).one_or_none()
        if row is None:
            values = {
                "node": node,
                "type": update.type,
                "target": update.target,
                "status": status.value,
                "reason": update.reason,
                "message": update.message,
                "evidence": evidence,
                "since": at,
                "updated_at": at,
            }
            dialect = session.get_bind().dialect.name
            inserted = session.execute(_insert_ignoring_conflict(dialect, values)).first()
            if inserted is not None:
                return ConditionChange(
                    node, update.type, update.target, None, None, None, status,
                    update.reason, update.message, at,
                )  # fmt: skip
            # Another writer created it between our read and our insert: update theirs.
            row = session.scalars(query).one()
        change = None
        if row.status != status.value or row.reason != update.reason:
            change = ConditionChange(
                node, update.type, update.target, Status(row.status), row.reason, row.since,
                status, update.reason, update.message, at,
            )  # fmt: skip
            row.since = at
        row.status = status.value
        row.reason = update.reason
        row.message = update.message
        row.evidence = evidence
        row.updated_at = at
        return change

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
            query = query.where(ConditionRow.status.in_([_status(s).value for s in wanted]))
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
        """Append one occurrence; returns it with its id."""
        values = _event_values(
            node, at, kind, severity, source, message, fault_class, target, evidence
        )
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
                rows.append(_event_values(**event))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"event {place + 1} of the batch: {exc}") from None
        if rows:
            with self._writer.begin() as conn:
                conn.execute(insert(EventRow), rows)  # one statement, executemany
        return len(rows)

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


__all__ = [
    "DEFAULT_EVENT_RETENTION_DAYS",
    "BadStoreURL",
    "Store",
    "StoreError",
    "StoreSettings",
    "default_url",
    "open_configured_store",
    "open_store",
    "store_settings",
]

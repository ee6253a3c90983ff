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

from medic_core.config import ConfigError, MedicConfig, shown
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
    DrainRecord,
    DrainRecordRow,
    Event,
    EventRow,
    NodeInventoryRow,
    Severity,
    Status,
    StoredInventory,
    check_evidence,
    check_text,
    utc,
)

DEFAULT_EVENT_RETENTION_DAYS = 90
# The events of Medic's drain records (docs/store.md): each also opens, closes or holds a
# row of `drain_records` in the same transaction, whichever way it arrives (a direct call,
# the daemon's socket, or a journal replay after the store was down).
DRAIN_RECORDED = "medic.drain"
DRAIN_RESUMED = "medic.resume"
DRAIN_HELD = "medic.drain_held"
DRAIN_KINDS = frozenset({DRAIN_RECORDED, DRAIN_RESUMED, DRAIN_HELD})
DEFAULT_EVENTS_LIMIT = 1000
STORE_KEYS = ("url", "event_retention_days", "pool", "pool_size")
MAX_POOL_SIZE = 50
MAX_RETENTION_DAYS = 36500  # a century: a number past it is a typo, not a policy


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
            config.source, "store.url", f"expected a string, got {shown(raw_url)}", "quote the URL"
        )
    try:
        parse_url(raw_url)
    except BadStoreURL as exc:
        raise ConfigError(config.source, "store.url", exc.problem, exc.fix) from None
    days = table.get("event_retention_days", DEFAULT_EVENT_RETENTION_DAYS)
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_RETENTION_DAYS:
        raise ConfigError(
            config.source,
            "store.event_retention_days",
            f"expected a whole number of days from 1 to {MAX_RETENTION_DAYS}, got {shown(days)}",
            f"give a number such as {DEFAULT_EVENT_RETENTION_DAYS}",
        )
    pool = table.get("pool", DEFAULT_POOL)
    if pool not in POOLS:
        raise ConfigError(
            config.source,
            "store.pool",
            f"expected one of {', '.join(POOLS)}, got {shown(pool)}",
            'use "queue" (connections kept, the default) or "null" (behind pgbouncer in'
            " transaction mode)",
        )
    size = table.get("pool_size", DEFAULT_POOL_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_POOL_SIZE:
        raise ConfigError(
            config.source,
            "store.pool_size",
            f"expected a whole number from 1 to {MAX_POOL_SIZE}, got {shown(size)}",
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
        """Append one occurrence; returns it with its id. An event of a drain record
        (DRAIN_KINDS) also opens, closes or holds the record, in the same transaction."""
        values = _event_values(
            node, at, kind, severity, source, message, fault_class, target, evidence
        )
        if kind in DRAIN_KINDS:
            with Session(self._writer) as session, session.begin():
                event_id = _drain_event(session, values)
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
                rows.append(_event_values(**event))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"event {place + 1} of the batch: {exc}") from None
        if any(row["kind"] in DRAIN_KINDS for row in rows):
            with Session(self._writer) as session, session.begin():
                for row in rows:
                    if row["kind"] in DRAIN_KINDS:
                        _drain_event(session, row)
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
        _name(node, "node", NODE_LEN)
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


def drain_event(
    kind: str, reason: str, at: datetime, actor: str, episode_id: int | None, note: str
) -> dict[str, Any]:
    """add_event's keywords (but the node) for a drain record's event: also what a node's
    journal keeps when the store is down, replayed into the same record later."""
    verb = {DRAIN_RECORDED: "drained", DRAIN_RESUMED: "resumed", DRAIN_HELD: "held"}[kind]
    episode = f" (episode {episode_id})" if episode_id is not None else ""
    return {
        "at": at,
        "kind": kind,
        "severity": "WARN" if kind == DRAIN_RECORDED else "INFO",
        "source": actor[:NAME_LEN] or "medic",
        "message": f"{verb} by {actor}{episode}: {reason}" + (f"; {note}" if note else ""),
        "evidence": {"reason": reason, "actor": actor, "episode_id": episode_id, "note": note},
    }


def _drain_event(session: Session, values: Mapping[str, Any]) -> int:
    """Apply a drain record's event to `drain_records` and insert the event; its id."""
    evidence = values["evidence"]
    reason = evidence.get("reason")
    actor = evidence.get("actor")
    episode_id = evidence.get("episode_id")
    if not isinstance(reason, str) or not isinstance(actor, str) or not actor:
        raise ValueError(f"a {values['kind']} event needs evidence reason and actor (strings)")
    if episode_id is not None and (isinstance(episode_id, bool) or not isinstance(episode_id, int)):
        raise ValueError(f"episode_id must be a whole number or null, got {episode_id!r}")
    check_text(actor, "actor", NODE_LEN)
    node, at, note = values["node"], values["at"], str(evidence.get("note") or "")
    current = session.scalars(
        select(DrainRecordRow)
        .where(DrainRecordRow.node == node, DrainRecordRow.closed_at.is_(None))
        .with_for_update()
    ).one_or_none()
    kind = values["kind"]
    if kind == DRAIN_RECORDED:
        seen = session.scalars(
            select(DrainRecordRow.id).where(
                DrainRecordRow.node == node,
                DrainRecordRow.drained_at == at,
                DrainRecordRow.reason == reason,
                DrainRecordRow.actor == actor,
            )
        ).first()
        if seen is None:  # a journal replays at least once: the same drain is one record
            older = current is not None and current.drained_at > at
            if current is not None and not older:
                current.closed_at, current.closed_by = at, actor
                current.note = "replaced by a later drain"
                session.flush()
            session.add(
                DrainRecordRow(
                    node=node, reason=reason, actor=actor, episode_id=episode_id,
                    drained_at=at, held="", closed_at=at if older else None,
                    closed_by=actor if older else "",
                    note="replayed after a later drain" if older else note,
                )
            )  # fmt: skip
    elif current is not None and current.reason == reason and current.drained_at <= at:
        if kind == DRAIN_RESUMED:
            current.closed_at, current.closed_by, current.note = at, actor, note or "resumed"
        else:
            current.held = f"{actor}: {note}" if note else actor
    session.flush()
    event_id: int = session.execute(
        insert(EventRow).returning(EventRow.id), dict(values)
    ).scalar_one()
    return event_id


__all__ = [
    "DEFAULT_EVENT_RETENTION_DAYS",
    "DRAIN_HELD",
    "DRAIN_KINDS",
    "DRAIN_RECORDED",
    "DRAIN_RESUMED",
    "BadStoreURL",
    "Store",
    "StoreError",
    "StoreSettings",
    "default_url",
    "open_configured_store",
    "open_store",
    "store_settings",
]

"""Offline sweeps, the store: one `sweeps` row per sweep and one `sweep_nodes` row per node it
planned (schema version 4, `medic_core/store/migrations/m0004_sweeps.py`), the fleet-wide
lock one running sweep holds, and the row mappers. Every step of a sweep is written here
before it is taken, so `Sweeper.run` after a crash resumes from these rows.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from medic_core.store import Store
from medic_core.store.engine import writer
from medic_core.store.models import NAMING_CONVENTION
from remediation.sweep.policy import (
    DONE,
    PLANNED,
    RUNNING,
    Candidate,
    Risk,
    reservation_name,
)

SWEEP_LOCK_KEY = 0x4D45445357  # "MEDSW": the PostgreSQL advisory lock held by a running sweep

METADATA = MetaData(naming_convention=NAMING_CONVENTION)
_ident = BigInteger().with_variant(Integer(), "sqlite")
_data = JSON().with_variant(JSONB(), "postgresql")
_when = DateTime(timezone=True)

sweeps = Table(
    "sweeps",
    METADATA,
    Column("id", _ident, primary_key=True, autoincrement=True),
    Column("state", String(16), nullable=False),
    Column("partition", String(255), nullable=False),
    Column("share", Float, nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("message", Text, nullable=False),
    Column("started_at", _when, nullable=False),
    Column("updated_at", _when, nullable=False),
    Column("finished_at", _when, nullable=True),
    Index(None, "state"),
)
sweep_nodes = Table(
    "sweep_nodes",
    METADATA,
    Column("id", _ident, primary_key=True, autoincrement=True),
    Column("sweep_id", _ident, ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False),
    Column("node", String(255), nullable=False),
    Column("position", Integer, nullable=False),
    Column("partitions", _data, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reservation", String(255), nullable=False),
    Column("risk", _data, nullable=False),
    Column("status", String(16), nullable=False),
    Column("findings", _data, nullable=False),
    Column("message", Text, nullable=False),
    Column("episode_id", BigInteger, nullable=True),
    Column("taken_at", _when, nullable=True),
    Column("checked_at", _when, nullable=True),
    Column("returned_at", _when, nullable=True),
    Column("seconds", Float, nullable=True),
    Index(None, "sweep_id", "node", unique=True),
    Index(None, "node", "checked_at"),
)


@dataclass(frozen=True)
class SweepRow:
    id: int
    state: str
    partition: str
    share: float
    host: str
    pid: int
    message: str
    started_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None


@dataclass(frozen=True)
class SweepNode:
    id: int
    sweep_id: int
    node: str
    position: int
    partitions: tuple[str, ...]
    state: str
    reservation: str
    risk: Mapping[str, Any]
    status: str
    findings: Sequence[Mapping[str, Any]]
    message: str
    episode_id: int | None
    taken_at: dt.datetime | None
    checked_at: dt.datetime | None
    returned_at: dt.datetime | None
    seconds: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "position": self.position,
            "partitions": list(self.partitions),
            "state": self.state,
            "status": self.status,
            "message": self.message,
            "episode_id": self.episode_id,
            "risk": dict(self.risk),
            "reservation": self.reservation,
            "taken_at": _iso(self.taken_at),
            "checked_at": _iso(self.checked_at),
            "returned_at": _iso(self.returned_at),
            "seconds": self.seconds,
        }


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def _utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    assert isinstance(value, dt.datetime)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


class SweepBusy(RuntimeError):
    """Another sweep holds the lock."""


@dataclass
class SweepStore:
    store: Store

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """One sweep at a time, fleet-wide; never waits: a second sweep raises SweepBusy.
        The lock dies with its holder (a lock file next to SQLite, a session-level advisory
        lock on PostgreSQL), so a killed sweep never blocks the next."""
        if self.store.backend == "sqlite":
            database = self.store.engine.url.database
            if not database or database == ":memory:":
                yield
                return
            with Path(database + ".sweep.lock").open("a") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise SweepBusy(self._holder()) from None
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
            return
        with self.store.engine.connect() as conn:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": SWEEP_LOCK_KEY})
            if not got.scalar():
                conn.rollback()
                raise SweepBusy(self._holder())
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": SWEEP_LOCK_KEY})
                conn.commit()

    def _holder(self) -> str:
        active = self.active()
        if active is None:
            return "another sweep is starting"
        return f"sweep {active.id} is running (pid {active.pid} on {active.host})"

    def create(self, partition: str, share: float, plan: Sequence[tuple[Candidate, Risk]]) -> int:
        now = self.now()
        with writer(self.store.engine).begin() as conn:
            result = conn.execute(
                insert(sweeps).values(
                    state=RUNNING,
                    partition=partition,
                    share=share,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    message="",
                    started_at=now,
                    updated_at=now,
                    finished_at=None,
                )
            )
            key = result.inserted_primary_key
            assert key is not None
            sweep_id = int(key[0])
            for position, (candidate, score) in enumerate(plan):
                conn.execute(
                    insert(sweep_nodes).values(
                        sweep_id=sweep_id,
                        node=candidate.node,
                        position=position,
                        partitions=list(candidate.partitions),
                        state=PLANNED,
                        reservation=reservation_name(sweep_id, candidate.node),
                        risk={**score.to_json(), "correctable": candidate.correctable},
                        status="",
                        findings=[],
                        message="",
                        episode_id=None,
                    )
                )
        return sweep_id

    def adopt(self, sweep_id: int) -> None:
        """A resumed sweep: this process runs it now."""
        with writer(self.store.engine).begin() as conn:
            conn.execute(
                update(sweeps)
                .where(sweeps.c.id == sweep_id)
                .values(host=socket.gethostname(), pid=os.getpid(), updated_at=self.now())
            )

    def finish(self, sweep_id: int, message: str) -> None:
        now = self.now()
        with writer(self.store.engine).begin() as conn:
            conn.execute(
                update(sweeps)
                .where(sweeps.c.id == sweep_id)
                .values(state=DONE, message=message, updated_at=now, finished_at=now)
            )

    def set_node(self, row_id: int, **values: Any) -> None:
        with writer(self.store.engine).begin() as conn:
            conn.execute(update(sweep_nodes).where(sweep_nodes.c.id == row_id).values(**values))

    def active(self) -> SweepRow | None:
        query = select(sweeps).where(sweeps.c.state == RUNNING).order_by(sweeps.c.id)
        with self.store.engine.connect() as conn:
            row = conn.execute(query).first()
        return _sweep(row._mapping) if row is not None else None

    def get(self, sweep_id: int) -> SweepRow | None:
        with self.store.engine.connect() as conn:
            row = conn.execute(select(sweeps).where(sweeps.c.id == sweep_id)).first()
        return _sweep(row._mapping) if row is not None else None

    def latest(self) -> SweepRow | None:
        with self.store.engine.connect() as conn:
            row = conn.execute(select(sweeps).order_by(sweeps.c.id.desc())).first()
        return _sweep(row._mapping) if row is not None else None

    def nodes(self, sweep_id: int) -> list[SweepNode]:
        query = (
            select(sweep_nodes)
            .where(sweep_nodes.c.sweep_id == sweep_id)
            .order_by(sweep_nodes.c.position)
        )
        with self.store.engine.connect() as conn:
            return [_sweep_node(r._mapping) for r in conn.execute(query)]

    def history(self) -> dict[str, SweepNode]:
        """Each node's most recent sweep verdict (its last deep check by a sweep)."""
        query = (
            select(sweep_nodes)
            .where(sweep_nodes.c.checked_at.is_not(None))
            .order_by(sweep_nodes.c.checked_at)
        )
        with self.store.engine.connect() as conn:
            return {r.node: _sweep_node(r._mapping) for r in conn.execute(query)}


def _sweep(m: Mapping[Any, Any]) -> SweepRow:
    started, updated = _utc(m["started_at"]), _utc(m["updated_at"])
    assert started is not None and updated is not None
    return SweepRow(
        id=int(m["id"]),
        state=m["state"],
        partition=m["partition"],
        share=float(m["share"]),
        host=m["host"],
        pid=int(m["pid"]),
        message=m["message"],
        started_at=started,
        updated_at=updated,
        finished_at=_utc(m["finished_at"]),
    )


def _sweep_node(m: Mapping[Any, Any]) -> SweepNode:
    return SweepNode(
        id=int(m["id"]),
        sweep_id=int(m["sweep_id"]),
        node=m["node"],
        position=int(m["position"]),
        partitions=tuple(m["partitions"] or ()),
        state=m["state"],
        reservation=m["reservation"],
        risk=dict(m["risk"] or {}),
        status=m["status"],
        findings=list(m["findings"] or []),
        message=m["message"],
        episode_id=m["episode_id"],
        taken_at=_utc(m["taken_at"]),
        checked_at=_utc(m["checked_at"]),
        returned_at=_utc(m["returned_at"]),
        seconds=m["seconds"],
    )

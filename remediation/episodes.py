"""Persistence of the ladder: episodes (one per node at a time), their steps, and the global
pause switch, in the shared store (schema version 2).

Intent before action: a step row is written with state "intent" before its command runs and
updated after, so a daemon killed in between finds the intent on restart and decides from
facts (the boot id, Slurm's reboot flags) whether the action happened, instead of repeating
it blindly.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from medic_core.store import Store
from medic_core.store.engine import writer
from remediation.episode_types import (
    ACTING,
    CLOSED,
    CLOSED_STATES,
    DRAINING_STATES,
    NEEDS_HUMAN,
    OPEN_STATES,
    PAUSED,
    REBOOTING,
    RESOLVED,
    RMA,
    VERIFYING,
    WAITING_CAP,
    WAITING_IDLE,
    Control,
    Episode,
    Step,
    _utc,
)

ADMISSION_LOCK_KEY = 0x4D45444941  # "MEDIA": the PostgreSQL advisory lock for admission
METADATA = MetaData()  # the newest schema of these tables, as the migrations make it
_ident = BigInteger().with_variant(Integer(), "sqlite")
_data = JSON().with_variant(JSONB(), "postgresql")
_when = DateTime(timezone=True)

episodes = Table(
    "remediation_episodes",
    METADATA,
    Column("id", _ident, primary_key=True, autoincrement=True),
    Column("node", String(255), nullable=False),
    Column("state", String(32), nullable=False),
    Column("fault_class", String(128), nullable=False),
    Column("target", String(255), nullable=False),
    Column("check_name", String(128), nullable=False),
    Column("recommendation", String(64), nullable=False),
    Column("first_rung", Integer, nullable=False),
    Column("rung", Integer, nullable=False),
    Column("attempts", _data, nullable=False),
    Column("message", Text, nullable=False),
    Column("evidence", _data, nullable=False),
    Column("failed_requalifications", Integer, nullable=False),
    Column("ticket_id", BigInteger, nullable=True),
    Column("opened_at", _when, nullable=False),
    Column("updated_at", _when, nullable=False),
    Column("closed_at", _when, nullable=True),
)
steps = Table(
    "remediation_steps",
    METADATA,
    Column("id", _ident, primary_key=True, autoincrement=True),
    Column("episode_id", _ident, nullable=False),
    Column("rung", Integer, nullable=False),
    Column("action", String(64), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("argv", _data, nullable=False),
    Column("returncode", Integer, nullable=True),
    Column("output", Text, nullable=False),
    Column("boot_id", String(64), nullable=False),
    Column("started_at", _when, nullable=False),
    Column("ended_at", _when, nullable=True),
)
control = Table(
    "remediation_control",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("paused", Boolean, nullable=False),
    Column("reason", Text, nullable=False),
    Column("actor", String(255), nullable=False),
    Column("since", _when, nullable=False),
)


@dataclass
class EpisodeStore:
    store: Store
    clock: Any = field(default=None)

    @property
    def _writes(self) -> Any:
        """BEGIN IMMEDIATE on SQLite, so concurrent daemons queue instead of failing."""
        return writer(self.store.engine)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One admission at a time across the fleet: every daemon's count-then-insert runs
        under this lock (a lock file next to a SQLite database, a transaction-scoped
        advisory lock on PostgreSQL)."""
        if self.store.backend == "sqlite":
            database = self.store.engine.url.database
            path = Path(database + ".admission.lock") if database else None
            if path is None:
                yield
                return
            with path.open("a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
            return
        with self.store.engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADMISSION_LOCK_KEY})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADMISSION_LOCK_KEY})
                conn.commit()

    def now(self) -> dt.datetime:
        return self.clock() if self.clock else dt.datetime.now(dt.UTC)

    # -- episodes ------------------------------------------------------------------------

    def open_episode(
        self,
        node: str,
        *,
        state: str,
        fault_class: str,
        target: str,
        check: str,
        recommendation: str,
        rung: int,
        message: str,
        evidence: Mapping[str, Any],
    ) -> Episode:
        now = self.now()
        with self._writes.begin() as conn:
            result = conn.execute(
                insert(episodes).values(
                    node=node,
                    state=state,
                    fault_class=fault_class,
                    target=target,
                    check_name=check,
                    recommendation=recommendation,
                    first_rung=rung,
                    rung=rung,
                    attempts={},
                    message=message[:2000],
                    evidence=dict(evidence),
                    failed_requalifications=0,
                    ticket_id=None,
                    opened_at=now,
                    updated_at=now,
                    closed_at=None,
                )
            )
            episode_id = int(result.inserted_primary_key[0])
        found = self.get(episode_id)
        assert found is not None
        return found

    def update(self, episode_id: int, **values: Any) -> Episode:
        values["updated_at"] = self.now()
        if values.get("state") in CLOSED_STATES:
            values["closed_at"] = values["updated_at"]
        with self._writes.begin() as conn:
            conn.execute(update(episodes).where(episodes.c.id == episode_id).values(**values))
        found = self.get(episode_id)
        assert found is not None
        return found

    def get(self, episode_id: int) -> Episode | None:
        with self.store.engine.connect() as conn:
            row = conn.execute(select(episodes).where(episodes.c.id == episode_id)).first()
        return _episode(row._mapping) if row is not None else None

    def open_for(self, node: str) -> Episode | None:
        with self.store.engine.connect() as conn:
            return read_open_episode(conn, node)

    def find(
        self,
        node: str | None = None,
        states: Sequence[str] | None = None,
        since: dt.datetime | None = None,
    ) -> list[Episode]:
        query = select(episodes).order_by(episodes.c.id)
        if node is not None:
            query = query.where(episodes.c.node == node)
        if states is not None:
            query = query.where(episodes.c.state.in_(list(states)))
        if since is not None:
            query = query.where(episodes.c.opened_at >= since)
        with self.store.engine.connect() as conn:
            return [_episode(r._mapping) for r in conn.execute(query)]

    # -- steps ---------------------------------------------------------------------------

    def record_intent(
        self, episode: Episode, rung: int, action: str, argv: Sequence[str], boot_id: str
    ) -> Step:
        attempt = episode.attempts_at(rung) + 1
        attempts = {**episode.attempts, str(rung): attempt}
        now = self.now()
        with self._writes.begin() as conn:  # the attempt counts from the intent on
            result = conn.execute(
                insert(steps).values(
                    episode_id=episode.id,
                    rung=rung,
                    action=action,
                    attempt=attempt,
                    state="intent",
                    argv=list(argv),
                    returncode=None,
                    output="",
                    boot_id=boot_id,
                    started_at=now,
                    ended_at=None,
                )
            )
            conn.execute(
                update(episodes)
                .where(episodes.c.id == episode.id)
                .values(attempts=attempts, rung=rung, state=ACTING, updated_at=now)
            )
            step_id = int(result.inserted_primary_key[0])
        return next(s for s in self.steps(episode.id) if s.id == step_id)

    def finish_step(
        self, step_id: int, state: str, returncode: int | None = None, output: str = ""
    ) -> None:
        with self._writes.begin() as conn:
            conn.execute(
                update(steps)
                .where(steps.c.id == step_id)
                .values(
                    state=state, returncode=returncode, output=output[-4000:], ended_at=self.now()
                )
            )

    def steps(self, episode_id: int) -> list[Step]:
        query = select(steps).where(steps.c.episode_id == episode_id).order_by(steps.c.id)
        with self.store.engine.connect() as conn:
            return [_step(r._mapping) for r in conn.execute(query)]

    # -- the pause switch ----------------------------------------------------------------

    def control(self) -> Control:
        with self.store.engine.connect() as conn:
            row = conn.execute(select(control).where(control.c.id == 1)).first()
        if row is None:
            return Control(paused=False)
        m = row._mapping
        return Control(bool(m["paused"]), m["reason"], m["actor"], _utc(m["since"]))

    def set_paused(self, paused: bool, reason: str, actor: str) -> Control:
        values = {"paused": paused, "reason": reason, "actor": actor, "since": self.now()}
        with self._writes.begin() as conn:
            done = conn.execute(update(control).where(control.c.id == 1).values(**values))
            if done.rowcount == 0:
                conn.execute(insert(control).values(id=1, **values))
        return self.control()

    # -- a human closes or retries an episode (`medic episode close|retry`) ---------------

    def close_by_human(self, episode_id: int, actor: str, reason: str) -> Episode:
        """Close the episode for good (state `closed`), recording who and why in its message
        and evidence. Only if its state is still the one read: an episode the ladder moved in
        between raises EpisodeChanged. Resolved and already-closed episodes raise
        EpisodeRefused. Slurm is not touched: the node stays as it is."""
        with self.locked():
            episode = self._get_or_refuse(episode_id)
            if episode.state in (RESOLVED, CLOSED):
                by = (
                    episode.evidence.get("closed_by", {}).get("actor")
                    if episode.state == CLOSED
                    else ""
                )
                raise EpisodeRefused(
                    f"episode {episode.id} is already {episode.state}"
                    + (f" (by {by})" if by else "")
                )
            now = self.now()
            record = {"actor": actor, "reason": reason, "at": now.isoformat(),
                      "from_state": episode.state}  # fmt: skip
            return self._move(
                episode,
                state=CLOSED,
                message=f"{episode.message}; closed by {actor}: {reason}"[-2000:],
                evidence={**episode.evidence, "closed_by": record},
            )

    def retry_by_human(
        self,
        episode_id: int,
        actor: str,
        reason: str,
        prepare: Callable[[Episode], None] | None = None,
    ) -> Episode:
        """Send the episode back to waiting_idle at its current rung with that rung's attempts
        reset, so the ladder tries again. Refuses (EpisodeRefused) a resolved episode, one the
        ladder is still working on, one without a rung, and one whose node has another open
        episode (`retry_refusal`). `prepare` (the CLI: RMA ticket check, Medic's drain) runs
        after those checks, under the admission lock, before the write; if it raises, nothing
        changes."""
        with self.locked():
            episode = self._get_or_refuse(episode_id)
            refusal = self.retry_refusal(episode)
            if refusal:
                raise EpisodeRefused(refusal)
            if prepare is not None:
                prepare(episode)
            attempts = {k: v for k, v in episode.attempts.items() if k != str(episode.rung)}
            record = {"actor": actor, "reason": reason, "at": self.now().isoformat(),
                      "from_state": episode.state, "rung": episode.rung,
                      "attempts_before": episode.attempts_at(episode.rung)}  # fmt: skip
            retries = [*episode.evidence.get("retries", ()), record]
            return self._move(
                episode,
                state=WAITING_IDLE,
                attempts=attempts,
                closed_at=None,
                message=f"{episode.message}; retried by {actor}: {reason}"[-2000:],
                evidence={**episode.evidence, "retries": retries},
            )

    def retry_refusal(self, episode: Episode) -> str:
        """Why `episode` cannot be retried now ("" when it can): the store's side only."""
        if episode.state == RESOLVED:
            return f"episode {episode.id} is resolved: the node was repaired"
        if episode.state not in (NEEDS_HUMAN, PAUSED, RMA, CLOSED):
            return f"episode {episode.id} is {episode.state}: the ladder is working on it"
        if episode.rung not in (1, 2, 3, 4):
            return f"episode {episode.id} has no ladder rung ({episode.recommendation!r})"
        other = self.open_for(episode.node)
        if other is not None and other.id != episode.id:
            return f"episode {other.id} ({other.state}) is open on {episode.node}"
        return ""

    def _get_or_refuse(self, episode_id: int) -> Episode:
        episode = self.get(episode_id)
        if episode is None:
            raise EpisodeRefused(f"no episode {episode_id}")
        return episode

    def _move(self, episode: Episode, **values: Any) -> Episode:
        """Update `episode` only if its state is still the one read (compare and set)."""
        values["updated_at"] = self.now()
        if values.get("state") in CLOSED_STATES:
            values["closed_at"] = values["updated_at"]
        with self._writes.begin() as conn:
            done = conn.execute(
                update(episodes)
                .where(episodes.c.id == episode.id, episodes.c.state == episode.state)
                .values(**values)
            )
        if done.rowcount != 1:
            raise EpisodeChanged(f"episode {episode.id} changed while you looked; try again")
        found = self.get(episode.id)
        assert found is not None
        return found


class EpisodeRefused(ValueError):
    """A human's close or retry that the episode's state does not allow."""


class EpisodeChanged(EpisodeRefused):
    """The ladder moved the episode between the read and the write."""


# Built once: the ladder asks at every tick and the launch gate after job starts.
_OPEN_FOR = (
    select(episodes)
    .where(episodes.c.node == bindparam("node"), episodes.c.state.in_(OPEN_STATES))
    .order_by(episodes.c.id.desc())
    .limit(1)
)


def read_open_episode(conn: Connection, node: str) -> Episode | None:
    """`node`'s open episode (the newest, should there be two), on `conn`."""
    row = conn.execute(_OPEN_FOR, {"node": node}).first()
    return _episode(row._mapping) if row is not None else None


def _episode(m: Mapping[Any, Any]) -> Episode:
    opened = _utc(m["opened_at"])
    updated = _utc(m["updated_at"])
    assert opened is not None and updated is not None
    return Episode(
        id=int(m["id"]),
        node=m["node"],
        state=m["state"],
        fault_class=m["fault_class"],
        target=m["target"],
        check=m["check_name"],
        recommendation=m["recommendation"],
        first_rung=int(m["first_rung"]),
        rung=int(m["rung"]),
        attempts=dict(m["attempts"] or {}),
        message=m["message"],
        evidence=dict(m["evidence"] or {}),
        failed_requalifications=int(m["failed_requalifications"]),
        ticket_id=m["ticket_id"],
        opened_at=opened,
        updated_at=updated,
        closed_at=_utc(m["closed_at"]),
    )


def _step(m: Mapping[Any, Any]) -> Step:
    started = _utc(m["started_at"])
    assert started is not None
    return Step(
        id=int(m["id"]),
        episode_id=int(m["episode_id"]),
        rung=int(m["rung"]),
        action=m["action"],
        attempt=int(m["attempt"]),
        state=m["state"],
        argv=tuple(m["argv"] or ()),
        returncode=m["returncode"],
        output=m["output"],
        boot_id=m["boot_id"],
        started_at=started,
        ended_at=_utc(m["ended_at"]),
    )


# Defined in remediation.episode_types (no SQLAlchemy there) and re-exported: every user of
# the ladder's episodes keeps importing them from here.
__all__ = [
    "ACTING",
    "CLOSED",
    "CLOSED_STATES",
    "DRAINING_STATES",
    "NEEDS_HUMAN",
    "OPEN_STATES",
    "PAUSED",
    "REBOOTING",
    "RESOLVED",
    "RMA",
    "VERIFYING",
    "WAITING_CAP",
    "WAITING_IDLE",
    "Control",
    "Episode",
    "EpisodeStore",
    "Step",
]

"""The store read through the database driver alone, for the CLI's read-only listings.

`medic nodes` and `medic rma list` are run by people who wait for them. Through the store
proper they pay for SQLAlchemy's import (its core, its ORM, Medic's models and migrations:
~0.4 s of a ~0.3 s budget) before asking anything. Here they ask sqlite3 (the standard
library) or psycopg directly, with SQL written for both.

`open_reader(url)` takes only the plain case: a URL it parses without doubt, a SQLite file
that exists with the modes Medic gives it, a database whose schema version is exactly the
one this Medic knows (SCHEMA_VERSION, checked equal to len(MIGRATIONS) by the tests). For
anything else it returns None and the caller opens the store as every command does
(creating, migrating, refusing a newer schema with one line, or explaining a bad URL);
nothing is migrated or created here, and nothing is written (SQLite: query_only;
PostgreSQL: a read-only session).

Imports nothing but the standard library (psycopg when the URL is PostgreSQL's):
tests/test_cli_startup.py fails when SQLAlchemy enters this path.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sqlite3
import stat
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from medic_core.config import MedicConfig

# The newest schema version this Medic knows: len(medic_core.store.migrations.MIGRATIONS).
SCHEMA_VERSION = 8
STORE_KEYS = ("url", "event_retention_days", "pool", "pool_size")  # as store_settings'
POOLS = ("queue", "null")
MAX_POOL_SIZE = 50
MAX_RETENTION_DAYS = 36500  # as store_settings'
SQLITE_BUSY_TIMEOUT_MS = 10_000  # as the store's (medic_core.store.engine)
PG_CONNECT_TIMEOUT_S = 10
_PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgres+psycopg")
_SQLITE_PREFIXES = ("sqlite:///", "sqlite+pysqlite:///")
_SIDE_FILES = ("", "-wal", "-shm", "-journal")


class Unreachable(RuntimeError):
    """The PostgreSQL server did not take the connection: the first line of its error. Not
    left to the store proper, which would wait for the same server a second time."""


def default_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'medic.db'}"


def configured_url(table: Mapping[str, Any], state_dir: Path) -> str | None:
    """`[store] url` when the whole table is one medic_core.store.store_settings accepts
    without a word; None when it might not (the caller then reads it through that)."""
    if not isinstance(table, Mapping) or any(key not in STORE_KEYS for key in table):
        return None
    days = table.get("event_retention_days", 1)
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_RETENTION_DAYS:
        return None
    if table.get("pool", POOLS[0]) not in POOLS:
        return None
    size = table.get("pool_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_POOL_SIZE:
        return None
    url = table.get("url", default_url(state_dir))
    return url if isinstance(url, str) else None


_PLAIN_PART = re.compile(r"[A-Za-z0-9._-]+")
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/-]+")  # no ":memory:", no "file:" URI, no quoting


def shown_plain_url(url: str) -> str | None:
    """`url` as the store shows it (its password hidden, as SQLAlchemy renders it) when it
    is one the store accepts beyond doubt: a SQLite file path, or a PostgreSQL URL with
    plain user, host, port and database and no query. None when in doubt: the caller then
    asks the store proper (SQLAlchemy's parser), which explains what is wrong.
    tests/test_store_reader.py checks both answers agree on generated URLs."""
    if url != url.strip() or not url.isprintable():
        return None
    if url.startswith(_SQLITE_PREFIXES):
        path = url.split(":///", 1)[1]
        return url if _PLAIN_PATH.fullmatch(path) else None
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _PG_SCHEMES:
        return None
    netloc, slash, database = rest.partition("/")
    if not slash or not _PLAIN_PART.fullmatch(database):
        return None
    userinfo, at, hostport = netloc.rpartition("@")
    host, colon, port = hostport.partition(":")
    if (host and not _PLAIN_PART.fullmatch(host)) or (colon and not port.isdigit()):
        return None
    if colon and not (port.isascii() and 0 < int(port) < 65536):
        return None
    user, has_password, password = userinfo.partition(":")
    if at and not _PLAIN_PART.fullmatch(user):
        return None
    if has_password and not _PLAIN_PART.fullmatch(password):
        return None
    shown_user = f"{user}:***@" if has_password else (f"{user}@" if at else "")
    return f"{scheme}://{shown_user}{hostport}/{database}"


def checked_store_url(config: MedicConfig) -> str:
    """`[store]` checked exactly as medic_core.store.store_settings checks it (it raises the
    same ConfigError), its URL returned as shown (password hidden). A plain table is judged
    here; anything else by store_settings and SQLAlchemy's parser (~0.3 s of imports)."""
    url = configured_url(config.table("store"), config.paths.state_dir)
    shown = shown_plain_url(url) if url is not None else None
    if shown is not None:
        return shown
    from sqlalchemy import make_url

    from medic_core.store import store_settings

    return make_url(store_settings(config).url).render_as_string(hide_password=True)


class Reader:
    """One read-only connection; `rows()` takes SQL with `?` placeholders on both backends."""

    def __init__(self, conn: Any, backend: str, *, owned: bool = True) -> None:
        self.conn = conn
        self.backend = backend
        self._owned = owned

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.backend == "postgresql":
            sql = sql.replace("?", "%s")
        cursor = self.conn.execute(sql, tuple(params))
        try:
            return list(cursor.fetchall())
        finally:
            cursor.close()

    def data(self, value: Any) -> Any:
        """A JSON column's value: text on SQLite, decoded already by psycopg."""
        if self.backend == "sqlite" and isinstance(value, (str, bytes)):
            return json.loads(value)
        return value

    @staticmethod
    def when(value: Any) -> dt.datetime | None:
        """A UTCDateTime column's value as the store returns it: aware, in UTC."""
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        assert isinstance(value, dt.datetime)
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)

    def close(self) -> None:
        if self._owned:
            try:
                self.conn.rollback()
            finally:
                self.conn.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def reader_of(store: Any) -> Iterator[Reader]:
    """A Reader over a connection of an open medic_core.store.Store (its engine's pool)."""
    raw = store.engine.raw_connection()
    try:
        yield Reader(raw.driver_connection, store.backend, owned=False)
    finally:
        raw.close()


def placeholders(values: Sequence[Any]) -> str:
    """`?, ?, ?` for an IN list."""
    return ", ".join("?" for _ in values)


def open_reader(url: str) -> Reader | None:
    """A read-only connection to the store at `url` when its schema is SCHEMA_VERSION;
    None when anything is not plain (see the module's doc)."""
    url = url.strip()
    try:
        if url.startswith(_SQLITE_PREFIXES):
            reader = _sqlite(url.split(":///", 1)[1])
        elif url.split("://", 1)[0] in _PG_SCHEMES:
            reader = _postgresql(url)
        else:
            return None
    except Unreachable:
        raise
    except Exception:  # any doubt: the store proper says what is wrong
        return None
    if reader is None:
        return None
    try:
        [(version,)] = reader.rows("SELECT max(version) FROM schema_version")
    except Exception:  # no schema_version: a store never migrated
        reader.close()
        return None
    if version != SCHEMA_VERSION:
        reader.close()
        return None
    return reader


def _sqlite(path: str) -> Reader | None:
    if not path or path == ":memory:" or path.startswith("file:") or "?" in path or "%" in path:
        return None
    for suffix in _SIDE_FILES:  # as medic_core.store.engine leaves them: regular, 0600
        try:
            st = os.lstat(f"{path}{suffix}")
        except FileNotFoundError:
            if not suffix:
                return None  # never create a database
            continue
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) & 0o077:
            return None
    conn = sqlite3.connect(
        f"file:{quote(path)}?mode=rw", uri=True, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA query_only = ON")
        conn.execute("BEGIN")  # one snapshot for every query of the listing
    except BaseException:
        conn.close()
        raise
    return Reader(conn, "sqlite")


def _postgresql(url: str) -> Reader | None:
    parts = urlsplit(url)
    netloc_host = parts.netloc.rpartition("@")[2]
    if "," in netloc_host or parts.fragment:
        return None
    database = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if not database or "/" in database:
        return None
    query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    options = dict(query)
    if len(options) != len(query) or {"dbname", "user", "password", "port"} & set(options):
        return None
    import psycopg  # only for PostgreSQL: ~0.1 s

    kwargs: dict[str, Any] = {
        "dbname": database,
        "user": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password is not None else None,
        "port": parts.port,
        "connect_timeout": PG_CONNECT_TIMEOUT_S,
    }
    if parts.hostname:
        kwargs["host"] = parts.hostname
    kwargs.update(options)
    try:
        conn = psycopg.connect(**{k: v for k, v in kwargs.items() if v is not None})
    except psycopg.OperationalError as exc:
        raise Unreachable(str(exc).strip().splitlines()[0] if str(exc).strip() else "") from exc
    conn.read_only = True
    conn.prepare_threshold = None  # one query each: nothing to gain, and pgbouncer-safe
    return Reader(conn, "postgresql")


__all__ = [
    "SCHEMA_VERSION",
    "STORE_KEYS",
    "Reader",
    "Unreachable",
    "checked_store_url",
    "configured_url",
    "default_url",
    "open_reader",
    "placeholders",
    "reader_of",
    "shown_plain_url",
]

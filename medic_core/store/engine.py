"""Store URLs and engines: which databases Medic accepts and how each connection is set up.

SQLite (one node, the default) and PostgreSQL through psycopg 3 (a fleet). SQLite connections
get WAL, a busy timeout, foreign keys and synchronous=NORMAL on every connect, and take
transactions into their own hands (pysqlite's implicit BEGIN is turned off) so that writes
can start with BEGIN IMMEDIATE: a writer takes the lock up front and waits for it under the
busy timeout, instead of failing at its first write after reading under a shared lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

log = logging.getLogger("medic.store")

SQLITE_BUSY_TIMEOUT_MS = 10_000
PG_CONNECT_TIMEOUT_S = 10

# Execution option read by the SQLite "begin" listener: "IMMEDIATE" for write transactions.
SQLITE_BEGIN_OPTION = "medic_sqlite_begin"

URL_FIX = "use sqlite:////absolute/path/medic.db or postgresql+psycopg://user:password@host/db"


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message says why and what to do, on one line."""


class BadStoreURL(ValueError):
    def __init__(self, problem: str, fix: str = URL_FIX) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


def parse_url(url: str | URL) -> URL:
    """Check a store URL and normalise it: a bare `postgresql://` means psycopg 3, the only
    PostgreSQL driver Medic depends on. Raises BadStoreURL."""
    if isinstance(url, str):
        if not url.strip():
            raise BadStoreURL("empty URL")
        try:
            parsed = make_url(url.strip())
        except (ArgumentError, ValueError):  # ValueError: a port that is not a number
            raise BadStoreURL(f"not a database URL: {url!r}") from None
    else:
        parsed = url
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise BadStoreURL(f"unsupported SQLite driver {driver!r}", "use sqlite:////path")
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file:"):
            raise BadStoreURL(
                "in-memory or URI-style SQLite is not supported (each connection would see "
                "its own database)",
                "give a file path: sqlite:////var/lib/medic/medic.db",
            )
        return parsed.set(drivername="sqlite+pysqlite")
    if backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg"):
            raise BadStoreURL(
                f"unsupported PostgreSQL driver {driver!r}", "use postgresql+psycopg://..."
            )
        if not parsed.database:
            raise BadStoreURL("no database name in the URL", "end it with /DATABASE")
        return parsed.set(drivername="postgresql+psycopg")
    raise BadStoreURL(f"unsupported database {backend!r}")


def describe(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _enable_wal(cursor: sqlite3.Cursor) -> None:
    """Switch the database to WAL (a persistent setting: a no-op once done).

    The switch needs an exclusive lock, and SQLite reports "database is locked" at once,
    without its busy handler, when another connection holds the file: two processes opening a
    new database together collide here. Retry until the busy timeout has passed."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            mode = str(cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)  # poll the lock; bounded by the deadline
    if mode != "wal":
        raise StoreError(
            f"SQLite could not switch to WAL journal mode (it stays in {mode!r}); "
            "put the database on a local filesystem"
        )


def _sqlite_connect(dbapi_connection: Any, connection_record: Any) -> None:
    # Turn off pysqlite's own transaction handling; the "begin" listener emits BEGIN.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        _enable_wal(cursor)
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "")
    conn.exec_driver_sql("BEGIN IMMEDIATE" if mode == "IMMEDIATE" else "BEGIN")


# The store holds RMA tickets, events and evidence: root only. Every reader and writer is
# root (the daemon, the CLI, and the hooks under SlurmdUser=root), so no group is needed.
SQLITE_DIR_MODE = 0o700
SQLITE_FILE_MODE = 0o600
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def _private_sqlite_file(path: Path) -> None:
    """Create `path` empty with mode 0600 before SQLite opens it (SQLite would create it
    0644, and gives its -wal and -shm the database file's mode), and tighten an existing
    database and side files to 0600. Never follows a symlink or opens a FIFO.

    Never through a file descriptor open for reading or writing: closing one releases every
    POSIX lock this process holds on the file, SQLite's included, so a second store opened
    in a process that has one open (the CLI's in a test, say) would take the first one's
    locks away; another process would then take itself for the first connection, rebuild
    the WAL index under it, and the first would read a stale snapshot for ever. The file is
    created with mknod and inspected through an O_PATH descriptor, whose close releases no
    lock."""
    for name, create in ((path, True), *((Path(f"{path}{s}"), False) for s in SQLITE_SIDE_FILES)):
        if create:
            with contextlib.suppress(FileExistsError):  # a symlink at the name exists too
                os.mknod(name, stat.S_IFREG | SQLITE_FILE_MODE)
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"store {name}: not a regular file; remove it or move the store")
            if stat.S_IMODE(st.st_mode) & 0o077:
                try:  # fchmod refuses an O_PATH descriptor; its /proc name does not
                    os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) & ~0o077)
                except OSError as exc:  # a read-only filesystem: readable is all we need
                    log.warning("store %s: mode %o kept: %s", name, st.st_mode & 0o777, exc)
        finally:
            os.close(fd)


def _closed(directory: Path) -> bool:
    """`directory` exists but this user may not look inside it."""
    try:
        directory.stat()
    except PermissionError:
        return True
    except OSError:
        return False
    return not os.access(directory, os.X_OK)


POOLS = ("queue", "null")
DEFAULT_POOL = "queue"
DEFAULT_POOL_SIZE = 5


def make_engine(url: URL, pool: str = DEFAULT_POOL, pool_size: int = DEFAULT_POOL_SIZE) -> Engine:
    """An engine for a URL that `parse_url` accepted. A SQLite database is created 0600 in a
    directory Medic creates 0700; an existing directory keeps its mode.

    PostgreSQL: `pool` "queue" keeps up to `pool_size` idle connections (SQLAlchemy's
    QueuePool; each is a server backend while idle); "null" opens a connection per
    transaction and keeps none, for a pooler in transaction mode (pgbouncer) in front of the
    server; psycopg's server-side prepared statements are then off (a transaction-mode
    pooler cannot keep them). SQLite ignores both."""
    if url.get_backend_name() == "sqlite":
        assert url.database
        path = Path(url.database)
        try:
            path.parent.mkdir(mode=SQLITE_DIR_MODE, parents=True, exist_ok=True)
            _private_sqlite_file(path)
        except PermissionError as exc:
            theirs = _closed(path.parent) or (
                path.exists() and not os.access(path, os.R_OK | os.W_OK)
            )
            if os.geteuid() == 0 or not theirs:
                raise StoreError(
                    f"store {describe(url)}: cannot create {path.parent} or {path.name} there:"
                    f" {exc.strerror}; create it or point [store] url elsewhere"
                ) from exc
            # The node's store is root's only (0600 in a 0700 directory): `medic` run by a
            # user would otherwise hear "cannot create" about a store that is there.
            raise StoreError(
                f"store {describe(url)}: permission denied for uid {os.geteuid()}: the store is"
                " root's only; run medic as root (sudo medic ...)"
            ) from exc
        except OSError as exc:
            raise StoreError(
                f"store {describe(url)}: cannot create {path.parent} or {path.name} there:"
                f" {exc.strerror or exc}; create it or point [store] url elsewhere"
            ) from exc
        engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if pool == "null":
        return create_engine(
            url,
            poolclass=NullPool,
            connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S, "prepare_threshold": None},
        )
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=pool_size,
        connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S},
    )


def writer(engine: Engine) -> Engine:
    """The same engine, starting its transactions with BEGIN IMMEDIATE on SQLite."""
    return engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})

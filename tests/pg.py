"""A private PostgreSQL server for tests: Debian's binaries, a temporary data directory, a Unix
socket in that directory (no TCP port to collide on), trust authentication, fsync off.

Use it from any test module by importing the fixtures:

    from tests.pg import pg_server, pg_url  # noqa: F401  (pytest fixtures)

`pg_url` is a session-wide database URL (`postgresql+psycopg://postgres@/medic?host=...`);
`pg_server.create_database()` gives a fresh empty database for a test that needs one.

The server runs as the `postgres` OS user when the tests run as root (initdb refuses root),
as the current user otherwise. It starts once per test session and is stopped by PID at the
end. The binaries come from MEDIC_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin; when
there are none the tests fail with the fix (`apt-get install postgresql`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from medic_core.proc import run, spawn

BINDIR_ENV = "MEDIC_PG_BINDIR"
PG_USER = "postgres"
# A server zone far from UTC with a half-hour offset, so a store that leaks the session zone
# into its times fails its tests.
SERVER_TIMEZONE = "America/St_Johns"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


def find_bindir() -> Path | None:
    if os.environ.get(BINDIR_ENV):
        return Path(os.environ[BINDIR_ENV])
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return candidates[-1].parent if candidates else None


def _wait_for(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class PostgresServer:
    def __init__(self, bindir: Path, settings: dict[str, str] | None = None) -> None:
        self.bindir = bindir
        self.overrides = dict(settings or {})  # postgres -c settings (bench/fleet_store.py)
        # Outside pytest's tmp dir: that one is private to root, and the server's user must
        # reach the socket directory. Short, too: a socket path must fit in 107 bytes.
        self.base = Path(tempfile.mkdtemp(prefix="medic-pg-"))
        self.data = self.base / "data"
        self.socket_dir = self.base / "sock"
        self.log = self.base / "postgres.log"
        self._as_root = os.geteuid() == 0
        self._launcher_pid: int | None = None
        self._postmaster_pid: int | None = None
        self._names = itertools.count(1)
        self._server_args: list[str] = []

    def _argv(self, program: str, *args: str) -> list[str]:
        binary = str(self.bindir / program)
        if self._as_root:
            return ["runuser", "-u", PG_USER, "--", binary, *args]
        return [binary, *args]

    def _chown(self, path: Path) -> None:
        if self._as_root:
            user = pwd.getpwnam(PG_USER)
            os.chown(path, user.pw_uid, user.pw_gid)

    def start(self) -> None:
        if self._as_root:
            try:
                pwd.getpwnam(PG_USER)
            except KeyError:
                raise RuntimeError(
                    f"no {PG_USER!r} OS user to run PostgreSQL as; apt-get install postgresql"
                ) from None
        self._chown(self.base)
        self.socket_dir.mkdir()
        self._chown(self.socket_dir)
        initdb = run(
            self._argv(
                "initdb", "-D", str(self.data), "-U", PG_USER, "--auth=trust",
                "--no-locale", "--encoding=UTF8", "--no-sync",
            ),
            timeout=120,
        )  # fmt: skip
        if not initdb.ok:
            raise RuntimeError(f"initdb failed: {initdb.describe_failure()}\n{initdb.tail()}")
        settings = {
            "listen_addresses": "",
            "unix_socket_directories": str(self.socket_dir),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "timezone": SERVER_TIMEZONE,
            "max_connections": "100",
            **self.overrides,
        }
        args = ["-D", str(self.data)]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        self._server_args = args
        self._run_server()

    def _run_server(self) -> None:
        self._launcher_pid = spawn(self._argv("postgres", *self._server_args), log_path=self.log)
        try:
            _wait_for("PostgreSQL to accept connections", self._ready, START_TIMEOUT)
        except (TimeoutError, RuntimeError) as exc:
            raise RuntimeError(f"{exc}; server log:\n{self._log_tail()}") from None
        self._postmaster_pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def outage(self) -> None:
        """Stop the server and keep its data: clients get "connection refused" (no socket)
        until `back`. For tests of what Medic does while its store is down."""
        self._shut_down()

    def back(self) -> None:
        """Start the server again after `outage`, with every database as it was (nothing
        to do while it runs)."""
        if self._postmaster_pid is None:
            self._run_server()

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def _launcher_exited(self) -> bool:
        if self._launcher_pid is None:
            return True
        try:
            pid, _ = os.waitpid(self._launcher_pid, os.WNOHANG)
        except ChildProcessError:  # already reaped (by subprocess's own clean-up)
            return _gone(self._launcher_pid)
        return pid != 0

    def _ready(self) -> bool:
        if self._launcher_exited():
            raise RuntimeError("PostgreSQL exited during start-up")
        try:
            with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def dsn(self, database: str) -> str:
        return f"host={self.socket_dir} user={PG_USER} dbname={database}"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{PG_USER}@/{database}?host={self.socket_dir}"

    def create_database(self, prefix: str = "medic_test") -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        name = f"{prefix}_{next(self._names)}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)

    def stop(self) -> None:
        """Fast shutdown of the postmaster by PID (SIGINT), SIGKILL to the group if it does
        not go within STOP_TIMEOUT. Removes the data directory."""
        try:
            self._shut_down()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def _shut_down(self) -> None:
        pid = self._postmaster_pid
        if pid is None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int((self.data / "postmaster.pid").read_text().split()[0])
        if pid is not None and not _gone(pid):
            os.kill(pid, signal.SIGINT)
            try:
                _wait_for("PostgreSQL to shut down", lambda: _gone(pid), STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._postmaster_pid = None
        if self._launcher_pid is not None:
            if not self._launcher_exited():
                # The launcher (runuser) leads its own process group: end what is left.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._launcher_pid, signal.SIGKILL)
            _wait_for("the launcher to exit", self._launcher_exited, STOP_TIMEOUT)
            self._launcher_pid = None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    bindir = find_bindir()
    if bindir is None or not (bindir / "postgres").exists():
        pytest.fail(
            "no PostgreSQL server binaries (looked in /usr/lib/postgresql/*/bin and "
            f"${BINDIR_ENV}); apt-get install postgresql",
            pytrace=False,
        )
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_url(pg_server: PostgresServer) -> str:
    """A database on the private server, shared by the whole test session."""
    return pg_server.create_database("medic")

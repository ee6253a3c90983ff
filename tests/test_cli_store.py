"""`medic store status|migrate` on real SQLite and PostgreSQL stores: the first step of a
rolling upgrade (docs/store.md, "Upgrading a fleet")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Connection, text

from cli.store import store_group
from medic_core.store import MIGRATIONS, Compat, Migration, open_store
from medic_core.store.engine import make_engine, parse_url
from medic_core.store.migrations import migrate
from tests.pg import PostgresServer, pg_server  # noqa: F401  (pytest fixture)

LATEST = len(MIGRATIONS)


def run(*args: str) -> Result:
    return CliRunner().invoke(store_group, list(args), catch_exceptions=False)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'medic.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database()


def _migrate_to(url: str, migrations: tuple[Migration, ...]) -> None:
    engine = make_engine(parse_url(url))
    try:
        migrate(engine, migrations)
    finally:
        engine.dispose()


def test_status_shows_what_migrate_will_do_and_migrate_does_it(url: str) -> None:
    _migrate_to(url, MIGRATIONS[:4])  # the previous release's store
    before = run("status", "--store", url)
    assert before.exit_code == 0, before.output
    assert f"schema version:  4 (this Medic knows up to {LATEST})" in before.output
    assert "no record (before version 5)" in before.output
    assert "pending:         5 schema compatibility" in before.output
    assert f"`medic store migrate` applies {LATEST - 4} version(s)" in before.output

    done = run("migrate", "--store", url)
    assert done.exit_code == 0, done.output
    assert f"schema version 4 -> {LATEST}" in done.output
    assert "serves: Medic that knows version 1 or later" in done.output
    again = run("migrate", "--store", url)
    assert f"schema version {LATEST}, nothing to do" in again.output

    after = json.loads(run("status", "--json", "--store", url).output)
    assert after == {"version": LATEST, "known": LATEST, "min_compatible": 1,
                     "admitted": True, "pending": []}  # fmt: skip


def _breaking(conn: Connection) -> None:
    conn.execute(text("ALTER TABLE events RENAME COLUMN message TO text"))


def _additive(conn: Connection) -> None:
    conn.execute(text("CREATE TABLE later (id INTEGER PRIMARY KEY)"))


def test_a_newer_store_is_served_or_refused_as_its_record_says(url: str) -> None:
    additive = Migration(LATEST + 1, "later", _additive, Compat.ADDITIVE)
    breaking = Migration(LATEST + 2, "renamed", _breaking, Compat.BREAKING)
    open_store(url, migrations=(*MIGRATIONS, additive)).close()
    served = run("status", "--store", url)
    assert served.exit_code == 0
    assert "this Medic:      newer than this Medic, which can still use it" in served.output
    assert run("migrate", "--store", url).exit_code == 0

    open_store(url, migrations=(*MIGRATIONS, additive, breaking), allow_breaking=True).close()
    refused = run("status", "--store", url)
    assert refused.exit_code == 1
    assert f"serves:          Medic that knows version {LATEST + 2} or later" in refused.output
    assert "which it refuses: upgrade Medic on this host" in refused.output
    failed = run("migrate", "--store", url)
    assert failed.exit_code == 1
    assert "medic: this Medic cannot migrate the store" in failed.output
    assert f"knows version {LATEST + 2} or later" in failed.output


def test_a_missing_sqlite_store_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "none" / "medic.db"
    result = run("migrate", "--store", f"sqlite:///{missing}")
    assert result.exit_code == 1
    assert f"no store at {missing}" in result.output
    assert not missing.exists()

"""Rolling upgrades of a shared store (docs/store.md, "Upgrading a fleet"): a newer Medic
migrates the database, older Medic keeps running against it while the changes are additive,
and is refused, on one line, once a breaking change is applied. On a SQLite file and on a
real PostgreSQL server (tests/pg.py).

"New Medic" is this version's MIGRATIONS plus test-only versions: 6 is additive (a nullable
column on conditions, events and remediation_episodes, and a new table), 7 is breaking (a
column renamed). "Old Medic" is this version's MIGRATIONS, through the real Store and
EpisodeStore APIs.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from medic_core.api import ask
from medic_core.proc import spawn
from medic_core.store import (
    MIGRATIONS,
    Compat,
    ConditionUpdate,
    Migration,
    Status,
    Store,
    StoreError,
    open_store,
)
from medic_core.store.engine import make_engine, parse_url
from medic_core.store.migrations import admits, migrate, min_compatible
from remediation.episodes import ACTING, RESOLVED, EpisodeStore
from tests.conftest import poll, race_rounds
from tests.pg import PostgresServer, pg_server  # noqa: F401  (pytest fixture)
from tests.test_daemon import plain_config, start_daemon, stop_daemon

T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)
OLD = len(MIGRATIONS)  # the version this code knows
PREVIOUS_RELEASE = MIGRATIONS[:4]  # the release before schema_compat


def _future_additive(conn: Connection) -> None:
    conn.execute(text("ALTER TABLE conditions ADD COLUMN site_note TEXT"))
    conn.execute(text("ALTER TABLE events ADD COLUMN rack VARCHAR(64)"))
    conn.execute(text("ALTER TABLE remediation_episodes ADD COLUMN ticket_url TEXT"))
    conn.execute(text("CREATE INDEX ix_events_rack ON events (rack)"))
    conn.execute(
        text("CREATE TABLE future_notes (id INTEGER PRIMARY KEY, node VARCHAR(255) NOT NULL)")
    )


def _future_breaking(conn: Connection) -> None:
    conn.execute(text("ALTER TABLE conditions RENAME COLUMN message TO detail"))


FUTURE = (
    *MIGRATIONS,
    Migration(OLD + 1, "future: nullable columns and a table", _future_additive, Compat.ADDITIVE),
    Migration(OLD + 2, "future: conditions.message renamed", _future_breaking, Compat.BREAKING),
)
ADDITIVE_ONLY = FUTURE[: OLD + 1]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'medic.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database()


def _scalar(url: str, sql: str) -> Any:
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).scalar()
    finally:
        engine.dispose()


def _admin_migrate(url: str, migrations: Any) -> None:
    """`medic store migrate`: the one way a breaking migration is applied to a live store."""
    engine = make_engine(parse_url(url))
    try:
        migrate(engine, migrations)
    finally:
        engine.dispose()


def _record(url: str) -> int:
    return int(_scalar(url, "SELECT min_compatible FROM schema_compat WHERE id = 1"))


def _update(reason: str) -> ConditionUpdate:
    return ConditionUpdate("gpu.xid", Status.CRITICAL, "3", reason, "Xid", {"xid": 79})


def _old_medic_works(store: Store, node: str) -> None:
    """Conditions, events and an episode with a step, written and read back."""
    assert store.set_condition(node, _update("gpu.xid.79"), T0) is not None
    [cond] = store.conditions(node=node)
    assert (cond.reason, cond.since, cond.evidence) == ("gpu.xid.79", T0, {"xid": 79})
    event = store.add_event(node, at=T0, kind="gpu.xid", severity="CRITICAL", source="old")
    assert [e.id for e in store.events(node=node)] == [event.id]
    episodes = EpisodeStore(store, clock=lambda: T0)
    episode = episodes.open_episode(
        node, state=ACTING, fault_class="gpu.xid.79", target="3", check="gpu_xid",
        recommendation="gpu_reset", rung=1, message="Xid 79", evidence={"xid": 79},
    )  # fmt: skip
    step = episodes.record_intent(episode, 1, "gpu_reset", ["nvidia-smi", "-r"], "boot-1")
    episodes.finish_step(step.id, "done", 0, "ok")
    episodes.update(episode.id, state=RESOLVED)
    assert episodes.get(episode.id) is not None
    assert [s.state for s in episodes.steps(episode.id)] == ["done"]
    assert episodes.find(node=node)[0].state == RESOLVED


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "medic.store" and r.levelno == logging.WARNING
    ]


def test_this_version_upgrades_the_previous_release_and_records_its_floor(url: str) -> None:
    with open_store(url, migrations=PREVIOUS_RELEASE) as store:
        store.set_condition("gpu01", _update("gpu.xid.48"), T0)
    with open_store(url) as store:
        assert store.schema_version() == OLD
        assert store.conditions()[0].reason == "gpu.xid.48"
    assert _record(url) == 1  # versions 2 to 5 are additive; 1 has nothing before it


def test_old_and_new_medic_side_by_side_until_a_breaking_migration(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="medic.store")
    running_old = open_store(url)  # an old daemon, up before the upgrade, stays up through it
    try:
        with open_store(url, migrations=ADDITIVE_ONLY) as new:  # the admin host migrates
            assert new.schema_version() == OLD + 1
            with new.engine.begin() as conn:  # new Medic uses what it added
                conn.execute(text("INSERT INTO future_notes (id, node) VALUES (1, 'gpu09')"))
            new.set_condition("gpu09", _update("gpu.xid.48"), T0)
            with new.engine.begin() as conn:
                conn.execute(text("UPDATE conditions SET site_note = 'rack 4'"))
                conn.execute(text("UPDATE events SET rack = 'r4'"))
        assert _record(url) == 1
        assert _warnings(caplog) == []

        _old_medic_works(running_old, "gpu01")
        assert {c.node for c in running_old.conditions()} == {"gpu01", "gpu09"}

        with open_store(url) as restarted_old:  # an old daemon restarting: admitted, warned
            _old_medic_works(restarted_old, "gpu02")
        [warning] = _warnings(caplog)
        assert f"schema is version {OLD + 1}" in warning
        assert f"knows versions up to {OLD}" in warning
        assert "upgrade Medic on this host" in warning and "\n" not in warning

        with open_store(url, migrations=ADDITIVE_ONLY) as new:  # new reads what old wrote
            assert {c.node for c in new.conditions()} == {"gpu01", "gpu02", "gpu09"}
            with new.engine.connect() as conn:
                notes = conn.execute(text("SELECT node, site_note FROM conditions ORDER BY node"))
                assert [tuple(r) for r in notes] == [
                    ("gpu01", None), ("gpu02", None), ("gpu09", "rack 4"),
                ]  # fmt: skip

        # The breaking release: a new daemon opening the store does not apply it...
        with pytest.raises(StoreError, match=r"breaking change .* run `medic store migrate`"):
            open_store(url, migrations=FUTURE)
        assert _record(url) == 1 and running_old.schema_version() == OLD + 1
        _admin_migrate(url, FUTURE)  # ...the admin does, once every daemon is stopped
        with open_store(url, migrations=FUTURE) as new:
            assert new.schema_version() == OLD + 2
        assert _record(url) == OLD + 2
        # Why it is refused: an old daemon still running past a breaking migration fails.
        with pytest.raises(DBAPIError, match="message"):
            running_old.conditions()
    finally:
        running_old.close()

    for known in (OLD, OLD + 1):
        with pytest.raises(StoreError) as refused:
            open_store(url, migrations=FUTURE[:known])
        line = str(refused.value)
        assert "\n" not in line
        assert f"schema is version {OLD + 2} but this Medic knows versions up to {known}" in line
        assert f"version {OLD + 2} changed it in a way older Medic cannot use" in line
        assert f"knows version {OLD + 2} or later" in line
    with open_store(url, migrations=FUTURE) as new:  # the new Medic is untouched by refusals
        assert new.schema_version() == OLD + 2


def test_a_newer_database_with_no_compatibility_record_is_refused(url: str) -> None:
    open_store(url, migrations=ADDITIVE_ONLY).close()
    engine = make_engine(parse_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM schema_compat"))
    finally:
        engine.dispose()
    with pytest.raises(StoreError, match="records no older version it still serves; upgrade"):
        open_store(url)
    with pytest.raises(StoreError, match="knows versions up to 4, and the database records"):
        open_store(url, migrations=PREVIOUS_RELEASE)


def _exit_status(pid: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            raise AssertionError(f"medic-healthd {pid} still running after {timeout:.0f} s")
        time.sleep(0.05)


def test_real_daemons_through_an_upgrade(url: str, tmp_path: Path) -> None:
    """An old medic-healthd (this version) keeps running while the store is migrated to an
    additive version, starts again on it with one WARNING and writes its conditions; after a
    breaking version it exits 1 with one line and no traceback."""
    config = plain_config(tmp_path, f'[store]\nurl = "{url}"\n')
    log = tmp_path / "healthd.log"
    sock = tmp_path / "healthd.sock"
    pid = start_daemon(tmp_path, config)
    try:
        open_store(url, migrations=ADDITIVE_ONLY).close()  # the admin host's step 1
        reply = ask(sock, {"op": "status"}, timeout=5)  # reads episodes and tickets
        assert "store" not in reply, reply
    finally:
        stop_daemon(pid, log)

    pid = start_daemon(tmp_path, config)  # restarted (a crash, a reboot) on schema 6
    try:
        assert "store" not in ask(sock, {"op": "status"}, timeout=5)
        with open_store(url, migrations=ADDITIVE_ONLY) as new:
            poll("the old daemon's conditions", lambda: bool(new.conditions(node="plain1")), 30)
    finally:
        stop_daemon(pid, log)
    warned = [line for line in log.read_text().splitlines() if "WARNING medic.store" in line]
    assert len(warned) == 1 and f"schema is version {OLD + 1}" in warned[0], warned

    _admin_migrate(url, FUTURE)
    log.write_text("")
    venv_bin = Path(os.sys.executable).parent  # type: ignore[attr-defined]
    env = {**os.environ, "MEDIC_CONFIG": str(config), "MEDIC_NODE_NAME": "plain1"}
    pid = spawn([str(venv_bin / "medic-healthd")], log_path=log, env=env)
    assert _exit_status(pid) == 1  # not 78: systemd starts it again, and the upgrade ends it
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert "Traceback" not in log.read_text()
    [refusal] = [line for line in lines if "medic-healthd:" in line]
    assert f"schema is version {OLD + 2} but this Medic knows versions up to {OLD}" in refusal
    assert f"upgrade Medic on this host to one that knows version {OLD + 2}" in refusal


def _migrate_and_write(url: str, barrier: Any, name: str) -> None:
    """Child process: a new Medic migrating the store (`medic store migrate`, so breaking
    changes too) at the same moment as its sibling."""
    barrier.wait(timeout=60)
    with open_store(url, migrations=FUTURE, allow_breaking=True) as store:
        assert store.schema_version() == OLD + 2
        store.add_event("shared", at=T0, kind="race", severity="INFO", source=name)


@pytest.mark.parametrize("round_", range(race_rounds(2)))
def test_two_processes_upgrading_at_once_serialise(url: str, round_: int) -> None:
    with open_store(url) as store:  # this version's schema, with data
        store.set_condition("gpu01", _update("gpu.xid.79"), T0)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_migrate_and_write, args=(url, barrier, n)) for n in "ab"]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0], "a process failed; see its stderr above"
    applied = _scalar(url, "SELECT COUNT(*) FROM schema_version")
    assert applied == OLD + 2  # each version recorded once
    assert _record(url) == OLD + 2
    with open_store(url, migrations=FUTURE) as store:
        assert sorted(e.source for e in store.events()) == ["a", "b"]
    assert _scalar(url, "SELECT detail FROM conditions") == "Xid"


# -- the rule, as a property -----------------------------------------------------------------


def _extra_table(version: int) -> Any:
    def upgrade(conn: Connection) -> None:
        conn.execute(text(f"CREATE TABLE extra_{version} (id INTEGER PRIMARY KEY)"))

    return upgrade


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(list(Compat)), min_size=1, max_size=4))
def test_an_older_medic_is_admitted_iff_it_knows_the_newest_breaking_version(
    kinds: list[Compat],
) -> None:
    migrations = (
        *MIGRATIONS,
        *(
            Migration(OLD + i, f"extra {OLD + i}", _extra_table(OLD + i), kind)
            for i, kind in enumerate(kinds, start=1)
        ),
    )
    newest = len(migrations)
    breaking = max(m.version for m in migrations if m.compat is Compat.BREAKING)
    assert min_compatible(migrations, newest) == breaking
    with tempfile.TemporaryDirectory(prefix="medic-upgrade-") as tmp:
        url = f"sqlite:///{tmp}/medic.db"
        open_store(url, migrations=migrations).close()
        for known in range(OLD, newest + 1):
            admitted = known >= breaking
            assert admits(known, newest, breaking) == admitted
            if admitted:
                with open_store(url, migrations=migrations[:known]) as store:
                    assert store.schema_version() == newest
            else:
                with pytest.raises(StoreError, match=f"knows version {breaking} or later"):
                    open_store(url, migrations=migrations[:known])


@given(st.lists(st.sampled_from(list(Compat)), min_size=1, max_size=30), st.data())
def test_a_reader_is_admitted_iff_every_migration_it_does_not_know_is_additive(
    kinds: list[Compat], data: st.DataObject
) -> None:
    migrations = [Migration(v, f"m{v}", _extra_table(v), k) for v, k in enumerate(kinds, 1)]
    found = data.draw(st.integers(1, len(migrations)), label="found")
    known = data.draw(st.integers(0, len(migrations)), label="known")
    unknown = migrations[known:found]
    expected = all(m.compat is Compat.ADDITIVE for m in unknown)
    assert admits(known, found, min_compatible(migrations, found)) == expected
    assert admits(known, found, None) == (found <= known)

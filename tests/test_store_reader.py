"""The lean read-only path of `medic nodes` and `medic rma list` (medic_core.store_reader,
cli.common.read_store) on real SQLite and PostgreSQL stores: it reads what the store proper
reads, and leaves every case that is not plain (an older or newer schema, a missing file,
loose file modes) to the store proper, which migrates, refuses or tightens as before."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, text

from cli.node_view import NEWEST_REPORTS, control_of, gather
from cli.nodes import nodes
from cli.rma import rma_command
from cli.rma_lines import ticket_lines
from medic_core import store_reader
from medic_core.store import MIGRATIONS, Compat, ConditionUpdate, Migration, Status, open_store
from medic_core.store import engine as engine_module
from medic_core.store import store_table as store_table_module
from medic_core.store.engine import make_engine, parse_url
from medic_core.store.migrations import current_version, migrate
from medic_core.store_reader import SCHEMA_VERSION, Unreachable, configured_url, open_reader
from remediation import tickets
from remediation.episodes import EpisodeStore
from tests.pg import PostgresServer, pg_server  # noqa: F401  (pytest fixture)

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def test_the_reader_knows_the_newest_schema_and_the_store_table() -> None:
    assert len(MIGRATIONS) == SCHEMA_VERSION
    assert (store_reader.STORE_KEYS, store_reader.MAX_POOL_SIZE) == (
        store_table_module.STORE_KEYS,
        store_table_module.MAX_POOL_SIZE,
    )
    assert store_reader.POOLS == engine_module.POOLS


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'medic.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database()


def fill(url: str) -> None:
    with open_store(url) as store:
        store.set_conditions(
            "gpu2",
            [
                ConditionUpdate("gpu.xid", Status.CRITICAL, target="3", reason="gpu.xid.79"),
                ConditionUpdate("memory", Status.OK),
            ],
            NOW,
        )
        store.set_condition("gpu10", ConditionUpdate("cpus", Status.OK), NOW + dt.timedelta(1))
        tickets.open_ticket(
            store, "gpu2", "gpu.xid.79", "GPU 3 fell off the bus", [{"index": 3}],
            {"why": "every rung tried"}, "alice", at=NOW,
        )  # fmt: skip
        EpisodeStore(store).set_paused(True, "maintenance", "bob")


def run(command: object, *args: str) -> Result:
    return CliRunner().invoke(command, list(args), catch_exceptions=False)  # type: ignore[arg-type]


def test_the_reader_reads_what_the_store_proper_reads(url: str) -> None:
    fill(url)
    reader = open_reader(url)
    assert reader is not None
    with reader:
        lean = gather(reader)
        lean_lines = ticket_lines(reader, None, None)
        lean_control = control_of(reader)
    with open_store(url) as store:  # the same queries through SQLAlchemy's connection
        assert gather(store) == lean
        assert ticket_lines(store) == lean_lines
        assert EpisodeStore(store).control() == lean_control
        [bad] = store.conditions(status=Status.CRITICAL)
    assert lean["gpu2"].faults[0].since == bad.since == NOW
    assert lean["gpu2"].last_report == NOW
    assert lean["gpu10"].last_report == NOW + dt.timedelta(1)
    assert [t.id for t in lean["gpu2"].tickets] == [lean_lines[0].id]
    assert lean_lines[0].gpus == (3,)
    assert lean_lines[0].created_at == NOW
    assert lean_control.paused and lean_control.reason == "maintenance"


def test_newest_reports_are_each_nodes_max(url: str) -> None:
    with open_store(url) as store:
        for i, node in enumerate(["gpu2", "gpu10", "a", "b-1", "Z", "gpu1"]):
            at = NOW + dt.timedelta(minutes=i)
            store.set_conditions(
                node, [ConditionUpdate("x", Status.OK), ConditionUpdate("y", Status.OK)], at
            )
            if i % 2:
                store.set_condition(node, ConditionUpdate("y", Status.WARN), at + dt.timedelta(i))
    reader = open_reader(url)
    assert reader is not None
    with reader:
        skipping = reader.rows(NEWEST_REPORTS[reader.backend])
        grouped = reader.rows("SELECT node, max(updated_at) FROM conditions GROUP BY node")
    assert len(skipping) == 6
    assert sorted(skipping) == sorted(grouped)


def test_the_listings_through_the_reader(url: str) -> None:
    fill(url)
    doc = json.loads(run(nodes, "--no-slurm", "--json", "--all", "--store", url).stdout)
    assert [n["node"] for n in doc["nodes"]] == ["gpu2", "gpu10"]
    assert doc["remediation_paused"] is True
    assert doc["nodes"][0]["medic"] == "rma"
    assert doc["nodes"][0]["faults"][0]["since"] == "2026-03-01T12:00:00Z"
    [line] = json.loads(run(rma_command, "list", "--json", "--store", url).stdout)
    assert (line["node"], line["gpus"], line["last_actor"]) == ("gpu2", [3], "alice")


def _older(url: str, version: int) -> None:
    engine = make_engine(parse_url(url))
    try:
        migrate(engine, MIGRATIONS[:version])
    finally:
        engine.dispose()


def _version(url: str) -> int:
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            return current_version(conn)
    finally:
        engine.dispose()


def test_an_older_store_is_migrated_as_before(url: str) -> None:
    _older(url, SCHEMA_VERSION - 1)
    assert open_reader(url) is None
    result = run(nodes, "--no-slurm", "--store", url)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("0 nodes: ")
    assert _version(url) == SCHEMA_VERSION
    reader = open_reader(url)
    assert reader is not None
    reader.close()


def _breaking(conn: Connection) -> None:
    conn.execute(text("ALTER TABLE events RENAME COLUMN message TO text"))


def test_a_newer_store_that_refuses_this_medic_is_refused_on_one_line(url: str) -> None:
    later = Migration(SCHEMA_VERSION + 1, "renamed", _breaking, Compat.BREAKING)
    engine = make_engine(parse_url(url))
    try:
        migrate(engine, (*MIGRATIONS, later))
    finally:
        engine.dispose()
    assert open_reader(url) is None
    for command, args in ((nodes, ["--no-slurm"]), (rma_command, ["list"])):
        result = CliRunner().invoke(command, [*args, "--store", url])  # type: ignore[arg-type]
        assert result.exit_code == 1
        lines = result.output.splitlines()
        assert lines[0] == "medic: cannot open the store"
        assert lines[1].startswith(
            f"  why: the database's schema is version {SCHEMA_VERSION + 1} but this Medic"
            f" knows versions up to {SCHEMA_VERSION}"
        )


def test_an_unreachable_server_is_said_once_as_the_store_proper_says_it(tmp_path: Path) -> None:
    from cli.admin import AdminError, opened_store
    from medic_core.config import MedicConfig

    url = f"postgresql+psycopg://postgres@/medic?host={tmp_path / 'nosuchdir'}"
    with pytest.raises(Unreachable):
        open_reader(url)
    result = CliRunner().invoke(nodes, ["--no-slurm", "--store", url])
    assert result.exit_code == 1
    with pytest.raises(AdminError) as proper, opened_store(MedicConfig(None, "n"), url):
        pass
    said = proper.value
    assert result.output == f"medic: {said.message}\n  why: {said.why}\n  fix: {said.fix}\n"
    assert said.why.startswith("store postgresql+psycopg://postgres@/medic?host=")


def test_a_missing_sqlite_store_is_neither_read_nor_created(tmp_path: Path) -> None:
    missing = tmp_path / "none" / "medic.db"
    assert open_reader(f"sqlite:///{missing}") is None
    result = CliRunner().invoke(nodes, ["--no-slurm", "--store", f"sqlite:///{missing}"])
    assert result.exit_code == 1
    assert f"no store at {missing}" in result.output
    assert not missing.exists()


def test_loose_file_modes_are_left_to_the_store_proper(tmp_path: Path) -> None:
    path = tmp_path / "medic.db"
    fill(f"sqlite:///{path}")
    path.chmod(0o644)
    assert open_reader(f"sqlite:///{path}") is None
    assert run(nodes, "--no-slurm", "--store", f"sqlite:///{path}").exit_code == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # tightened, as every open does
    reader = open_reader(f"sqlite:///{path}")
    assert reader is not None
    reader.close()


def test_the_reader_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "medic.db"
    fill(f"sqlite:///{path}")
    reader = open_reader(f"sqlite:///{path}")
    assert reader is not None
    with reader, pytest.raises(Exception, match=r"readonly|read-only|query_only"):
        reader.rows("DELETE FROM conditions")


def test_a_store_table_the_reader_is_not_sure_of_goes_to_the_store_proper() -> None:
    state = Path("/var/lib/medic")
    assert configured_url({}, state) == "sqlite:////var/lib/medic/medic.db"
    assert configured_url({"url": "sqlite:////x.db", "event_retention_days": 3}, state)
    assert configured_url({"url": "sqlite:////x.db", "nosuch": 1}, state) is None
    assert configured_url({"url": "sqlite:////x.db", "pool": "null", "pool_size": 50}, state)
    assert configured_url({"pool": "nosuch"}, state) is None
    assert configured_url({"pool_size": 51}, state) is None
    assert configured_url({"pool_size": True}, state) is None
    assert configured_url({"url": 5}, state) is None
    assert configured_url({"event_retention_days": 0}, state) is None
    assert configured_url({"event_retention_days": True}, state) is None
    assert open_reader("mysql://x/y") is None
    assert open_reader("sqlite:///:memory:") is None


# --- the light judge of a [store] url (config check, the daemon's reload) ---------------------

_PIECE = st.text(alphabet="ab9._-:@/?%#= \t\n\x00é", max_size=6)
_URL = st.one_of(
    st.builds(
        lambda scheme, path: f"{scheme}{path}",
        st.sampled_from(["sqlite:///", "sqlite+pysqlite:///", "sqlite://", "sqlite+x:///"]),
        _PIECE,
    ),
    st.builds(
        lambda scheme, user, password, host, port, database, tail: (
            f"{scheme}://{user}{password}{'@' if user or password else ''}{host}{port}/"
            f"{database}{tail}"
        ),
        st.sampled_from(
            ["postgresql", "postgres", "postgresql+psycopg", "postgres+psycopg", "pg", "mysql"]
        ),
        _PIECE,
        st.one_of(st.just(""), _PIECE.map(lambda p: f":{p}")),
        _PIECE,
        st.one_of(st.just(""), st.integers(-1, 70000).map(lambda n: f":{n}"), _PIECE),
        _PIECE,
        st.one_of(st.just(""), _PIECE),
    ),
    _PIECE,
)


@settings(max_examples=1500, deadline=None)
@given(_URL)
def test_a_url_judged_plain_is_one_the_store_accepts_and_shows_alike(url: str) -> None:
    """...and a URL either parses or is a BadStoreURL (one line), never another error:
    found here, `postgresql://u:@:@/d` raised ValueError from SQLAlchemy's port parser."""
    from sqlalchemy import make_url

    from medic_core.store.engine import BadStoreURL

    with contextlib.suppress(BadStoreURL):
        parse_url(url)
    shown = store_reader.shown_plain_url(url)
    if shown is None:
        return
    parse_url(url)  # raises BadStoreURL when the light judge was wrong
    assert shown == make_url(url).render_as_string(hide_password=True)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////var/lib/medic/medic.db",
        "postgresql://medic:pw@db:5432/medic",
        "postgresql+psycopg://db/medic",
        "postgres://u@h/d",
    ],
)
def test_plain_urls_are_judged_without_sqlalchemy(url: str) -> None:
    assert store_reader.shown_plain_url(url) is not None

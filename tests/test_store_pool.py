"""`[store] pool` and `pool_size` for fleets: validated through the one config loader, and on a
real PostgreSQL (tests/pg.py) a "null" pool keeps no idle connection, and the webhook sender
election still elects exactly one sender (its lock then held in an open transaction, as a
transaction-mode pooler such as pgbouncer needs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import make_url
from sqlalchemy.pool import NullPool, QueuePool

from medic_core.config import ConfigError, parse_config
from medic_core.settings import load_settings
from medic_core.store import ConditionUpdate, Status, open_configured_store, store_settings
from remediation.webhook import SenderElection
from tests.conftest import poll
from tests.pg import PostgresServer, pg_server  # noqa: F401  (pytest fixtures)


def config(store_table: dict[str, Any] | None = None) -> Any:
    data: dict[str, Any] = {"node": {"state_dir": "/srv/medic/{node}"}}
    if store_table is not None:
        data["store"] = store_table
    return parse_config(data, Path("/etc/medic/medic.toml"), "gpu07")


def test_pool_defaults_keep_todays_engine() -> None:
    settings = store_settings(config())
    assert (settings.pool, settings.pool_size) == ("queue", 5)


def test_pool_settings_are_read() -> None:
    settings = store_settings(config({"pool": "null"}))
    assert settings.pool == "null"
    assert store_settings(config({"pool": "queue", "pool_size": 1})).pool_size == 1


@pytest.mark.parametrize(
    ("table", "key", "words"),
    [
        ({"pool": "pgbouncer"}, "store.pool", "expected one of queue, null"),
        ({"pool": 1}, "store.pool", "expected one of queue, null"),
        ({"pool_size": 0}, "store.pool_size", "from 1 to 50"),
        ({"pool_size": 51}, "store.pool_size", "from 1 to 50"),
        ({"pool_size": True}, "store.pool_size", "from 1 to 50"),
        ({"pool_size": "2"}, "store.pool_size", "from 1 to 50"),
    ],
)
def test_bad_pool_settings_name_the_key_and_the_fix(
    table: dict[str, Any], key: str, words: str
) -> None:
    for check in (store_settings, load_settings):  # the store's table, and the one loader
        with pytest.raises(ConfigError) as info:
            check(config(table))
        message = str(info.value)
        assert message.startswith(f"/etc/medic/medic.toml: {key}: ")
        assert words in message and "; " in message and "\n" not in message


def backends(pg_server: PostgresServer, url: str) -> int:  # noqa: F811
    database = make_url(url).database or ""
    with psycopg.connect(pg_server.dsn("postgres"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_null_pool_keeps_no_idle_connection(pg_server: PostgresServer) -> None:  # noqa: F811
    url = pg_server.create_database("pool")
    with open_configured_store(config({"url": url, "pool": "null"})) as store:
        assert isinstance(store.engine.pool, NullPool)
        store.set_conditions("gpu07", [ConditionUpdate("cpus", Status.OK)], _now())
        assert [c.type for c in store.conditions("gpu07")] == ["cpus"]
        poll("the connections to close", lambda: backends(pg_server, url) == 0)
    with open_configured_store(config({"url": url, "pool_size": 1})) as store:
        assert isinstance(store.engine.pool, QueuePool) and store.engine.pool.size() == 1
        assert [c.type for c in store.conditions("gpu07")] == ["cpus"]
        assert backends(pg_server, url) == 1  # the one it keeps


def test_null_pool_election_holds_the_lock_in_a_transaction(
    pg_server: PostgresServer,  # noqa: F811
) -> None:
    url = pg_server.create_database("pool")
    table = {"url": url, "pool": "null"}
    with open_configured_store(config(table)) as a, open_configured_store(config(table)) as b:
        now = [0.0]
        ea = SenderElection(a, period=60.0, clock=lambda: now[0], rng=lambda: 0.0)
        eb = SenderElection(b, period=60.0, clock=lambda: now[0], rng=lambda: 0.0)
        assert ea.transactional and eb.transactional
        assert (ea.is_sender(), eb.is_sender()) == (True, False)
        database = make_url(url).database or ""
        with psycopg.connect(pg_server.dsn("postgres"), autocommit=True) as conn:
            states = conn.execute(
                "SELECT state FROM pg_stat_activity WHERE datname = %s", (database,)
            ).fetchall()
        assert [s[0] for s in states] == ["idle in transaction"]  # the sender's, only
        now[0] += 11  # past the check of the held connection: it is still the sender
        assert ea.is_sender() is True
        a.close()
        poll("the lock to go with the transaction", lambda: backends(pg_server, url) == 0)
        now[0] += 60
        assert eb.is_sender() is True


def _now() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.UTC)

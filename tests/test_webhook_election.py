"""One webhook sender per fleet: the sender election (remediation.webhook.SenderElection) on a
real PostgreSQL server (tests/pg.py), two stores (two engines) standing for two daemons.
The election's period and clock are injected: no test waits for a period to pass."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, make_url

from medic_core.settings import WebhookSettings
from medic_core.store import Store, open_store
from remediation.webhook import SENDER_LOCK_KEY, SenderElection, deliver_pending
from tests.conftest import poll
from tests.fakes import FakeClock
from tests.pg import PostgresServer, pg_server, pg_url  # noqa: F401  (pytest fixtures)

PERIOD = 60.0


@pytest.fixture
def two(pg_server: PostgresServer) -> Iterator[tuple[Store, Store]]:  # noqa: F811
    url = pg_server.create_database("election")
    a, b = open_store(url), open_store(url)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def elect(store: Store, clock: FakeClock, rng: float = 0.0) -> SenderElection:
    return SenderElection(store, period=PERIOD, verify_every=10.0, clock=clock, rng=lambda: rng)


def lock_holders(pg_server: PostgresServer, url: str) -> list[int]:  # noqa: F811
    """The backend pids holding the sender lock (pg_locks: objid is the key's low 32 bits)."""
    database = make_url(url).database or ""
    with psycopg.connect(pg_server.dsn(database), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s AND objid = %s",
            ((SENDER_LOCK_KEY >> 32) & 0xFFFFFFFF, SENDER_LOCK_KEY & 0xFFFFFFFF),
        ).fetchall()
    return [int(r[0]) for r in rows]


def terminate(pg_server: PostgresServer, url: str, pid: int) -> None:  # noqa: F811
    database = make_url(url).database or ""
    with psycopg.connect(pg_server.dsn(database), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_two_stores_exactly_one_sender(
    two: tuple[Store, Store],
    pg_server: PostgresServer,  # noqa: F811
) -> None:
    a, b = two
    clock = FakeClock()
    ea, eb = elect(a, clock), elect(b, clock)
    assert ea.is_sender() is True
    assert eb.is_sender() is False
    # Later rounds within the period: the roles stay, and b does not even try again.
    clock.now += 5
    assert (ea.is_sender(), eb.is_sender()) == (True, False)
    clock.now += PERIOD
    assert (ea.is_sender(), eb.is_sender()) == (True, False)
    assert len(lock_holders(pg_server, str(a.engine.url))) == 1


def test_sender_connection_killed_the_other_takes_over(
    two: tuple[Store, Store],
    pg_server: PostgresServer,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = two
    clock = FakeClock()
    ea, eb = elect(a, clock), elect(b, clock)
    assert ea.is_sender() and not eb.is_sender()
    url = a.engine.url.render_as_string(hide_password=False)
    [holder] = lock_holders(pg_server, url)
    terminate(pg_server, url, holder)
    poll("the sender's session to end", lambda: lock_holders(pg_server, url) == [])
    # b tries again within a period (rng 0: exactly one period later) and takes the role.
    clock.now += PERIOD - 1
    assert eb.is_sender() is False
    clock.now += 1
    assert eb.is_sender() is True
    # a finds its connection dead at its next check and drops the role, in one line.
    with caplog.at_level(logging.INFO, logger="medic.remediation.webhook"):
        assert ea.is_sender() is False
        assert ea.is_sender() is False
    lost = [r for r in caplog.records if "no longer the fleet's webhook sender" in r.message]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING
    assert "\n" not in lost[0].getMessage()
    assert len(lock_holders(pg_server, url)) == 1
    # a's next try, a period later, finds b holding it.
    clock.now += PERIOD
    assert (ea.is_sender(), eb.is_sender()) == (False, True)


def test_sender_store_closed_the_other_takes_over(
    pg_server: PostgresServer,  # noqa: F811
) -> None:
    url = pg_server.create_database("election")
    a, b = open_store(url), open_store(url)
    try:
        clock = FakeClock()
        ea, eb = elect(a, clock, rng=0.99), elect(b, clock, rng=0.99)
        assert ea.is_sender() and not eb.is_sender()
        a.close()  # the daemon stops: its engine is disposed, the held session with it
        poll("the lock to be released", lambda: lock_holders(pg_server, url) == [])
        assert ea.is_sender() is False
        clock.now += PERIOD * (1 - 0.5 * 0.99)  # b's jittered next try
        assert eb.is_sender() is True
    finally:
        a.close()
        b.close()


def test_non_sender_issues_no_outbox_query(
    two: tuple[Store, Store],
) -> None:
    a, b = two
    statements: dict[str, list[str]] = {"a": [], "b": []}

    def counter(name: str) -> Any:
        def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements[name].append(statement)

        return before

    event.listen(a.engine, "before_cursor_execute", counter("a"))
    event.listen(b.engine, "before_cursor_execute", counter("b"))
    clock = FakeClock()
    ea, eb = elect(a, clock), elect(b, clock)
    settings = WebhookSettings(url="http://127.0.0.1:9/", secret=b"k", allow_http=True)
    for _ in range(5):  # five ladder rounds, two seconds apart
        assert deliver_pending(a, settings, sender=ea) == []
        assert deliver_pending(b, settings, sender=eb) == []
        clock.now += 2
    outbox_a = [s for s in statements["a"] if "rma_outbox" in s]
    outbox_b = [s for s in statements["b"] if "rma_outbox" in s]
    assert len(outbox_a) == 5  # the sender polls every round
    assert outbox_b == []
    # The non-sender's only statement: its one try of the lock (no table read).
    assert [s for s in statements["b"] if "pg_try_advisory_lock" in s] == statements["b"]
    assert len(statements["b"]) == 1


def test_sqlite_every_daemon_sends(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    with open_store(url) as a, open_store(url) as b:
        clock = FakeClock()
        assert elect(a, clock).is_sender() and elect(b, clock).is_sender()

"""The store against real databases: every store test runs on a SQLite file and on a private
PostgreSQL server (tests/pg.py) whose time zone is deliberately not UTC."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Connection,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy import inspect as sa_inspect

from medic_core.config import ConfigError, parse_config
from medic_core.store import (
    MIGRATIONS,
    BadStoreURL,
    ConditionUpdate,
    Migration,
    Severity,
    Status,
    Store,
    StoreError,
    default_url,
    migrate,
    open_store,
    store_settings,
)
from medic_core.store.engine import make_engine, parse_url
from medic_core.store.models import Base
from tests.conftest import race_rounds
from tests.pg import PostgresServer, pg_server  # noqa: F401  (pytest fixture)

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
BACKENDS = ["sqlite", "postgresql"]


def fresh_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path, name: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / name / 'medic.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """A URL for an empty database on each backend."""
    return fresh_url(request, backend, tmp_path, "db")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as opened:
        yield opened


def xid(status: Status, reason: str = "", message: str = "", **evidence: Any) -> ConditionUpdate:
    return ConditionUpdate("gpu.xid", status, "3", reason, message, evidence)


def versions(url: str) -> list[tuple[int, str]]:
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT version, applied_at FROM schema_version ORDER BY version")
            )
            return [(int(r[0]), str(r[1])) for r in rows]
    finally:
        engine.dispose()


# -- conditions ------------------------------------------------------------------------------


def test_first_observation_is_a_transition_from_nothing(store: Store) -> None:
    change = store.set_condition("gpu01", xid(Status.OK, message="no XID"), T0)
    assert change is not None
    assert (change.previous_status, change.previous_reason, change.previous_since) == (
        None,
        None,
        None,
    )
    assert (change.status, change.reason, change.at) == (Status.OK, "", T0)
    [cond] = store.conditions()
    assert (cond.node, cond.type, cond.target, cond.status) == ("gpu01", "gpu.xid", "3", "OK")
    assert cond.since == cond.updated_at == T0


def test_since_stays_when_only_message_and_evidence_change(store: Store) -> None:
    store.set_condition("gpu01", xid(Status.WARN, "gpu.xid.13", "first", count=1), T0)
    later = T0 + timedelta(minutes=5)
    change = store.set_condition("gpu01", xid(Status.WARN, "gpu.xid.13", "second", count=2), later)
    assert change is None
    [cond] = store.conditions("gpu01")
    assert cond.since == T0
    assert cond.updated_at == later
    assert (cond.message, cond.evidence) == ("second", {"count": 2})


def test_since_moves_when_status_changes(store: Store) -> None:
    store.set_condition("gpu01", xid(Status.OK), T0)
    store.set_condition("gpu01", xid(Status.OK, message="still fine"), T0 + timedelta(minutes=1))
    at = T0 + timedelta(minutes=2)
    change = store.set_condition("gpu01", xid(Status.CRITICAL, "gpu.xid.79", "fell off"), at)
    assert change is not None
    assert (change.previous_status, change.previous_reason, change.previous_since) == (
        Status.OK,
        "",
        T0,
    )
    assert (change.status, change.reason, change.message, change.at) == (
        Status.CRITICAL,
        "gpu.xid.79",
        "fell off",
        at,
    )
    [cond] = store.conditions()
    assert cond.since == cond.updated_at == at


def test_since_moves_when_reason_changes_under_the_same_status(store: Store) -> None:
    store.set_condition("gpu01", xid(Status.CRITICAL, "gpu.xid.79"), T0)
    at = T0 + timedelta(hours=1)
    change = store.set_condition("gpu01", xid(Status.CRITICAL, "gpu.xid.48"), at)
    assert change is not None
    assert (change.previous_status, change.previous_reason) == (Status.CRITICAL, "gpu.xid.79")
    assert store.conditions()[0].since == at
    # and back to the same status and reason as before is a change again
    assert store.set_condition("gpu01", xid(Status.CRITICAL, "gpu.xid.48"), at) is None


def test_conditions_are_keyed_by_node_type_and_target_and_filtered(store: Store) -> None:
    store.set_conditions(
        "gpu01",
        [
            ConditionUpdate("gpu.xid", Status.OK, "0"),
            ConditionUpdate("gpu.xid", Status.CRITICAL, "1", "gpu.xid.79"),
            ConditionUpdate("ib.port", Status.WARN, "mlx5_0/1", "ib.port.down"),
        ],
        T0,
    )
    store.set_condition("gpu02", ConditionUpdate("gpu.xid", "CRITICAL", "1", "gpu.xid.94"), T0)
    store.set_condition("gpu02", ConditionUpdate("disk.free", "NOT_APPLICABLE"), T0)

    keys = [(c.node, c.type, c.target) for c in store.conditions()]
    assert keys == sorted(keys) and len(keys) == 5
    assert [c.target for c in store.conditions("gpu01", type="gpu.xid")] == ["0", "1"]
    critical = store.conditions(status=Status.CRITICAL)
    assert [(c.node, c.reason) for c in critical] == [
        ("gpu01", "gpu.xid.79"),
        ("gpu02", "gpu.xid.94"),
    ]
    assert [c.node for c in store.conditions(status=["WARN", Status.CRITICAL])] == [
        "gpu01",
        "gpu01",
        "gpu02",
    ]
    assert store.conditions("gpu02", status="OK") == []
    assert store.conditions("nope") == []


def test_a_batch_with_a_bad_update_stores_nothing(store: Store) -> None:
    with pytest.raises(ValueError, match="unknown status 'BROKEN'"):
        store.set_conditions(
            "gpu01",
            [
                ConditionUpdate("gpu.xid", Status.OK, "0"),
                ConditionUpdate("gpu.xid", "BROKEN", "1"),
            ],
            T0,
        )
    assert store.conditions() == []


def test_values_outside_the_schema_fail_alike_on_both_backends(store: Store) -> None:
    with pytest.raises(ValueError, match="limit is 255"):
        store.set_condition("gpu01", ConditionUpdate("gpu.xid", Status.OK, "x" * 256), T0)
    with pytest.raises(ValueError, match="node must not be empty"):
        store.set_condition("", xid(Status.OK), T0)
    with pytest.raises(ValueError, match="NUL"):
        store.set_condition("gpu01", xid(Status.OK, message="a\x00b"), T0)
    with pytest.raises(ValueError, match="unknown severity"):
        store.add_event("gpu01", at=T0, kind="k", severity="LOUD", source="s")
    assert store.conditions() == [] and store.events() == []


# -- events ----------------------------------------------------------------------------------


def add(store: Store, node: str, minutes: int, kind: str = "gpu.xid", **kw: Any) -> int:
    kw.setdefault("severity", Severity.CRITICAL)
    kw.setdefault("source", "nvml-event")
    return store.add_event(node, at=T0 + timedelta(minutes=minutes), kind=kind, **kw).id


def test_add_event_returns_what_was_stored(store: Store) -> None:
    event = store.add_event(
        "gpu01",
        at=T0,
        kind="gpu.xid",
        fault_class="gpu.xid.79",
        target="3",
        severity="CRITICAL",
        message="GPU has fallen off the bus",
        evidence={"xid": 79, "pci": "0000:3b:00.0"},
        source="kmsg",
    )
    [stored] = store.events()
    assert stored == event
    assert stored.severity is Severity.CRITICAL and stored.at == T0


def test_add_events_writes_a_batch_in_order_in_one_transaction(store: Store) -> None:
    rows = [
        {"node": "gpu01", "at": T0 + timedelta(seconds=n), "kind": "gate", "severity": "INFO",
         "source": "prolog", "target": f"job:{n}", "evidence": {"job_id": str(n), "allow": True}}
        for n in range(3)
    ]  # fmt: skip
    rows[1] = {**rows[1], "severity": Severity.CRITICAL, "fault_class": "gpu.xid.79"}
    assert store.add_events(rows) == 3
    assert store.add_events([]) == 0
    stored = sorted(store.events(), key=lambda e: e.id)
    assert [(e.target, e.at, e.severity) for e in stored] == [
        ("job:0", T0, Severity.INFO),
        ("job:1", T0 + timedelta(seconds=1), Severity.CRITICAL),
        ("job:2", T0 + timedelta(seconds=2), Severity.INFO),
    ]
    assert stored[1].fault_class == "gpu.xid.79" and stored[2].evidence["job_id"] == "2"
    assert stored[0].message == "" and stored[0].node == "gpu01"
    one = store.add_event(**{**rows[0], "target": "job:3"})
    assert one.id > stored[-1].id and [e for e in store.events() if e.target == "job:3"] == [one]


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"message": "NUL \x00"}, "event 2 of the batch: event message contains a NUL"),
        ({"at": datetime(2025, 3, 1)}, "event 2 of the batch: event time .* no time zone"),
        ({"severity": "LOUD"}, "event 2 of the batch: unknown severity"),
        ({"target": "t" * 1000}, "event 2 of the batch: event target is 1000 characters"),
        ({"colour": "red"}, "event 2 of the batch: .*colour"),
    ],
)
def test_a_batch_with_a_bad_event_writes_nothing_and_names_it(
    store: Store, bad: dict[str, Any], words: str
) -> None:
    good = {"node": "gpu01", "at": T0, "kind": "gate", "severity": "INFO", "source": "prolog"}
    with pytest.raises(ValueError, match=words):
        store.add_events([good, {**good, **bad}, good])
    assert store.events() == []


def test_events_filters_order_and_limit(store: Store) -> None:
    a = add(store, "gpu01", 0, fault_class="gpu.xid.79")
    b = add(store, "gpu01", 10, kind="kmsg", severity="WARN", source="kmsg")
    c = add(store, "gpu02", 20)
    d = add(store, "gpu01", 30, kind="check.crash", severity="INFO", source="check:nvlink")
    e = add(store, "gpu01", 30)  # same time as d: newer id first
    assert a < b < c < d < e

    assert [ev.id for ev in store.events()] == [e, d, c, b, a]
    assert [ev.id for ev in store.events(node="gpu01")] == [e, d, b, a]
    assert [ev.id for ev in store.events(kind="gpu.xid")] == [e, c, a]
    assert [ev.id for ev in store.events(since=T0 + timedelta(minutes=10))] == [e, d, c, b]
    assert [ev.id for ev in store.events("gpu01", T0 + timedelta(minutes=1), "gpu.xid")] == [e]
    assert [ev.id for ev in store.events(limit=2)] == [e, d]
    assert store.events(node="gpu03") == []
    with pytest.raises(ValueError, match="limit"):
        store.events(limit=0)


def test_prune_deletes_only_old_events_and_never_conditions(store: Store) -> None:
    store.set_condition("gpu01", xid(Status.CRITICAL, "gpu.xid.79"), T0 - timedelta(days=400))
    now = T0 + timedelta(days=100)
    old = [add(store, "gpu01", -60 * 24 * d) for d in (1, 5, 9)]  # 101, 105, 109 days old
    kept = [
        add(store, "gpu02", 60 * 24 * 10),  # 90 days old: exactly at the edge, kept
        add(store, "gpu01", 60 * 24 * 50),
    ]
    assert store.prune(now, keep_days=90) == len(old)
    assert sorted(ev.id for ev in store.events()) == kept
    assert store.prune(now, keep_days=90) == 0
    assert len(store.conditions()) == 1
    assert store.prune(now, keep_days=0) == 2
    with pytest.raises(ValueError, match="keep_days"):
        store.prune(now, keep_days=-1)


def test_event_ids_are_not_reused_after_prune(store: Store) -> None:
    first = add(store, "gpu01", 0)
    assert store.prune(T0 + timedelta(days=1), keep_days=0) == 1
    assert add(store, "gpu01", 0) > first


# -- JSON and time ---------------------------------------------------------------------------


EVIDENCE: dict[str, Any] = {
    "xid": 79,
    "big": 2**62,
    "ratio": 0.1,
    "ok": True,
    "missing": None,
    "gpus": [{"index": 0, "uuid": "GPU-1b2c"}, {"index": 1, "temps": [71.5, 80]}],
    "log": 'NVRM: Xid (PCI:0000:3b:00): 79, "fallen off"\n\ttab',
    "unicode": "ü — 温度 🔥",
    "empty": {},
}


def test_json_evidence_round_trips(store: Store) -> None:
    store.set_condition("gpu01", ConditionUpdate("gpu.xid", Status.OK, evidence=EVIDENCE), T0)
    store.add_event("gpu01", at=T0, kind="k", severity="INFO", source="s", evidence=EVIDENCE)
    assert store.conditions()[0].evidence == EVIDENCE
    assert store.events()[0].evidence == EVIDENCE
    # tuples are stored as JSON arrays
    store.add_event("gpu01", at=T0, kind="k", severity="INFO", source="s", evidence={"t": (1, 2)})
    assert store.events(limit=1)[0].evidence == {"t": [1, 2]}


@pytest.mark.parametrize(
    ("evidence", "match"),
    [
        ({"x": float("nan")}, "not JSON-serialisable"),
        ({"x": object()}, "not JSON-serialisable"),
        ({"x": "a\x00b"}, "NUL"),
        (["not", "a", "mapping"], "must be a mapping"),
    ],
)
def test_evidence_that_is_not_portable_json_is_refused(
    store: Store, evidence: Any, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        store.add_event("gpu01", at=T0, kind="k", severity="INFO", source="s", evidence=evidence)
    assert store.events() == []


def test_times_come_back_as_the_same_instant_in_utc(store: Store) -> None:
    india = timezone(timedelta(hours=5, minutes=30))
    newfoundland = timezone(timedelta(hours=-3, minutes=-30))
    local = datetime(2025, 3, 1, 17, 30, 0, 123456, tzinfo=india)  # == T0
    store.set_condition("gpu01", xid(Status.OK), local)
    [cond] = store.conditions()
    assert cond.since == T0 and cond.since.tzinfo is UTC and cond.since.utcoffset() == timedelta()

    # 10:00 at +02:00 is before 09:30 UTC; ordering and filters compare instants
    early = store.add_event(
        "gpu01",
        at=datetime(2025, 3, 1, 10, 0, tzinfo=timezone(timedelta(hours=2))),
        kind="k",
        severity="INFO",
        source="s",
    )
    late = store.add_event(
        "gpu01", at=datetime(2025, 3, 1, 9, 30, tzinfo=UTC), kind="k", severity="INFO", source="s"
    )
    assert [e.id for e in store.events()] == [late.id, early.id]
    assert early.at == datetime(2025, 3, 1, 8, 0, tzinfo=UTC) and early.at.tzinfo is UTC
    since = datetime(2025, 3, 1, 5, 0, tzinfo=newfoundland)  # 08:30 UTC
    assert [e.id for e in store.events(since=since)] == [late.id]


def test_naive_datetimes_are_refused(store: Store) -> None:
    naive = datetime(2025, 3, 1, 12, 0)
    with pytest.raises(ValueError, match="no time zone"):
        store.set_condition("gpu01", xid(Status.OK), naive)
    with pytest.raises(ValueError, match="no time zone"):
        store.add_event("gpu01", at=naive, kind="k", severity="INFO", source="s")
    with pytest.raises(ValueError, match="no time zone"):
        store.events(since=naive)
    with pytest.raises(ValueError, match="no time zone"):
        store.prune(naive, 1)


# -- schema and migrations -------------------------------------------------------------------


def _v2_episodes(conn: Connection) -> None:
    """What a later migration looks like: a new table referencing conditions, a new column."""
    metadata = MetaData()
    Table(
        "example_episodes",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("condition_id", ForeignKey("conditions.id", ondelete="CASCADE"), nullable=False),
        Column("step", String(64), nullable=False),
    )
    Table("conditions", metadata, Column("id", Integer, primary_key=True))
    metadata.tables["example_episodes"].create(conn)
    conn.execute(text("ALTER TABLE events ADD COLUMN episode_id INTEGER"))


def _v2_broken(conn: Connection) -> None:
    conn.execute(text("CREATE TABLE half_done (id INTEGER PRIMARY KEY)"))
    raise RuntimeError("migration 2 failed halfway")


RELEASED = MIGRATIONS[:1]  # version 1 as first released; the tests add a made-up version 2
V2 = (*RELEASED, Migration(2, "example episodes", _v2_episodes))


def test_open_creates_the_schema_and_reopening_is_a_no_op(store_url: str) -> None:
    with open_store(store_url) as store:
        assert store.schema_version() == len(MIGRATIONS)
        store.set_condition("gpu01", xid(Status.WARN, "gpu.xid.13"), T0)
    recorded = versions(store_url)
    assert [v for v, _ in recorded] == [m.version for m in MIGRATIONS]

    engine = make_engine(parse_url(store_url))
    try:
        result = migrate(engine)
        latest = len(MIGRATIONS)
        assert (result.before, result.after, result.applied) == (latest, latest, False)
    finally:
        engine.dispose()
    with open_store(store_url) as store:
        assert store.conditions()[0].reason == "gpu.xid.13"
    assert versions(store_url) == recorded


def test_an_older_database_is_upgraded_by_open_store(store_url: str) -> None:
    with open_store(store_url, migrations=RELEASED) as store:  # version 1, as released
        store.set_condition("gpu01", xid(Status.CRITICAL, "gpu.xid.79"), T0)
        event_id = add(store, "gpu01", 0)

    with open_store(store_url, migrations=V2, allow_breaking=True) as store:
        assert store.schema_version() == 2
        [cond] = store.conditions()  # data written at version 1 is intact
        assert (cond.reason, cond.since) == ("gpu.xid.79", T0)
        assert [e.id for e in store.events()] == [event_id]
        with store.engine.begin() as conn:
            cid = conn.execute(text("SELECT id FROM conditions")).scalar_one()
            conn.execute(
                text("INSERT INTO example_episodes (condition_id, step) VALUES (:c, 'reset')"),
                {"c": cid},
            )
            conn.execute(text("UPDATE events SET episode_id = 1"))
    assert [v for v, _ in versions(store_url)] == [1, 2]

    before = versions(store_url)
    open_store(store_url, migrations=V2).close()  # current: nothing applied
    assert versions(store_url) == before

    with pytest.raises(
        StoreError, match="schema is version 2 but this Medic knows versions up to 1"
    ):
        open_store(store_url, migrations=RELEASED)


def test_foreign_keys_are_enforced(store_url: str) -> None:
    with open_store(store_url, migrations=V2) as store, store.engine.connect() as conn:
        with pytest.raises(Exception, match=r"(?i)foreign key"):
            conn.execute(
                text("INSERT INTO example_episodes (condition_id, step) VALUES (999, 'x')")
            )
        conn.rollback()


def test_a_failed_migration_leaves_the_previous_version(store_url: str) -> None:
    open_store(store_url, migrations=RELEASED).close()
    broken = (*RELEASED, Migration(2, "broken", _v2_broken))
    with pytest.raises(RuntimeError, match="failed halfway"):
        open_store(store_url, migrations=broken, allow_breaking=True)
    with open_store(store_url, migrations=RELEASED) as store:
        assert store.schema_version() == 1
        assert not sa_inspect(store.engine).has_table("half_done")


def test_migrations_must_be_numbered_without_gaps(store_url: str) -> None:
    gap = (*RELEASED, Migration(3, "skips two", _v2_episodes))
    with pytest.raises(ValueError, match="expected 2"):
        open_store(store_url, migrations=gap)


def test_the_migrated_schema_matches_the_models(store: Store) -> None:
    from remediation.episodes import METADATA as REMEDIATION
    from remediation.sweep import METADATA as SWEEP

    found = sa_inspect(store.engine)
    models = [*Base.metadata.sorted_tables, *REMEDIATION.sorted_tables, *SWEEP.sorted_tables]
    for table in models:
        columns = {c["name"]: c for c in found.get_columns(table.name)}
        assert set(columns) == set(table.columns.keys()), table.name
        for column in table.columns:
            assert columns[column.name]["nullable"] == column.nullable, column.name
        indexes = {(i["name"], tuple(i["column_names"])) for i in found.get_indexes(table.name)}
        wanted = {(i.name, tuple(c.name for c in i.columns)) for i in table.indexes}
        assert wanted <= indexes, table.name
        uniques = {tuple(u["column_names"]) for u in found.get_unique_constraints(table.name)}
        for constraint in table.constraints:
            if isinstance(constraint, UniqueConstraint):
                assert tuple(c.name for c in constraint.columns) in uniques
    bookkeeping = {"schema_version", "schema_compat"}
    assert set(found.get_table_names()) == {*(t.name for t in models), *bookkeeping} | (
        {"sqlite_sequence"} & set(found.get_table_names())
    )


def _open_and_write(url: str, barrier: Any, name: str) -> None:
    """Child process: open the store at the same moment as its sibling, then write the same
    condition (racing on the insert) and an event."""
    barrier.wait(timeout=60)
    with open_store(url) as store:
        assert store.schema_version() == len(MIGRATIONS)
        store.set_condition("shared", xid(Status.WARN, f"race.{name}"), T0)
        store.add_event("shared", at=T0, kind="race", severity="INFO", source=name)


@pytest.mark.parametrize("round_", range(race_rounds(3)))
def test_concurrent_first_opens_by_two_processes(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, round_: int
) -> None:
    url = fresh_url(request, backend, tmp_path, f"race{round_}")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_open_and_write, args=(url, barrier, n)) for n in ("a", "b")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0], "a process failed; see its stderr above"

    assert [v for v, _ in versions(url)] == [m.version for m in MIGRATIONS]
    with open_store(url) as store:
        [cond] = store.conditions()
        assert cond.reason in ("race.a", "race.b")
        assert sorted(e.source for e in store.events()) == ["a", "b"]
        if backend == "sqlite":
            with store.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA integrity_check").scalar_one() == "ok"


# -- SQLite connection setup -----------------------------------------------------------------


def test_sqlite_connections_get_wal_busy_timeout_foreign_keys_and_normal_sync(
    tmp_path: Path,
) -> None:
    with open_store(f"sqlite:///{tmp_path / 'medic.db'}") as store:
        for _ in range(2):  # a fresh pooled connection each time is set up the same way
            with store.engine.connect() as conn:
                pragma = conn.exec_driver_sql
                assert pragma("PRAGMA journal_mode").scalar_one() == "wal"
                assert pragma("PRAGMA foreign_keys").scalar_one() == 1
                assert pragma("PRAGMA synchronous").scalar_one() == 1  # NORMAL
                assert pragma("PRAGMA busy_timeout").scalar_one() >= 1000
                conn.invalidate()


def test_open_store_creates_the_sqlite_directory(tmp_path: Path) -> None:
    path = tmp_path / "var" / "lib" / "medic" / "medic.db"
    open_store(f"sqlite:///{path}").close()
    assert path.exists()


def test_unreachable_databases_fail_on_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot create") as info:
        open_store(f"sqlite:///{blocker / 'medic.db'}")
    assert "\n" not in str(info.value)
    url = f"postgresql+psycopg://medic:secret@/medic?host={tmp_path / 'nosocket'}"
    with pytest.raises(StoreError, match="check \\[store\\] url") as info:
        open_store(url)
    assert "\n" not in str(info.value) and "secret" not in str(info.value)


# -- configuration ---------------------------------------------------------------------------


def config(store_table: dict[str, Any] | None = None) -> Any:
    data: dict[str, Any] = {"node": {"state_dir": "/srv/medic/{node}"}}
    if store_table is not None:
        data["store"] = store_table
    return parse_config(data, Path("/etc/medic/medic.toml"), "gpu07")


def test_settings_default_to_a_sqlite_file_in_the_state_dir() -> None:
    settings = store_settings(config())
    assert (
        settings.url
        == "sqlite:////srv/medic/gpu07/medic.db"
        == default_url(Path("/srv/medic/gpu07"))
    )
    assert settings.event_retention_days == 90


def test_settings_take_url_and_retention() -> None:
    url = "postgresql+psycopg://medic@db.example/medic"
    settings = store_settings(config({"url": url, "event_retention_days": 30}))
    assert (settings.url, settings.event_retention_days) == (url, 30)
    assert parse_url("postgresql://m@h/db").drivername == "postgresql+psycopg"


@pytest.mark.parametrize(
    ("table", "key", "words"),
    [
        ({"url": "mysql://h/db"}, "store.url", "unsupported database 'mysql'"),
        ({"url": "not a url"}, "store.url", "not a database URL"),
        ({"url": "sqlite://"}, "store.url", "in-memory"),
        ({"url": "postgresql+psycopg2://h/db"}, "store.url", "use postgresql+psycopg://"),
        ({"url": "postgresql+psycopg://h"}, "store.url", "no database name"),
        ({"url": 5}, "store.url", "expected a string"),
        ({"event_retention_days": 0}, "store.event_retention_days", "from 1 to 36500"),
        ({"event_retention_days": "90"}, "store.event_retention_days", "from 1 to 36500"),
        ({"retention": 3}, "store.retention", "unknown key"),
    ],
)
def test_bad_settings_name_the_key_and_the_fix(table: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        store_settings(config(table))
    message = str(info.value)
    assert message.startswith(f"/etc/medic/medic.toml: {key}: ")
    assert words in message and "; " in message and "\n" not in message


def test_open_store_rejects_a_bad_url_before_touching_anything() -> None:
    with pytest.raises(BadStoreURL, match="use sqlite:////absolute/path"):
        open_store("oracle://h/db")

"""RMA tickets (state machine, audit trail, one open per node and fault, re-qualification) on
SQLite and on a real PostgreSQL server, and the outbound webhook against real HTTP(S) servers
started here on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from medic_core import proc
from medic_core.config import ConfigError, parse_config
from medic_core.settings import WebhookSettings, WebhookTable
from medic_core.store import Store, open_store
from medic_core.store.engine import writer
from medic_core.store.models import RmaTicketRow
from remediation import tickets as rma
from remediation.tickets import Gpu, TicketError, TicketState
from remediation.webhook import (
    Sender,
    deliver_pending,
    outbox,
    sign,
    verify_signature,
)
from tests.pg import PostgresServer, pg_server  # noqa: F401  (pytest fixture)

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
DOCS = Path(__file__).parents[1] / "docs"
SECRET = b"s3cret-key"
GPU3 = Gpu(3, "GPU-8c5a6f1e-0000-4000-8000-000000000003", "1654321000003", "00000000:47:00.0")
EVIDENCE = rma.evidence_bundle(
    conditions=[{"type": "gpu.xid", "target": "3", "status": "CRITICAL", "reason": "gpu.xid.79"}],
    xids=[{"gpu": 3, "xid": 79, "kmsg": "NVRM: Xid (PCI:0000:47:00): 79, GPU has fallen off"}],
    nvml={"3": {"ecc.dbe.volatile": 0, "remapped_rows.failure": True}},
    checks=[{"check": "gpu_xid", "status": "CRITICAL", "message": "Xid 79 on GPU 3"}],
    history=[{"at": "2025-02-27T10:00:00+00:00", "fault_class": "gpu.xid.79"}],
    actions=[{"action": "gpu_reset", "attempt": 1, "returncode": 1}],
)


# -- stores on both backends -----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'medic.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as opened:
        yield opened


@pytest.fixture
def lite(tmp_path: Path) -> Iterator[Store]:
    """SQLite only: for the webhook tests, where the backend is not what is tested."""
    with open_store(f"sqlite:///{tmp_path / 'lite' / 'medic.db'}") as opened:
        yield opened


def open_one(store: Store, node: str = "gpu01", fault: str = "gpu.xid.79") -> rma.Ticket:
    return rma.open_ticket(
        store, node, fault, "GPU 3 fell off the bus", [GPU3], EVIDENCE, "ladder", at=T0
    )


# -- the state machine -----------------------------------------------------------------------

S = TicketState
# The contract, written out (not derived from NEXT_STATES): from -> the states it may go to.
LEGAL: dict[TicketState, set[TicketState]] = {
    S.OPEN: {S.SUBMITTED, S.CLOSED},
    S.SUBMITTED: {S.ACKNOWLEDGED, S.CLOSED},
    S.ACKNOWLEDGED: {S.REPLACED, S.CLOSED},
    S.REPLACED: {S.CLOSED},
    S.CLOSED: set(),
}
PATH_TO: dict[TicketState, list[TicketState]] = {
    S.OPEN: [],
    S.SUBMITTED: [S.SUBMITTED],
    S.ACKNOWLEDGED: [S.SUBMITTED, S.ACKNOWLEDGED],
    S.REPLACED: [S.SUBMITTED, S.ACKNOWLEDGED, S.REPLACED],
    S.CLOSED: [S.SUBMITTED, S.ACKNOWLEDGED, S.REPLACED, S.CLOSED],
}


def test_every_pair_of_states_is_legal_or_refused_as_the_table_says(store: Store) -> None:
    for number, (start, target) in enumerate((a, b) for a in TicketState for b in TicketState):
        ticket = open_one(store, node=f"n{number:02d}")
        for step in PATH_TO[start]:
            ticket = rma.transition(store, ticket.id, step, "tech", "on the way")
        assert ticket.state is start
        if target in LEGAL[start]:
            moved = rma.transition(store, ticket.id, target, "tech", "why not")
            assert moved.state is target, (start, target)
        else:
            with pytest.raises(TicketError) as caught:
                rma.transition(store, ticket.id, target, "tech", "why not")
            message = str(caught.value)
            assert "\n" not in message
            assert f"RMA ticket {ticket.id} (n{number:02d})" in message
            assert f"from {start.value} to {target.value}" in message
            legal = ", ".join(s.value for s in rma.NEXT_STATES[start]) or "none: it is closed"
            assert message.endswith(f"legal next states: {legal}"), message
            assert rma.get(store, ticket.id) == ticket  # nothing changed


def test_an_illegal_transition_names_ticket_states_and_the_way_forward(store: Store) -> None:
    ticket = open_one(store)
    with pytest.raises(TicketError) as caught:
        rma.transition(store, ticket.id, "replaced", "tech")
    assert str(caught.value) == (
        f"RMA ticket {ticket.id} (gpu01): cannot go from open to replaced; "
        "legal next states: submitted, closed"
    )
    with pytest.raises(TicketError, match="RMA ticket 999999 does not exist"):
        rma.transition(store, 999999, "submitted", "tech")
    with pytest.raises(TicketError, match="unknown ticket state 'lost'; use one of open, "):
        rma.transition(store, ticket.id, "lost", "tech")


def test_closing_after_replacement_resolves_and_closing_earlier_cancels_with_a_note(
    store: Store,
) -> None:
    first = open_one(store, node="a")
    for state in PATH_TO[S.CLOSED]:
        first = rma.transition(store, first.id, state, "vendor")  # no note needed
    assert (first.state, first.resolution, first.closed_at is not None) == (
        S.CLOSED,
        rma.REPLACED,
        True,
    )
    second = open_one(store, node="b")
    second = rma.transition(store, second.id, "submitted", "tech")
    with pytest.raises(TicketError, match="closing from submitted cancels it; give a note"):
        rma.transition(store, second.id, "closed", "tech", "  ")
    second = rma.transition(store, second.id, "closed", "tech", "fault was a loose cable")
    assert (second.state, second.resolution) == (S.CLOSED, rma.CANCELLED)


def test_the_audit_trail_records_every_change_in_order(store: Store) -> None:
    ticket = open_one(store)
    steps = [
        ("submitted", "medic", "sent to the ticketing system", "INC-4711"),
        ("acknowledged", "vendor", "RMA 88123 approved", None),
        ("replaced", "dc-tech", "GPU 3 swapped", None),
        ("closed", "alice", "", None),
    ]
    for number, (state, actor, note, external) in enumerate(steps, start=1):
        at = T0 + timedelta(hours=number)
        ticket = rma.transition(store, ticket.id, state, actor, note, external, at=at)
    assert ticket.external_id == "INC-4711"
    trail = rma.audit(store, ticket.id)
    assert [(e.from_state, e.to_state, e.actor, e.note) for e in trail] == [
        (None, S.OPEN, "ladder", "GPU 3 fell off the bus"),
        (S.OPEN, S.SUBMITTED, "medic", "sent to the ticketing system"),
        (S.SUBMITTED, S.ACKNOWLEDGED, "vendor", "RMA 88123 approved"),
        (S.ACKNOWLEDGED, S.REPLACED, "dc-tech", "GPU 3 swapped"),
        (S.REPLACED, S.CLOSED, "alice", ""),
    ]
    assert [e.at for e in trail] == [T0 + timedelta(hours=n) for n in range(5)]
    assert all(e.at.tzinfo is UTC for e in trail)
    assert (ticket.created_at, ticket.updated_at) == (T0, T0 + timedelta(hours=4))
    # One notification per change, each with its own delivery id, waiting in the outbox.
    queued = outbox(store, ticket.id)
    assert [d.event for d in queued] == ["ticket.opened", *["ticket.transition"] * 4]
    assert {d.state for d in queued} == {"pending"}
    assert len({d.delivery_id for d in queued}) == 5


def test_gpus_and_evidence_survive_the_round_trip(store: Store) -> None:
    ticket = rma.open_ticket(
        store,
        "gpu01",
        "gpu.xid.79",
        "two GPUs",
        [GPU3, {"index": 5, "uuid": "GPU-5", "serial": "S5", "pci_bus_id": "0000:c7:00.0"}],
        EVIDENCE,
        "ladder",
    )
    again = rma.get(store, ticket.id)
    assert again is not None
    assert again.gpus == (GPU3, Gpu(5, "GPU-5", "S5", "0000:c7:00.0"))
    assert again.evidence == EVIDENCE
    assert again.evidence["xids"][0]["kmsg"].startswith("NVRM: Xid")
    assert rma.get(store, 424242) is None


@pytest.mark.parametrize(
    ("gpus", "evidence", "error"),
    [
        ([{"index": -1}], {}, "GPU index must be a whole number >= 0"),
        ([{"index": 0, "bus": "x"}], {}, "unknown keys \\['bus'\\]"),
        ([], {"temp": float("nan")}, "not JSON-serialisable"),
        ([], {"log": "a\x00b"}, "NUL character"),
    ],
)
def test_bad_gpus_or_evidence_are_refused_before_anything_is_written(
    lite: Store, gpus: list[Any], evidence: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        rma.open_ticket(lite, "gpu01", "gpu.xid.79", "x", gpus, evidence, "ladder")
    assert rma.list_tickets(lite) == []


# -- one open ticket per node and fault class ------------------------------------------------


def test_opening_a_second_ticket_returns_the_open_one(store: Store) -> None:
    first = open_one(store)
    again = rma.open_ticket(store, "gpu01", "gpu.xid.79", "again", [], {"new": 1}, "ladder")
    assert again == first  # unchanged: the vendor already has that evidence
    other_fault = open_one(store, fault="gpu.ecc.dbe")
    other_node = open_one(store, node="gpu02")
    assert len({first.id, other_fault.id, other_node.id}) == 3
    assert len(rma.audit(store, first.id)) == 1
    rma.transition(store, first.id, "closed", "alice", "duplicate of a vendor case")
    reopened = open_one(store)
    assert reopened.id != first.id and reopened.state is S.OPEN


def test_the_database_itself_allows_one_open_ticket_per_node_and_fault(store: Store) -> None:
    """The partial unique index, not only the Python check, holds the rule."""
    ticket = open_one(store)
    row = {
        "node": "gpu01",
        "fault_class": "gpu.xid.79",
        "summary": "",
        "gpus": [],
        "evidence": {},
        "resolution": "",
        "requalify": False,
        "external_id": "",
        "external_url": "",
        "created_at": T0,
        "updated_at": T0,
    }
    with pytest.raises(IntegrityError), writer(store.engine).begin() as conn:
        conn.execute(insert(RmaTicketRow).values(state="submitted", **row))
    with writer(store.engine).begin() as conn:  # closed duplicates are history: allowed
        conn.execute(insert(RmaTicketRow).values(state="closed", **row))
    assert [t.id for t in rma.list_tickets(store, state=["open", "submitted"])] == [ticket.id]


def test_concurrent_opens_make_one_ticket(store: Store) -> None:
    with ThreadPoolExecutor(max_workers=6) as pool:
        ids = set(pool.map(lambda _: open_one(store).id, range(12)))
    assert len(ids) == 1
    [only] = rma.list_tickets(store)
    assert len(rma.audit(store, only.id)) == 1


def test_the_insert_that_loses_a_race_does_nothing(store: Store) -> None:
    """What `open_ticket` does when another writer inserted between its read and its insert
    (the threads above rarely hit that window, SQLite's write lock never)."""
    ticket = open_one(store)
    values = {
        "node": "gpu01",
        "state": "open",
        "fault_class": "gpu.xid.79",
        "summary": "",
        "gpus": [],
        "evidence": {},
        "resolution": "",
        "requalify": False,
        "external_id": "",
        "external_url": "",
        "created_at": T0,
        "updated_at": T0,
    }
    with writer(store.engine).begin() as conn:
        statement = rma._insert_if_none_open(store.backend, values)
        assert conn.execute(statement).first() is None
    assert [t.id for t in rma.list_tickets(store)] == [ticket.id]


def test_list_tickets_filters_by_state_and_node(store: Store) -> None:
    a = open_one(store, node="a")
    b = rma.transition(store, open_one(store, node="b").id, "submitted", "medic")
    c = open_one(store, node="a", fault="gpu.nvlink")
    assert [t.id for t in rma.list_tickets(store)] == [a.id, b.id, c.id]
    assert [t.id for t in rma.list_tickets(store, state="open")] == [a.id, c.id]
    assert [t.id for t in rma.list_tickets(store, state=S.SUBMITTED)] == [b.id]
    assert [t.id for t in rma.list_tickets(store, node="a", state=["open"])] == [a.id, c.id]
    with pytest.raises(TicketError, match="unknown ticket state"):
        rma.list_tickets(store, state="gone")


# -- re-qualification ------------------------------------------------------------------------


def test_closing_a_ticket_holds_the_node_until_it_is_requalified(store: Store) -> None:
    ticket = open_one(store)
    assert not rma.needs_requalification(store, "gpu01")
    for state in PATH_TO[S.REPLACED]:
        ticket = rma.transition(store, ticket.id, state, "vendor")
    assert not rma.needs_requalification(store, "gpu01")  # still away, not back yet
    ticket = rma.transition(store, ticket.id, "closed", "dc-tech", "new GPU in slot 3")
    assert ticket.requalify
    assert rma.needs_requalification(store, "gpu01")
    assert not rma.needs_requalification(store, "gpu02")
    assert rma.requalified(store, "gpu01", "healthcheck", "deep checks passed") == [ticket.id]
    assert not rma.needs_requalification(store, "gpu01")
    assert rma.requalified(store, "gpu01", "healthcheck") == []
    last = rma.audit(store, ticket.id)[-1]
    assert (last.from_state, last.to_state, last.actor, last.note) == (
        S.CLOSED,
        S.CLOSED,
        "healthcheck",
        "deep checks passed",
    )


def test_a_cancelled_ticket_also_needs_requalification(store: Store) -> None:
    ticket = open_one(store)
    rma.transition(store, ticket.id, "closed", "alice", "vendor says no fault found")
    assert rma.needs_requalification(store, "gpu01")


# -- a real HTTP receiver --------------------------------------------------------------------


@dataclasses.dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: bytes


class Receiver:
    """An HTTP(S) server on 127.0.0.1 answering with scripted (status, headers) in turn,
    the last one repeated; it records what it was sent."""

    def __init__(self, script: list[tuple[int, dict[str, str]]], tls: ssl.SSLContext | None):
        self.script = list(script)
        self.received: list[Received] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                receiver.received.append(Received(time.monotonic(), dict(self.headers), body))
                status, headers = (
                    receiver.script.pop(0) if len(receiver.script) > 1 else receiver.script[0]
                )
                answer = json.dumps({"status": status}).encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/medic/rma"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[Receiver] = []

    def start(*script: tuple[int, dict[str, str]], tls: ssl.SSLContext | None = None) -> Receiver:
        receiver = Receiver(list(script) or [(200, {})], tls)
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.close()


def settings_for(url: str, **overrides: Any) -> WebhookSettings:
    values: dict[str, Any] = {
        "url": url,
        "secret": SECRET,
        "timeout": 5.0,
        "max_attempts": 3,
        "backoff_base": 0.01,
        "backoff_cap": 0.05,
        "retry_after_max": 5.0,
    }
    values.update(overrides)
    return WebhookSettings(**values)


class Sleeps:
    """Records the waits the sender asks for, and waits them."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        time.sleep(seconds)


def test_a_delivery_is_signed_and_carries_ticket_transition_and_evidence(
    lite: Store, serve: Any
) -> None:
    receiver = serve((200, {}))
    ticket = open_one(lite)
    [done] = deliver_pending(lite, settings_for(receiver.url))
    assert (done.state, done.attempts, done.last_status, done.last_error) == (
        "delivered",
        1,
        200,
        "",
    )
    [got] = receiver.received
    assert got.headers["Content-Type"] == "application/json"
    assert verify_signature(SECRET, got.body, got.headers["X-Medic-Signature"])
    assert not verify_signature(b"wrong", got.body, got.headers["X-Medic-Signature"])
    assert got.headers["X-Medic-Signature"] == sign(SECRET, got.body)
    assert str(uuid.UUID(got.headers["X-Medic-Delivery"])) == done.delivery_id
    assert got.headers["X-Medic-Event"] == "ticket.opened"
    payload = json.loads(got.body)
    assert payload["event"] == "ticket.opened"
    assert payload["delivery_id"] == done.delivery_id
    assert payload["ticket"]["id"] == ticket.id
    assert payload["ticket"]["gpus"] == [GPU3.as_dict()]
    assert payload["transition"] == {
        "from": None,
        "to": "open",
        "actor": "ladder",
        "note": "GPU 3 fell off the bus",
        "at": T0.isoformat(),
    }
    assert payload["evidence"] == EVIDENCE
    assert deliver_pending(lite, settings_for(receiver.url)) == []  # nothing left
    assert len(receiver.received) == 1


def test_a_notification_survives_a_crash_between_the_change_and_the_post(
    store_url: str, serve: Any
) -> None:
    receiver = serve((200, {}))
    with open_store(store_url) as first:  # the process that opened it dies before sending
        ticket = open_one(first)
        rma.transition(first, ticket.id, "submitted", "medic", "INC-1", "INC-1")
    with open_store(store_url) as second:
        done = deliver_pending(second, settings_for(receiver.url))
        assert [d.event for d in done] == ["ticket.opened", "ticket.transition"]
        assert {d.state for d in done} == {"delivered"}
    bodies = [json.loads(r.body) for r in receiver.received]
    assert [b["ticket"]["state"] for b in bodies] == ["open", "submitted"]
    assert bodies[1]["ticket"]["external_id"] == "INC-1"


def test_a_500_then_a_200_is_retried_with_backoff(lite: Store, serve: Any) -> None:
    receiver = serve((500, {}), (200, {}))
    open_one(lite)
    sleeps = Sleeps()
    settings = settings_for(receiver.url)
    [done] = deliver_pending(lite, settings, sender=Sender(settings, sleep=sleeps))
    assert (done.state, done.attempts, done.last_status) == ("delivered", 2, 200)
    assert len(sleeps.asked) == 1 and 0.005 <= sleeps.asked[0] <= 0.01  # base, half jittered
    first, second = receiver.received
    assert first.body == second.body  # the same bytes, the same delivery id
    assert first.headers["X-Medic-Delivery"] == second.headers["X-Medic-Delivery"]


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    settings = settings_for("http://127.0.0.1:9/", backoff_base=1.0, backoff_cap=8.0)
    low = Sender(settings, rng=lambda: 0.0)
    high = Sender(settings, rng=lambda: 1.0)
    assert [low.backoff(n) for n in range(1, 7)] == [0.5, 1, 2, 4, 4, 4]
    assert [high.backoff(n) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]


def test_a_400_is_not_retried_and_is_marked_failed(lite: Store, serve: Any) -> None:
    receiver = serve((400, {}), (200, {}))
    ticket = open_one(lite)
    sleeps = Sleeps()
    settings = settings_for(receiver.url)
    [done] = deliver_pending(lite, settings, sender=Sender(settings, sleep=sleeps))
    assert (done.state, done.attempts, done.last_status) == ("failed", 1, 400)
    assert done.last_error.startswith("HTTP 400 Bad Request:")
    assert sleeps.asked == [] and len(receiver.received) == 1
    assert deliver_pending(lite, settings) == []  # a refusal stays refused...
    assert rma.retry_failed(lite, ticket.id) == 1  # ...until someone fixed the cause
    [again] = deliver_pending(lite, settings)
    assert (again.state, again.attempts, again.last_status) == ("delivered", 2, 200)


def test_medic_rma_retry_queues_the_refused_deliveries_again(
    lite: Store, serve: Any, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from cli.rma import rma_command

    receiver = serve((400, {}), (200, {}))
    ticket = open_one(lite)
    settings = settings_for(receiver.url)
    [refused] = deliver_pending(lite, settings)
    assert refused.state == "failed"
    url = f"sqlite:///{tmp_path / 'lite' / 'medic.db'}"
    config = tmp_path / "medic.toml"
    config.write_text("")
    args = ["--store", url, "--config", str(config)]
    missing = CliRunner().invoke(rma_command, ["retry", "999", *args])
    assert missing.exit_code == 1 and "999" in missing.stderr
    done = CliRunner().invoke(rma_command, ["retry", str(ticket.id), *args])
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"1 refused notification(s) of RMA ticket {ticket.id} queued")
    [again] = deliver_pending(lite, settings)
    assert (again.state, again.last_status) == ("delivered", 200)


def test_a_redirect_is_not_followed(lite: Store, serve: Any) -> None:
    receiver = serve((307, {"Location": "http://127.0.0.1:9/elsewhere"}))
    open_one(lite)
    [done] = deliver_pending(lite, settings_for(receiver.url))
    assert (done.state, done.attempts, done.last_status) == ("failed", 1, 307)
    assert len(receiver.received) == 1


def test_a_server_that_never_answers_times_out_and_stays_pending(lite: Store) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nobody ever reads or answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        settings = settings_for(url, timeout=0.3, max_attempts=2, backoff_cap=60.0)
        open_one(lite)
        started = time.monotonic()
        [done] = deliver_pending(lite, settings)
        elapsed = time.monotonic() - started
    finally:
        silent.close()
    assert (done.state, done.attempts, done.last_status) == ("pending", 2, None)
    assert done.last_error == "no answer within 0.3s"
    assert 0.6 <= elapsed < 5
    # Not tried again before its next attempt time: backoff_cap (60 s) after the round.
    assert deliver_pending(lite, settings) == []
    [row] = outbox(lite)
    assert (row.state, row.attempts) == ("pending", 2)


def test_retry_after_is_honoured(lite: Store, serve: Any) -> None:
    receiver = serve((429, {"Retry-After": "1"}), (200, {}))
    open_one(lite)
    sleeps = Sleeps()
    settings = settings_for(receiver.url)
    [done] = deliver_pending(lite, settings, sender=Sender(settings, sleep=sleeps))
    assert (done.state, done.attempts) == ("delivered", 2)
    assert sleeps.asked == [1.0]  # not the 0.01 s backoff
    first, second = receiver.received
    assert second.at - first.at >= 1.0


def test_a_retry_after_too_long_to_wait_is_left_for_a_later_round(lite: Store, serve: Any) -> None:
    receiver = serve((503, {"Retry-After": "3600"}), (200, {}))
    open_one(lite)
    sleeps = Sleeps()
    settings = settings_for(receiver.url)
    [done] = deliver_pending(lite, settings, sender=Sender(settings, sleep=sleeps))
    assert (done.state, done.attempts, done.last_status) == ("pending", 1, 503)
    assert sleeps.asked == []
    assert deliver_pending(lite, settings) == []  # due in an hour
    later = datetime.now(UTC) + timedelta(hours=1, minutes=1)
    [again] = deliver_pending(lite, settings, now=lambda: later)
    assert again.state == "delivered"


def test_a_ticket_s_events_go_out_in_order(lite: Store, serve: Any) -> None:
    receiver = serve((503, {}))
    ticket = open_one(lite)
    rma.transition(lite, ticket.id, "submitted", "medic")
    other = open_one(lite, node="gpu02")
    settings = settings_for(receiver.url, max_attempts=1)
    done = deliver_pending(lite, settings)
    # The first event of `ticket` failed, so its second was held back; gpu02's was tried.
    assert [(d.ticket_id, d.event, d.state) for d in done] == [
        (ticket.id, "ticket.opened", "pending"),
        (other.id, "ticket.opened", "pending"),
    ]


# -- HTTPS -------------------------------------------------------------------------------------


def _openssl(*args: str | Path) -> None:
    result = proc.run(["openssl", *(str(a) for a in args)], timeout=60)
    assert result.ok, result.stderr


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A private CA and a certificate for 127.0.0.1 signed by it, made with openssl."""
    d = tmp_path_factory.mktemp("tls")
    ca_key, ca, key, csr, cert, ext = (
        d / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem", "srv.ext")
    )
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *curve, "-keyout", ca_key, "-out", ca, "-days", "2",
             "-subj", "/CN=Medic test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    _openssl("req", *curve, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    ext.write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", ext)  # fmt: skip
    return {"ca": ca, "cert": cert, "key": key}


def _server_tls(files: dict[str, Path]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files["cert"], files["key"])
    return context


def test_https_verifies_the_server_against_the_configured_ca(
    lite: Store, serve: Any, tls_files: dict[str, Path]
) -> None:
    receiver = serve((200, {}), tls=_server_tls(tls_files))
    open_one(lite)
    [done] = deliver_pending(lite, settings_for(receiver.url, ca_file=tls_files["ca"]))
    assert (done.state, done.last_status) == ("delivered", 200)
    assert verify_signature(
        SECRET, receiver.received[0].body, receiver.received[0].headers["X-Medic-Signature"]
    )


def test_https_without_the_ca_is_refused_and_kept_for_later(
    lite: Store, serve: Any, tls_files: dict[str, Path]
) -> None:
    receiver = serve((200, {}), tls=_server_tls(tls_files))
    open_one(lite)
    [done] = deliver_pending(lite, settings_for(receiver.url))  # system CAs only
    assert (done.state, done.attempts, done.last_status) == ("pending", 1, None)
    assert done.last_error.startswith("TLS: "), done.last_error
    assert "certificate" in done.last_error
    assert receiver.received == []  # nothing was sent to an unverified server


# -- configuration ---------------------------------------------------------------------------


def config(tmp_path: Path, webhook: dict[str, Any] | None) -> Any:
    tables: dict[str, Any] = {"remediation": {} if webhook is None else {"webhook": webhook}}
    return parse_config(tables, tmp_path / "medic.toml", "gpu01")


def test_settings_from_the_webhook_table(tmp_path: Path) -> None:
    assert WebhookSettings.from_config(config(tmp_path, None)) is None
    secret_file = tmp_path / "webhook.secret"
    secret_file.write_text("from-a-file\n")
    settings = WebhookSettings.from_config(
        config(tmp_path, {"url": "https://t.example/x", "secret_file": str(secret_file)})
    )
    assert settings is not None
    assert settings.secret == b"from-a-file"
    assert (settings.verify, settings.ca_file, settings.max_attempts) == (True, None, 5)
    assert "from-a-file" not in repr(settings)
    assert settings.ssl_context().verify_mode is ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({"secret": "k"}, "remediation.webhook.url: missing; give the receiver's URL"),
        ({"url": "ftp://x/", "secret": "k"}, "remediation.webhook.url: not an http(s) URL"),
        ({"url": "https://x/"}, "remediation.webhook.secret: give exactly one of secret and"),
        (
            {"url": "https://x/", "secret": "k", "secret_file": "/f"},
            "remediation.webhook.secret: give exactly one",
        ),
        (
            {"url": "https://x/", "secret_file": "/nonexistent/medic.secret"},
            "remediation.webhook.secret_file: cannot read /nonexistent/medic.secret",
        ),
        ({"url": "https://x/", "secret": "k", "timeout": 0}, "remediation.webhook.timeout"),
        ({"url": "https://x/", "secret": "k", "verify": "yes"}, "expected true or false"),
        ({"url": "https://x/", "secret": "k", "retries": 3}, "remediation.webhook.retries: unk"),
        (
            {"url": "https://x/", "secret": "k", "ca_file": "/nonexistent/ca.pem"},
            "remediation.webhook.ca_file: cannot load /nonexistent/ca.pem",
        ),
        (
            {"url": "https://x/", "secret": "k", "ca_file": "/x", "verify": False},
            "remediation.webhook.ca_file: set while verify = false",
        ),
    ],
)
def test_bad_webhook_settings_name_file_key_and_fix(
    tmp_path: Path, table: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        WebhookSettings.from_config(config(tmp_path, table))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'medic.toml'}: ")
    assert error in message and "\n" not in message


# -- the docs ------------------------------------------------------------------------------------


def test_the_docs_webhook_tables_validate() -> None:
    import tomllib

    from healthd.checks.base import parse_check_config

    blocks = re.findall(r"```toml\n(.*?)```", (DOCS / "rma.md").read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        table = tomllib.loads(block)["remediation"]["webhook"]
        parse_check_config(WebhookTable, table, prefix="remediation.webhook", source=None)  # type: ignore[type-var]


def test_the_docs_receiver_snippet_verifies_a_real_signature() -> None:
    [snippet] = re.findall(r"```python\n(.*?)```", (DOCS / "rma.md").read_text(), flags=re.S)
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)
    body = b'{"event":"ticket.opened"}'
    assert namespace["verify"](SECRET, body, sign(SECRET, body))
    assert not namespace["verify"](SECRET, body + b" ", sign(SECRET, body))

"""RMA tickets (state machine, audit trail, one open per node and fault, re-qualification) on
SQLite and on a real PostgreSQL server, and the outbound webhook against real HTTP(S) servers
started here on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from medic_core.settings import WebhookSettings
from medic_core.store import Store, open_store
from medic_core.store.engine import writer
from medic_core.store.models import RmaTicketRow
from remediation import tickets as rma
from remediation.tickets import Gpu, TicketError, TicketState
from remediation.tickets.lifecycle import _insert_if_none_open
from remediation.webhook import deliver_round, outbox
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
        statement = _insert_if_none_open(store.backend, values)
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


# -- the outbox (the webhook itself: tests/test_webhook.py) ------------------------------------


class Recorder(BaseHTTPRequestHandler):
    """A receiver on 127.0.0.1 that answers 200 and keeps the bodies."""

    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[bytes]]]:
    bodies: list[bytes] = []
    handler = type("Handler", (Recorder,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/medic/rma", bodies
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_a_notification_survives_a_crash_between_the_change_and_the_post(
    store_url: str, receiver: tuple[str, list[bytes]]
) -> None:
    url, received = receiver
    settings = WebhookSettings(url=url, secret=b"k", timeout=5.0, allow_http=True)
    with open_store(store_url) as first:  # the process that opened it dies before sending
        ticket = open_one(first)
        rma.transition(first, ticket.id, "submitted", "medic", "INC-1", "INC-1")
    with open_store(store_url) as second:
        done = deliver_round(second, settings)
        assert [d.event for d in done] == ["ticket.opened", "ticket.transition"]
        assert {d.state for d in done} == {"delivered"}
    bodies = [json.loads(body) for body in received]
    assert [b["ticket"]["state"] for b in bodies] == ["open", "submitted"]
    assert bodies[1]["ticket"]["external_id"] == "INC-1"


# -- the rails: one read of what keeps a node out ----------------------------------------------


def test_the_rails_read_agrees_with_the_separate_reads_through_a_tickets_life(
    store: Store,
) -> None:
    from remediation.episodes import CLOSED_STATES, EpisodeStore

    episodes = EpisodeStore(store)

    def agrees(node: str) -> rma.NodeRails:
        rails = rma.read_rails(store, node)
        assert rails.open_tickets == rma.open_tickets(store, node)
        assert rails.requalify == rma.needs_requalification(store, node)
        assert rails.episode == episodes.open_for(node)
        return rails

    assert agrees("gpu01") == rma.NodeRails(None, [], False)
    opened = episodes.open_episode(
        "gpu01", state="waiting_idle", fault_class="gpu.xid.79", target="gpu:3",
        check="gpu_xid", recommendation="reset_gpu", rung=1, message="", evidence={},
    )  # fmt: skip
    ticket = open_one(store)
    open_one(store, node="gpu02")  # another node's ticket is not this node's
    assert agrees("gpu01").open_tickets == [ticket.id]
    assert agrees("gpu01").episode == opened
    for state in PATH_TO[S.CLOSED]:
        ticket = rma.transition(store, ticket.id, state, "vendor")
        agrees("gpu01")
    episodes.update(opened.id, state=sorted(CLOSED_STATES)[0])
    assert agrees("gpu01") == rma.NodeRails(None, [], True)
    rma.requalified(store, "gpu01", "healthcheck")
    assert agrees("gpu01") == rma.NodeRails(None, [], False)
    assert agrees("gpu02").open_tickets and not agrees("gpu02").requalify

"""The outbound webhook against real HTTP(S) servers started here on 127.0.0.1: signing and the
documented receiver (docs/examples/webhook_receiver.py), retries, the per-attempt deadline,
the delivery thread that keeps the ladder thread free, receivers that answer anything at all,
and the `[remediation.webhook]` settings."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import http.client
import importlib.util
import json
import logging
import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from medic_core import proc
from medic_core.config import ConfigError, parse_config
from medic_core.settings import WebhookSettings, WebhookTable
from medic_core.store import Store, open_store
from remediation import tickets as rma
from remediation.tickets import Gpu
from remediation.webhook import (
    Dispatcher,
    Sender,
    deliver_pending,
    deliver_round,
    dispatcher,
    outbox,
    sign,
    verify_signature,
)
from tests.conftest import poll

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


def load_example() -> ModuleType:
    path = DOCS / "examples" / "webhook_receiver.py"
    spec = importlib.util.spec_from_file_location("webhook_receiver", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


receiver_example = load_example()


@pytest.fixture
def lite(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'lite' / 'medic.db'}") as opened:
        yield opened


def open_one(store: Store, node: str = "gpu01", fault: str = "gpu.xid.79") -> rma.Ticket:
    return rma.open_ticket(
        store, node, fault, "GPU 3 fell off the bus", [GPU3], EVIDENCE, "ladder", at=T0
    )


def settings_for(url: str, **overrides: Any) -> WebhookSettings:
    values: dict[str, Any] = {
        "url": url,
        "secret": SECRET,
        "timeout": 5.0,
        "max_attempts": 3,
        "backoff_base": 0.01,
        "backoff_cap": 0.05,
        "retry_after_max": 5.0,
        "allow_http": True,  # the receivers here are plain http on 127.0.0.1 (https: below)
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


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


# -- receivers -------------------------------------------------------------------------------


@dataclasses.dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: bytes


class Receiver:
    """An HTTP(S) server on 127.0.0.1 answering with scripted (status, headers) in turn,
    the last one repeated; it records what it was sent. While `hold` is clear, each request
    waits for it (at most 5 s) before answering."""

    def __init__(self, script: list[tuple[int, dict[str, str]]], tls: ssl.SSLContext | None):
        self.script = list(script)
        self.received: list[Received] = []
        self.hold = threading.Event()
        self.hold.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                receiver.received.append(Received(time.monotonic(), dict(self.headers), body))
                receiver.hold.wait(5)
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
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(*script: tuple[int, dict[str, str]], tls: ssl.SSLContext | None = None) -> Receiver:
        receiver = Receiver(list(script) or [(200, {})], tls)
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.close()


class RawServer:
    """A TCP server on 127.0.0.1 that reads each request and answers with whatever bytes
    `respond(request)` yields, waiting `gap` seconds between chunks (a dripping receiver).
    It stops by itself after `limit` seconds per connection."""

    def __init__(
        self, respond: Callable[[bytes], Iterator[bytes]], gap: float = 0.0, limit: float = 5.0
    ) -> None:
        self.respond, self.gap, self.limit = respond, gap, limit
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        ends = time.monotonic() + self.limit
        conn.settimeout(1.0)
        request = b""
        try:
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                request += chunk
            head, _, body = request.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            for piece in self.respond(head + b"\r\n\r\n" + body):
                if self.stop.is_set() or time.monotonic() > ends:
                    return
                conn.sendall(piece)
                if self.gap:
                    self.stop.wait(self.gap)
        except OSError:
            return  # the client went away: what a cut-off attempt looks like from here

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(timeout=5)


@pytest.fixture
def raw() -> Iterator[Callable[..., RawServer]]:
    started: list[RawServer] = []

    def start(respond: Callable[[bytes], Iterator[bytes]], **kwargs: Any) -> RawServer:
        server = RawServer(respond, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@dataclasses.dataclass
class ExampleReceiver:
    """docs/examples/webhook_receiver.py, running on 127.0.0.1."""

    url: str
    events: list[tuple[str, dict[str, Any]]]
    verifier: Any
    server: ThreadingHTTPServer


@pytest.fixture
def example_receiver() -> Iterator[Callable[..., ExampleReceiver]]:
    started: list[tuple[ThreadingHTTPServer, threading.Thread]] = []

    def start(
        clock: Callable[[], float] = time.time,
        on_event: Callable[[dict[str, Any], str], None] | None = None,
    ) -> ExampleReceiver:
        events: list[tuple[str, dict[str, Any]]] = []

        def record(event: dict[str, Any], delivery: str) -> None:
            if on_event is not None:
                on_event(event, delivery)  # raises: not stored
            events.append((delivery, event))

        verifier = receiver_example.Verifier(SECRET, clock=clock)
        server = receiver_example.make_server(("127.0.0.1", 0), verifier, record)
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        started.append((server, thread))
        url = f"http://127.0.0.1:{server.server_address[1]}/medic"
        return ExampleReceiver(url, events, verifier, server)

    yield start
    for server, thread in started:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """One plain POST, as an attacker replaying or altering a captured request would."""
    port = int(url.split(":")[2].split("/")[0])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", "/medic", body, headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


# -- signing -----------------------------------------------------------------------------------


def test_the_signature_covers_timestamp_delivery_id_and_body() -> None:
    body, delivery = b'{"event":"ticket.opened"}', "5b0f4c59-8f0e-4c8a-9d2e-0e6f1c3b7a11"
    signed = b"1700000000.5b0f4c59-8f0e-4c8a-9d2e-0e6f1c3b7a11." + body  # as docs/rma.md says
    header = sign(SECRET, "1700000000", delivery, body)
    assert header == "v1=" + hmac.new(SECRET, signed, hashlib.sha256).hexdigest()
    assert verify_signature(SECRET, "1700000000", delivery, body, header)
    assert not verify_signature(b"wrong", "1700000000", delivery, body, header)
    assert not verify_signature(SECRET, "1700000001", delivery, body, header)
    assert not verify_signature(SECRET, "1700000000", delivery[:-1] + "2", body, header)
    assert not verify_signature(SECRET, "1700000000", delivery, body + b" ", header)
    assert not verify_signature(SECRET, "1700000000", delivery, body, "v1=ü")  # never raises


def test_a_delivery_is_signed_and_carries_ticket_transition_and_evidence(
    lite: Store, serve: Any
) -> None:
    receiver = serve((200, {}))
    ticket = open_one(lite)
    before = int(time.time())
    [done] = deliver_round(lite, settings_for(receiver.url))
    assert (done.state, done.attempts, done.last_status, done.last_error) == (
        "delivered",
        1,
        200,
        "",
    )
    [got] = receiver.received
    h = got.headers
    assert h["Content-Type"] == "application/json"
    assert before <= int(h["X-Medic-Timestamp"]) <= time.time()
    assert str(uuid.UUID(h["X-Medic-Delivery"])) == done.delivery_id
    assert h["X-Medic-Signature"] == sign(
        SECRET, h["X-Medic-Timestamp"], h["X-Medic-Delivery"], got.body
    )
    assert h["X-Medic-Event"] == "ticket.opened"
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
    assert deliver_round(lite, settings_for(receiver.url)) == []  # nothing left
    assert len(receiver.received) == 1


# -- the documented receiver -------------------------------------------------------------------


def test_the_receiver_example_takes_a_real_delivery(lite: Store, example_receiver: Any) -> None:
    receiver = example_receiver()
    ticket = open_one(lite)
    [done] = deliver_round(lite, settings_for(receiver.url))
    assert (done.state, done.last_status) == ("delivered", 200)
    [(delivery, event)] = receiver.events
    assert delivery == done.delivery_id
    assert (event["event"], event["ticket"]["id"]) == ("ticket.opened", ticket.id)


def test_the_receiver_example_rejects_altered_and_replayed_requests(
    serve: Any, example_receiver: Any
) -> None:
    capture = serve((200, {}))
    Sender(settings_for(capture.url)).post_once(b'{"event":"ticket.opened"}', "d-1", "x")
    [got] = capture.received  # a genuine request, as someone on the path would record it
    headers = {k: v for k, v in got.headers.items() if k.startswith(("X-Medic", "Content-T"))}
    receiver = example_receiver()

    def altered(**changes: str) -> tuple[int, dict[str, Any]]:
        return post(receiver.url, got.body, {**headers, **changes})

    rejected = (401, {"status": 401, "detail": "bad signature"})
    assert altered(**{"X-Medic-Delivery": "d-2"}) == rejected
    later = str(int(headers["X-Medic-Timestamp"]) + 1)
    assert altered(**{"X-Medic-Timestamp": later})[1]["detail"] == "bad signature"
    assert post(receiver.url, got.body + b" ", headers)[1]["detail"] == "bad signature"
    assert altered(**{"X-Medic-Signature": ""})[0] == 401
    assert receiver.events == []
    assert post(receiver.url, got.body, headers) == (200, {"status": 200, "detail": "stored"})
    replay = post(receiver.url, got.body, headers)  # the same request again: not handled twice
    assert replay == (200, {"status": 200, "detail": "duplicate: already handled"})
    assert [delivery for delivery, _ in receiver.events] == ["d-1"]


def skewed(seconds: float) -> Callable[[], float]:
    """A sender's clock `seconds` away from the receiver's."""
    return lambda: time.time() + seconds


def test_the_receiver_example_rejects_a_stale_timestamp(example_receiver: Any) -> None:
    receiver = example_receiver()
    body = b'{"event":"ticket.opened"}'
    for skew in (-301, 301):  # five minutes and a second, either way: refused
        sender = Sender(settings_for(receiver.url), clock=skewed(skew))
        attempt = sender.post_once(body, f"d{skew}", "ticket.opened")
        assert attempt.status == 401
        assert attempt.error.endswith('{"status": 401, "detail": "stale timestamp"}')
    for skew in (-290, 290):  # within the window: taken
        sender = Sender(settings_for(receiver.url), clock=skewed(skew))
        assert sender.post_once(body, f"ok{skew}", "ticket.opened").status == 200
    assert [delivery for delivery, _ in receiver.events] == ["ok-290", "ok290"]


def test_the_receiver_example_handles_medic_s_retry_after_a_failure(
    lite: Store, example_receiver: Any
) -> None:
    """An event the ticketing system failed to store (500) is not remembered as handled:
    Medic's retry, same delivery id and a fresh signature, is handled."""
    failures = [RuntimeError("ticketing system down")]

    def flaky(event: dict[str, Any], delivery: str) -> None:
        if failures:
            raise failures.pop()

    receiver = example_receiver(on_event=flaky)
    open_one(lite)
    [done] = deliver_round(lite, settings_for(receiver.url))
    assert (done.state, done.attempts) == ("delivered", 2)
    assert [delivery for delivery, _ in receiver.events] == [done.delivery_id]


def test_the_docs_show_the_receiver_example_s_checks() -> None:
    [snippet] = re.findall(r"```python\n(.*?)```", (DOCS / "rma.md").read_text(), flags=re.S)
    source = (DOCS / "examples" / "webhook_receiver.py").read_text()
    for definition in re.split(r"\n{2,}", snippet.strip()):
        assert definition in source, definition  # the docs show the example's own code
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)
    body, ts = b'{"event":"ticket.opened"}', str(int(time.time()))
    header = sign(SECRET, ts, "d-1", body)
    assert namespace["signature_ok"](SECRET, ts, "d-1", body, header)
    assert not namespace["signature_ok"](SECRET, ts, "d-1", body + b" ", header)
    assert namespace["fresh"](ts, time.time())
    assert not namespace["fresh"](ts, time.time() + 301)
    assert not namespace["fresh"]("9" * 5000, time.time())


# -- retries and refusals ------------------------------------------------------------------------


def test_a_500_then_a_200_is_retried_with_backoff(lite: Store, serve: Any) -> None:
    receiver = serve((500, {}), (200, {}))
    open_one(lite)
    sleeps = Sleeps()
    settings = settings_for(receiver.url)
    [done] = deliver_round(lite, settings, sender=Sender(settings, sleep=sleeps))
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
    [done] = deliver_round(lite, settings, sender=Sender(settings, sleep=sleeps))
    assert (done.state, done.attempts, done.last_status) == ("failed", 1, 400)
    assert done.last_error.startswith("HTTP 400 Bad Request:")
    assert sleeps.asked == [] and len(receiver.received) == 1
    assert deliver_round(lite, settings) == []  # a refusal stays refused...
    assert rma.retry_failed(lite, ticket.id) == 1  # ...until someone fixed the cause
    [again] = deliver_round(lite, settings)
    assert (again.state, again.attempts, again.last_status) == ("delivered", 2, 200)


def test_medic_rma_retry_queues_the_refused_deliveries_again(
    lite: Store, serve: Any, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from cli.rma import rma_command

    receiver = serve((400, {}), (200, {}))
    ticket = open_one(lite)
    settings = settings_for(receiver.url)
    [refused] = deliver_round(lite, settings)
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
    [again] = deliver_round(lite, settings)
    assert (again.state, again.last_status) == ("delivered", 200)


def test_a_redirect_is_not_followed(lite: Store, serve: Any) -> None:
    receiver = serve((307, {"Location": "http://127.0.0.1:9/elsewhere"}))
    open_one(lite)
    [done] = deliver_round(lite, settings_for(receiver.url))
    assert (done.state, done.attempts, done.last_status) == ("failed", 1, 307)
    assert len(receiver.received) == 1


def test_nobody_listening_is_a_connection_error_kept_for_later(lite: Store) -> None:
    spare = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{spare.getsockname()[1]}/"
    spare.close()  # nothing listens there now
    open_one(lite)
    [done] = deliver_round(lite, settings_for(url, max_attempts=1))
    assert (done.state, done.last_status) == ("pending", None)
    assert done.last_error.startswith("cannot connect: "), done.last_error


def test_a_server_that_never_answers_times_out_and_stays_pending(lite: Store) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nobody ever reads or answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        settings = settings_for(url, timeout=0.3, max_attempts=2, backoff_cap=60.0)
        open_one(lite)
        [done], elapsed = timed(lambda: deliver_round(lite, settings))
    finally:
        silent.close()
    assert (done.state, done.attempts, done.last_status) == ("pending", 2, None)
    assert done.last_error == "no answer within 0.3s"
    assert 0.6 <= elapsed < 2.5
    # Not tried again before its next attempt time: backoff_cap (60 s) after the round.
    assert deliver_round(lite, settings) == []
    [row] = outbox(lite)
    assert (row.state, row.attempts) == ("pending", 2)


def test_retry_after_is_honoured(lite: Store, serve: Any) -> None:
    receiver = serve((429, {"Retry-After": "1"}), (200, {}))
    open_one(lite)
    sleeps = Sleeps()
    settings = settings_for(receiver.url)
    [done] = deliver_round(lite, settings, sender=Sender(settings, sleep=sleeps))
    assert (done.state, done.attempts) == ("delivered", 2)
    assert sleeps.asked == [1.0]  # not the 0.01 s backoff
    first, second = receiver.received
    assert second.at - first.at >= 1.0


def test_a_retry_after_too_long_to_wait_is_left_for_a_later_round(lite: Store, serve: Any) -> None:
    receiver = serve((503, {"Retry-After": "3600"}), (200, {}))
    open_one(lite)
    sleeps = Sleeps()
    settings = settings_for(receiver.url)
    [done] = deliver_round(lite, settings, sender=Sender(settings, sleep=sleeps))
    assert (done.state, done.attempts, done.last_status) == ("pending", 1, 503)
    assert sleeps.asked == []
    assert deliver_round(lite, settings) == []  # due in an hour
    later = datetime.now(UTC) + timedelta(hours=1, minutes=1)
    [again] = deliver_round(lite, settings, now=lambda: later)
    assert again.state == "delivered"


def test_a_ticket_s_events_go_out_in_order(lite: Store, serve: Any) -> None:
    receiver = serve((503, {}))
    ticket = open_one(lite)
    rma.transition(lite, ticket.id, "submitted", "medic")
    other = open_one(lite, node="gpu02")
    settings = settings_for(receiver.url, max_attempts=1)
    done = deliver_round(lite, settings)
    # The first event of `ticket` failed, so its second was held back; gpu02's was tried.
    assert [(d.ticket_id, d.event, d.state) for d in done] == [
        (ticket.id, "ticket.opened", "pending"),
        (other.id, "ticket.opened", "pending"),
    ]


# -- deadlines: nothing the receiver does holds the caller -------------------------------------


def test_a_503_with_a_long_retry_after_ends_the_round_within_the_attempt_s_deadline(
    lite: Store, serve: Any
) -> None:
    """The incident: `Retry-After: 250` was waited out in place. With the defaults (wait at
    most 60 s) the round ends after the one attempt and the row is due 250 s later."""
    receiver = serve((503, {"Retry-After": "250"}))
    open_one(lite)
    defaults = WebhookSettings(url=receiver.url, secret=SECRET, timeout=1.0, allow_http=True)
    [done], elapsed = timed(lambda: deliver_round(lite, defaults))
    assert elapsed < defaults.timeout
    assert (done.state, done.attempts, done.last_status) == ("pending", 1, 503)
    soon = datetime.now(UTC) + timedelta(seconds=240)
    assert deliver_round(lite, defaults, now=lambda: soon) == []
    later = datetime.now(UTC) + timedelta(seconds=260)
    [again] = deliver_round(lite, defaults, now=lambda: later)
    assert again.attempts == 2


def test_a_long_retry_after_waited_by_the_delivery_thread_never_holds_the_ladder(
    lite: Store, serve: Any
) -> None:
    """Even when it is configured to wait a Retry-After out (here up to 300 s), the wait is
    the delivery thread's: the ladder's call returns at once, and stopping ends the wait."""
    receiver = serve((503, {"Retry-After": "250"}))
    open_one(lite)
    settings = settings_for(receiver.url, retry_after_max=300.0, timeout=1.0)
    worker = Dispatcher(lite, settings)
    try:
        added, elapsed = timed(worker.offer)
        assert added == 1 and elapsed < 2.0  # the receiver waits 250 s
        poll("the first attempt", lambda: len(receiver.received) == 1, timeout=2)
        assert worker.busy()  # waiting the 250 s out, in its own thread
        assert timed(worker.offer)[1] < 2.0  # the ladder's next round: nothing new, no wait
    finally:
        _, closing = timed(lambda: worker.close(timeout=2))
    assert closing < 2.5 and not worker.alive()
    [row] = outbox(lite)
    assert (row.state, row.attempts, row.last_status) == ("pending", 1, 503)


def drip_ok(request: bytes) -> Iterator[bytes]:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    for i in range(len(answer)):
        yield answer[i : i + 1]


def test_a_dripping_receiver_is_cut_at_the_attempt_s_total_deadline(raw: Any) -> None:
    """One byte every 0.5 s never trips a per-read timeout; the attempt's deadline cuts it."""
    server = raw(drip_ok, gap=0.5)
    sender = Sender(settings_for(server.url, timeout=0.8))
    attempt, elapsed = timed(lambda: sender.post_once(b"{}", "d-1", "ticket.opened"))
    assert (attempt.status, attempt.error) == (None, "no answer within 0.8s")
    assert 0.75 <= elapsed < 3.0  # undeadlined, the drip would take ~20 s


def test_a_dripping_error_body_is_cut_too(raw: Any) -> None:
    def drip_body(request: bytes) -> Iterator[bytes]:
        yield b"HTTP/1.1 500 Oops\r\nContent-Length: 100\r\n\r\n"
        yield from (b"x" for _ in range(100))

    server = raw(drip_body, gap=0.5)
    sender = Sender(settings_for(server.url, timeout=0.8))
    attempt, elapsed = timed(lambda: sender.post_once(b"{}", "d-1", "ticket.opened"))
    assert attempt.status == 500 and attempt.error.startswith("HTTP 500 Oops:")
    assert elapsed < 3.0  # undeadlined: 50 s


def test_https_handshake_that_never_completes_is_cut_at_the_deadline(raw: Any) -> None:
    def nothing(request: bytes) -> Iterator[bytes]:
        yield from ()

    server = raw(nothing)  # accepts, reads a TLS ClientHello forever, never answers
    url = server.url.replace("http://", "https://")
    sender = Sender(settings_for(url, timeout=0.5))
    attempt, elapsed = timed(lambda: sender.post_once(b"{}", "d-1", "ticket.opened"))
    assert (attempt.status, attempt.error) == (None, "no answer within 0.5s")
    assert elapsed < 3.0  # undeadlined: forever


# -- the delivery thread ------------------------------------------------------------------------


def test_deliver_pending_hands_the_outbox_to_the_delivery_thread_and_returns_at_once(
    lite: Store, serve: Any
) -> None:
    receiver = serve((200, {}))
    receiver.hold.clear()  # the receiver takes its time
    ticket = open_one(lite)
    settings = settings_for(receiver.url)
    try:
        done, elapsed = timed(lambda: deliver_pending(lite, settings))
        assert done == [] and elapsed < 2.0  # the receiver holds until told
        poll("the POST", lambda: len(receiver.received) == 1, timeout=2)
        assert timed(lambda: deliver_pending(lite, settings))[1] < 2.0  # no second send
        receiver.hold.set()
        finished: list[Any] = []

        def delivered() -> bool:
            finished.extend(deliver_pending(lite, settings))
            return bool(finished)

        poll("the delivery", delivered, timeout=2)
    finally:
        dispatcher(lite, settings).close()
    [delivery] = finished
    assert (delivery.ticket_id, delivery.state, delivery.attempts) == (ticket.id, "delivered", 1)
    assert len(receiver.received) == 1


def test_a_full_queue_drops_the_oldest_with_a_logged_count_and_loses_nothing(
    lite: Store, serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = serve((200, {}))
    receiver.hold.clear()
    first = open_one(lite, node="n00")
    settings = settings_for(receiver.url)
    worker = Dispatcher(lite, settings, capacity=3)
    try:
        assert worker.offer() == 1
        poll("the first POST", lambda: len(receiver.received) == 1, timeout=2)  # now stuck
        rest = [open_one(lite, node=f"n{n:02d}") for n in range(1, 6)]
        with caplog.at_level(logging.WARNING, logger="medic.remediation.webhook"):
            added, elapsed = timed(worker.offer)
        assert (added, elapsed < 2.0) == (5, True)
        assert (worker.queued(), worker.dropped) == (3, 2)
        [line] = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
        assert line.startswith("webhook queue full (3): dropped the 2 oldest deliveries")
        assert "stay pending in the outbox" in line
        receiver.hold.set()
        poll("the queued three", lambda: not worker.busy(), timeout=3)
        delivered = {d.ticket_id for d in worker.finished()}
        assert delivered == {first.id, rest[2].id, rest[3].id, rest[4].id}
        assert worker.offer() == 2  # the two dropped ones are still pending: queued again
        poll("the dropped two", lambda: not worker.busy(), timeout=3)
    finally:
        worker.close()
    assert {d.ticket_id for d in worker.finished()} == {rest[0].id, rest[1].id}
    assert {row.state for row in outbox(lite)} == {"delivered"}
    assert len(receiver.received) == 6  # each sent once


# -- receivers that answer anything -------------------------------------------------------------

HEADER_VALUES = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(lambda n: str(n).encode()),
    st.sampled_from(
        [
            b"",
            b"9" * 400,
            b"\xb2",
            b"1.5",
            b"Wed, 21 Oct 2015 07:28:00 GMT",
            b"Fri, 31 Dec 9999 23:59:59 GMT",
            b"Mon, 01 Jan 0001 00:00:00 GMT",
            b"chunked",
            b"close",
            b"-1",
        ]
    ),
    st.binary(max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b),
)
HEADERS = st.lists(
    st.tuples(
        st.sampled_from([b"Retry-After", b"Content-Length", b"Transfer-Encoding", b"X-Junk"]),
        HEADER_VALUES,
    ),
    max_size=4,
)
RESPONSES = st.one_of(
    st.builds(
        lambda status, reason, headers, body: (
            b"HTTP/1.1 %d %s\r\n" % (status, reason)
            + b"".join(name + b": " + value + b"\r\n" for name, value in headers)
            + b"\r\n"
            + body
        ),
        st.integers(min_value=0, max_value=1000),
        st.sampled_from([b"OK", b"", b"Service Unavailable", b"\xff\xfe"]),
        HEADERS,
        st.binary(max_size=200),
    ),
    st.binary(max_size=300),  # not HTTP at all
)


def test_any_answer_at_all_is_an_attempt_never_an_exception(raw: Any) -> None:
    current: list[bytes] = [b""]
    server = raw(lambda request: iter([current[0]]))
    sender = Sender(settings_for(server.url, timeout=0.5, max_attempts=2), sleep=lambda s: None)

    @hypothesis_settings(
        max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(RESPONSES)
    @example(b"HTTP/1.1 503 Busy\r\nRetry-After: " + b"9" * 400 + b"\r\n\r\n")
    @example(b"HTTP/1.1 429 Slow\r\nRetry-After: Fri, 31 Dec 9999 23:59:59 GMT\r\n\r\n")
    @example(b"HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    @example(b"HTTP/1.1 100 Continue\r\n\r\n")
    @example(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200 + b"\r\n")
    def check(response: bytes) -> None:
        current[0] = response
        result = sender.send(b'{"event":"x"}', "d-1", "ticket.opened")
        assert 1 <= len(result.attempts) <= 2
        assert 0 <= result.retry_at_least <= 7 * 86400
        for attempt in result.attempts:
            assert attempt.status is None or isinstance(attempt.status, int)
            assert "\n" not in attempt.error

    _, elapsed = timed(check)
    assert elapsed < 30  # about a second on a quiet machine


@given(st.one_of(st.text(max_size=60), st.from_regex(r"\A *[0-9]{1,400} *\Z")))
@example("9" * 400)
@example("\u00b2")
@example("Fri, 31 Dec 9999 23:59:59 GMT")
def test_any_retry_after_text_is_read_without_raising(value: str) -> None:
    from remediation.webhook.sender import _retry_after

    seconds = _retry_after(value, time.time())
    assert seconds is None or 0 <= seconds <= 7 * 86400


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
    settings = settings_for(receiver.url, ca_file=tls_files["ca"], allow_http=False)
    [done] = deliver_round(lite, settings)
    assert (done.state, done.last_status) == ("delivered", 200)
    [got] = receiver.received
    h = got.headers
    assert verify_signature(
        SECRET, h["X-Medic-Timestamp"], h["X-Medic-Delivery"], got.body, h["X-Medic-Signature"]
    )


def test_https_without_the_ca_is_refused_and_kept_for_later(
    lite: Store, serve: Any, tls_files: dict[str, Path]
) -> None:
    receiver = serve((200, {}), tls=_server_tls(tls_files))
    open_one(lite)
    [done] = deliver_round(lite, settings_for(receiver.url))  # system CAs only
    assert (done.state, done.attempts, done.last_status) == ("pending", 1, None)
    assert done.last_error.startswith("TLS: "), done.last_error
    assert "certificate" in done.last_error
    assert receiver.received == []  # nothing was sent to an unverified server


# -- configuration ---------------------------------------------------------------------------


def config(tmp_path: Path, webhook: dict[str, Any] | None) -> Any:
    tables: dict[str, Any] = {"remediation": {} if webhook is None else {"webhook": webhook}}
    return parse_config(tables, tmp_path / "medic.toml", "gpu01")


def test_settings_from_the_webhook_table(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert WebhookSettings.from_config(config(tmp_path, None)) is None
    secret_file = tmp_path / "webhook.secret"
    secret_file.write_text("from-a-file\n")
    with caplog.at_level(logging.WARNING):
        settings = WebhookSettings.from_config(
            config(tmp_path, {"url": "https://t.example/x", "secret_file": str(secret_file)})
        )
    assert settings is not None
    assert settings.secret == b"from-a-file"
    assert (settings.verify, settings.ca_file, settings.max_attempts) == (True, None, 5)
    assert (settings.timeout, settings.retry_after_max, settings.allow_http) == (10, 60, False)
    assert "from-a-file" not in repr(settings)
    assert settings.ssl_context().verify_mode is ssl.CERT_REQUIRED
    assert caplog.records == []  # https: nothing to warn about


def test_plain_http_needs_allow_http_and_then_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = {"url": "http://tickets.lan:8080/medic", "secret": "k"}
    with pytest.raises(ConfigError) as caught:
        WebhookSettings.from_config(config(tmp_path, table))
    assert str(caught.value) == (
        f"{tmp_path / 'medic.toml'}: remediation.webhook.url: 'http://tickets.lan:8080/medic' is"
        " plain http: the events and their evidence would cross the network unencrypted; use"
        " https://, or set allow_http = true for a receiver on a trusted network"
    )
    with caplog.at_level(logging.WARNING):
        settings = WebhookSettings.from_config(config(tmp_path, {**table, "allow_http": True}))
    assert settings is not None and settings.allow_http
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING
    message = warning.getMessage()
    assert message.startswith(f"{tmp_path / 'medic.toml'}: remediation.webhook.url is plain http")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({"secret": "k"}, "remediation.webhook.url: missing; give the receiver's URL"),
        ({"url": "ftp://x/", "secret": "k"}, "remediation.webhook.url: not an https URL"),
        ({"url": "https:///path", "secret": "k"}, "remediation.webhook.url: not an https URL"),
        ({"url": "https://x:99999/", "secret": "k"}, "remediation.webhook.url: not a URL"),
        ({"url": "https://[::1/", "secret": "k"}, "remediation.webhook.url: not a URL"),
        ({"url": "http://x/", "secret": "k"}, "remediation.webhook.url: 'http://x/' is plain"),
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
        ({"url": "https://x/", "secret": "k", "allow_http": 1}, "expected true or false"),
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


def test_the_docs_webhook_tables_validate() -> None:
    import tomllib

    from healthd.checks.base import parse_check_config

    blocks = re.findall(r"```toml\n(.*?)```", (DOCS / "rma.md").read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        table = tomllib.loads(block)["remediation"]["webhook"]
        parse_check_config(WebhookTable, table, prefix="remediation.webhook", source=None)  # type: ignore[type-var]

"""A receiver for Medic's RMA webhook (docs/rma.md): checks each POST and hands the event on.

    python3 webhook_receiver.py --secret-file /etc/medic/webhook.secret --port 8443 \\
        --cert /etc/ssl/tickets.pem --key /etc/ssl/tickets.key

Three checks, in this order, before anything in the body is believed:

1. the signature: `X-Medic-Signature` must be `v1=` and the hex HMAC-SHA256, keyed with the
   shared secret, of `{X-Medic-Timestamp}.{X-Medic-Delivery}.` followed by the raw body,
   compared in constant time (401 when it is not);
2. the timestamp: more than five minutes away from this machine's clock, either way, is a
   replay or a clock to fix (401);
3. the delivery id: one already handled is a replay, or Medic retrying after it missed the
   answer; it is not handled again, and is answered 200 so that Medic stops retrying.

Ids are remembered for twice the replay window, long enough for a captured request to go
stale; the ticketing system itself should also store the delivery id with what it creates, as
Medic delivers at least once and may retry an event hours later (with a fresh timestamp).

Standard library only; Python 3.11 or later. `handle_event` is the place to call the
ticketing system: it prints the event here.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPLAY_WINDOW = 300  # seconds either side of this machine's clock
MAX_BODY = 1 << 20  # bytes; Medic's events are a few KB


# The two checks below are shown in docs/rma.md (tests/test_webhook.py keeps them equal).
def signature_ok(secret: bytes, timestamp: str, delivery_id: str, body: bytes, header: str) -> bool:
    signed = f"{timestamp}.{delivery_id}.".encode() + body
    expected = "v1=" + hmac.new(secret, signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.encode("utf-8", "replace"))


def fresh(timestamp: str, now: float, window: float = REPLAY_WINDOW) -> bool:
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        return False
    return abs(now - int(timestamp)) <= window


class Verifier:
    """The three checks, and the delivery ids already handled (in memory)."""

    def __init__(
        self,
        secret: bytes,
        window: float = REPLAY_WINDOW,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.secret = secret
        self.window = window
        self.clock = clock
        self._seen: dict[str, float] = {}  # delivery id -> when first accepted
        self._lock = threading.Lock()

    def check(self, headers: Mapping[str, str] | Message, body: bytes) -> str:
        """'' when the request is genuine, fresh and new (its id is then taken: call
        `forget` if handling it fails, so that Medic's retry is handled); else why not:
        'bad signature', 'stale timestamp' or 'repeated delivery id'."""
        timestamp = headers.get("X-Medic-Timestamp") or ""
        delivery_id = headers.get("X-Medic-Delivery") or ""
        signature = headers.get("X-Medic-Signature") or ""
        if not delivery_id or not signature_ok(
            self.secret, timestamp, delivery_id, body, signature
        ):
            return "bad signature"
        now = self.clock()
        if not fresh(timestamp, now, self.window):
            return "stale timestamp"
        with self._lock:
            for old, at in list(self._seen.items()):
                if now - at > 2 * self.window:
                    del self._seen[old]
            if delivery_id in self._seen:
                return "repeated delivery id"
            self._seen[delivery_id] = now
        return ""

    def forget(self, delivery_id: str) -> None:
        with self._lock:
            self._seen.pop(delivery_id, None)


def handle_event(event: dict[str, Any], delivery_id: str) -> None:
    """Call the ticketing system here; raise to have Medic retry later."""
    ticket = event.get("ticket", {})
    print(f"{delivery_id} {event.get('event')} ticket {ticket.get('id')} {ticket.get('node')}")


def make_server(
    address: tuple[str, int],
    verifier: Verifier,
    on_event: Callable[[dict[str, Any], str], None] = handle_event,
    tls: ssl.SSLContext | None = None,
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                self.answer(411 if length < 0 else 413, "bad length")
                return
            body = self.rfile.read(length)  # the raw bytes: verify before parsing
            why = verifier.check(self.headers, body)
            if why == "repeated delivery id":
                self.answer(200, "duplicate: already handled")
            elif why:
                self.answer(401, why)
            else:
                delivery_id = self.headers["X-Medic-Delivery"]
                try:
                    on_event(json.loads(body), delivery_id)
                except Exception as exc:
                    verifier.forget(delivery_id)
                    self.answer(500, f"not stored: {exc}")
                else:
                    self.answer(200, "stored")

        def answer(self, status: int, text: str) -> None:
            data = json.dumps({"status": status, "detail": text}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    server = ThreadingHTTPServer(address, Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--address", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--cert", type=Path, help="PEM certificate (chain); with --key: https")
    parser.add_argument("--key", type=Path)
    args = parser.parse_args(argv)
    secret = args.secret_file.read_bytes().rstrip(b"\r\n")  # as Medic reads it
    tls = None
    if args.cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.cert, args.key)
    server = make_server((args.address, args.port), Verifier(secret), tls=tls)
    scheme = "https" if tls else "http"
    print(f"listening on {scheme}://{args.address}:{args.port}/", file=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

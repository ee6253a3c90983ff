"""The webhook's signature: each attempt is signed over its time, its delivery id and its
body (the headers and the receiver's check: the package's docstring, docs/rma.md)."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

SIGNATURE_HEADER = "X-Medic-Signature"
TIMESTAMP_HEADER = "X-Medic-Timestamp"
DELIVERY_HEADER = "X-Medic-Delivery"
EVENT_HEADER = "X-Medic-Event"
SIGNATURE_VERSION = "v1"


def signed_bytes(timestamp: str, delivery_id: str, body: bytes) -> bytes:
    """What the signature covers: `{timestamp}.{delivery_id}.` then the raw body."""
    return f"{timestamp}.{delivery_id}.".encode() + body


def sign(secret: bytes, timestamp: str, delivery_id: str, body: bytes) -> str:
    """The X-Medic-Signature value of one attempt."""
    digest = hmac.new(secret, signed_bytes(timestamp, delivery_id, body), hashlib.sha256)
    return f"{SIGNATURE_VERSION}={digest.hexdigest()}"


def verify_signature(
    secret: bytes, timestamp: str, delivery_id: str, body: bytes, header: str
) -> bool:
    """The signature check a receiver does, in constant time (freshness and repeats are the
    receiver's other two checks: docs/examples/webhook_receiver.py)."""
    expected = sign(secret, timestamp, delivery_id, body).encode()
    return hmac.compare_digest(expected, header.encode("utf-8", "replace"))


def encode(payload: Mapping[str, Any]) -> bytes:
    """The body: compact JSON, keys sorted, so a retry sends the same bytes."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

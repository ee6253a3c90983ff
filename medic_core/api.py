"""The daemon's local socket: one JSON request line, one JSON reply line, over a Unix stream
socket. The client side uses only the standard library so a Slurm prolog that asks the
daemon stays fast (no SQLAlchemy or click import)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

MAX_LINE = 4 * 1024 * 1024


class HealthdUnavailable(RuntimeError):
    """The daemon did not answer: not running, socket missing, or too slow."""


def ask(socket_path: Path, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send one request and wait at most `timeout` seconds in all for the reply."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(socket_path))
            sock.sendall(json.dumps(request).encode() + b"\n")
            chunks: list[bytes] = []
            size = 0
            while not chunks or not chunks[-1].endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_LINE:
                    raise HealthdUnavailable(f"{socket_path}: reply larger than {MAX_LINE} bytes")
    except (OSError, TimeoutError) as exc:
        raise HealthdUnavailable(f"{socket_path}: {exc}") from exc
    try:
        reply: dict[str, Any] = json.loads(b"".join(chunks))
    except ValueError as exc:
        raise HealthdUnavailable(f"{socket_path}: unreadable reply ({exc})") from exc
    if "error" in reply:
        raise HealthdUnavailable(f"{socket_path}: {reply['error']}")
    return reply

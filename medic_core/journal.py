"""The node's local write-ahead journal of events: what must not be lost when the store is
not there to take it (PostgreSQL down, the disk under SQLite full).

An event is written here first, one small JSON file per event, fsynced and renamed into
place (so a reader never sees half of one), then delivered; a delivered event's file is
removed. What stays is replayed into the store, with its original time, once the store takes
writes again (`replay`; the health check does it every HealthCheckInterval). Delivery is at
least once: a crash between the store's commit and the file's removal replays it again.

Two places, the first that takes the file: `<state_dir>/journal` (survives a reboot) and
`<socket dir>/journal` (/run/medic: a tmpfs, which a full /var does not fill). Both are
root only (0700, files 0600): events carry evidence.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medic_core.config import MedicConfig, NodePaths

# keep_in_journal speaks for the daemon, as it did from healthd.ladder_thread.
daemon_log = logging.getLogger("medic.healthd")

JOURNAL = "journal"
SUFFIX = ".json"
BAD_SUFFIX = ".bad"  # an entry the store refused as data: kept aside for a human, not retried
MAX_ENTRY = 256 * 1024  # bytes; a larger file is not an entry Medic wrote
FORMAT = 1


class JournalFull(RuntimeError):
    """No journal directory took the entry; the message names each and why."""


@dataclass(frozen=True)
class Entry:
    path: Path
    node: str
    at: dt.datetime
    event: Mapping[str, Any]

    def store_fields(self, source: str = "healthd") -> dict[str, Any]:
        """Store.add_event's keywords for this entry (`source` when the event names none)."""
        return store_fields(self.node, self.at, self.event, source)


def store_fields(
    node: str, at: dt.datetime, event: Mapping[str, Any], source: str = "healthd"
) -> dict[str, Any]:
    """Store.add_event's keywords for an event as the daemon and the hooks keep it (a dict
    of strings and an evidence mapping: what the journal holds)."""
    return {
        "node": node,
        "at": at,
        "kind": str(event["kind"]),
        "severity": str(event.get("severity", "INFO")),
        "source": str(event.get("source", source)),
        "message": str(event.get("message", "")),
        "fault_class": str(event.get("fault_class", "")),
        "target": str(event.get("target", "")),
        "evidence": dict(event.get("evidence") or {}),
    }


def journal_dirs(paths: NodePaths) -> list[Path]:
    return [paths.state_dir / JOURNAL, paths.socket.parent / JOURNAL]


def write_ahead(
    paths: NodePaths, node: str, event: Mapping[str, Any], at: dt.datetime | None = None
) -> Path:
    """Write `event` (the keys of Store.add_event but `node` and `at`) to the journal before
    it is delivered; returns its file. Raises JournalFull when no directory takes it."""
    when = at or dt.datetime.now(dt.UTC)
    body = json.dumps(
        {"format": FORMAT, "node": node, "at": when.isoformat(), "event": dict(event)},
        default=str,
        ensure_ascii=True,
    ).encode()
    name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}"
    failures = []
    for directory in journal_dirs(paths):
        final, tmp = directory / f"{name}{SUFFIX}", directory / f".{name}.tmp"
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
            _fsync_dir(directory)
            return final
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            failures.append(f"{directory}: {exc.strerror or exc}")
    raise JournalFull("; ".join(failures))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def delivered(path: Path) -> None:
    """The entry reached the store: drop it."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def pending(paths: NodePaths) -> list[Path]:
    """Entries not yet delivered, oldest first (across both directories)."""
    found = []
    for directory in journal_dirs(paths):
        with contextlib.suppress(OSError):
            found += [p for p in directory.iterdir() if p.name.endswith(SUFFIX)]
    return sorted(found, key=lambda p: p.name)


def read_entry(path: Path) -> Entry:
    """One entry; ValueError (one line: the file and what is wrong) for anything that is
    not an entry Medic wrote."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_ENTRY + 1)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_ENTRY:
        raise ValueError(f"{path}: larger than {MAX_ENTRY} bytes")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: not JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a format {FORMAT} journal entry")
    node, at, event = doc.get("node"), doc.get("at"), doc.get("event")
    if not isinstance(node, str) or not isinstance(at, str) or not isinstance(event, dict):
        raise ValueError(f"{path}: node, at or event missing or of the wrong type")
    try:
        when = dt.datetime.fromisoformat(at)
    except ValueError:
        raise ValueError(f"{path}: at {at[:40]!r} is not an ISO time") from None
    if when.tzinfo is None:
        raise ValueError(f"{path}: at {at[:40]!r} has no time zone")
    if not isinstance(event.get("kind"), str) or not event["kind"]:
        raise ValueError(f"{path}: the event has no kind")
    return Entry(path, node, when, event)


@dataclass(frozen=True)
class Replay:
    delivered: int
    left: int
    set_aside: list[str]  # one line each: an entry that is not data the store takes
    stopped: str  # why replay stopped early (the store still refuses writes), or ""


def replay(
    paths: NodePaths,
    add: Callable[[Entry], None],
    *,
    limit: int = 1000,
    deadline: float | None = None,
) -> Replay:
    """Deliver pending entries, oldest first, through `add` (a store write), at most `limit`
    and until `deadline` (monotonic). An entry `add` refuses as data (ValueError), or that is
    not an entry at all, is renamed `*.bad` and named in `set_aside`; any other failure (the
    store is still down) stops the replay with the rest kept."""
    entries = pending(paths)
    done, aside, stopped = 0, [], ""
    for path in entries[:limit]:
        if deadline is not None and time.monotonic() > deadline:
            stopped = "out of time"
            break
        try:
            entry = read_entry(path)
            add(entry)
        except ValueError as exc:
            aside.append(str(exc).splitlines()[0] if str(exc) else f"{path}: refused")
            with contextlib.suppress(OSError):
                path.rename(path.with_name(path.name + BAD_SUFFIX))
            continue
        except Exception as exc:  # the store: down, full, read-only
            first = (str(exc).strip().splitlines() or [""])[0]
            stopped = f"{type(exc).__name__}: {first}"
            break
        delivered(path)
        done += 1
    left = len(pending(paths))
    return Replay(done, left, aside, stopped)


def keep_in_journal(config: MedicConfig, at: dt.datetime, event: dict[str, Any], why: str) -> None:
    """The node's write-ahead journal keeps an event the store refused;
    the daemon replays it when the store takes writes again."""
    first = why[:200]
    record = {k: (str(v) if k == "severity" else v) for k, v in event.items()}
    try:
        kept = write_ahead(config.paths, config.node_name, record, at)
    except JournalFull as exc:
        daemon_log.error(
            "event %s lost: the store refused it (%s) and %s", event.get("kind"), first, exc
        )
        return
    daemon_log.warning(
        "event %s kept in %s: the store refused it (%s)", event.get("kind"), kept, first
    )

"""`medic report`'s "Post-job hygiene" section: what the epilogs cleaned and the nodes drained
as `user_problem` (never hardware faults, so apart from the MTTR and lemon figures), from the
`hygiene` events the epilog records and Medic's drain records' events."""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from medic_core.drain_reason import is_user_problem_reason

KIND = "hygiene"
DRAIN, RESUME = "medic.drain", "medic.resume"  # medic_core.store's drain record kinds
SCAN_LIMIT = 1_000_000


@dataclass(frozen=True)
class HygieneRow:
    node: str
    jobs: int  # jobs that left something, cleaned or not
    processes: int  # processes found (and signalled)
    files: int  # /dev/shm files and scratch entries found
    drains: int  # drained as user_problem
    resumed: int  # of which given back
    median_out: float | None  # seconds from the drain to the resume, median


def _at(event: Any) -> dt.datetime:
    at: dt.datetime = event.at
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def summarise(events: Iterable[Any], since: dt.datetime, until: dt.datetime) -> list[HygieneRow]:
    """One row per node with hygiene events or user_problem drains in [since, until]."""
    found: dict[str, dict[str, int]] = {}
    drained: dict[str, dict[str, dt.datetime]] = {}
    outs: dict[str, list[float]] = {}
    for event in sorted(events, key=_at):
        at = _at(event)
        if not since <= at <= until:
            continue
        evidence = event.evidence or {}
        row = found.setdefault(event.node, {"jobs": 0, "processes": 0, "files": 0, "drains": 0})
        if event.kind == KIND:
            counts = evidence.get("found") or {}
            row["jobs"] += 1
            row["processes"] += int(counts.get("processes", 0))
            row["files"] += int(counts.get("shm", 0)) + int(counts.get("scratch", 0))
        elif event.kind == DRAIN and is_user_problem_reason(str(evidence.get("reason", ""))):
            row["drains"] += 1
            drained.setdefault(event.node, {})[str(evidence.get("reason"))] = at
        elif event.kind == RESUME:
            start = drained.get(event.node, {}).pop(str(evidence.get("reason", "")), None)
            if start is not None:
                outs.setdefault(event.node, []).append((at - start).total_seconds())
    rows = []
    for node, row in found.items():
        if not (row["jobs"] or row["drains"]):
            continue
        out = outs.get(node, [])
        rows.append(
            HygieneRow(
                node,
                row["jobs"],
                row["processes"],
                row["files"],
                row["drains"],
                len(out),
                statistics.median(out) if out else None,
            )
        )
    return sorted(rows, key=lambda r: (-r.drains, -r.jobs, r.node))


def hygiene_in(store: Any, since: dt.datetime, until: dt.datetime) -> list[HygieneRow]:
    found = [*store.events(since=since, kind=KIND, limit=SCAN_LIMIT)]
    found += store.events(since=since, kind=DRAIN, limit=SCAN_LIMIT)
    found += store.events(since=since, kind=RESUME, limit=SCAN_LIMIT)
    return summarise(found, since, until)

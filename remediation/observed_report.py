"""`medic report`'s "What Medic would have done": the decisions observe-only mode recorded
(remediation.observe: events of kind OBSERVED, and the prolog's gate records of a job it
would have refused), one line per node, actor, action, subject and decision, with how many
times it was decided and when first and last."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from remediation.observe import OBSERVED

GATE = "gate"
SCAN_LIMIT = 1_000_000  # events of one kind read for one report at most


@dataclass(frozen=True)
class Would:
    node: str
    actor: str
    action: str  # drain, requeue, resume, reboot, gpu_reset, rma, refuse_launch, ...
    subject: str  # the node, or job:<id>
    decision: str  # the reason, the note, the episode
    times: int
    first: dt.datetime
    last: dt.datetime


def _as_would(event: Any) -> tuple[str, str, str, str, str] | None:
    """(node, actor, action, subject, decision) of an event, or None when it records no
    decision observe-only mode stopped."""
    evidence = event.evidence or {}
    if event.kind == OBSERVED:
        return (event.node, str(evidence.get("actor", event.source)),
                str(evidence.get("action", "")), str(evidence.get("subject", event.target)),
                str(evidence.get("decision", event.message)))  # fmt: skip
    if event.kind == GATE and evidence.get("would_refuse"):
        why = event.message.split(": ", 1)[1] if ": " in event.message else event.message
        return (event.node, "prolog", "refuse_launch", event.target, why)
    return None


def summarise(events: Iterable[Any], since: dt.datetime, until: dt.datetime) -> list[Would]:
    """The decisions in [since, until], grouped; oldest first."""
    groups: dict[tuple[str, str, str, str, str], list[dt.datetime]] = {}
    for event in events:
        at = event.at if event.at.tzinfo else event.at.replace(tzinfo=dt.UTC)
        key = _as_would(event)
        if key is not None and since <= at <= until:
            groups.setdefault(key, []).append(at)
    rows = [Would(*key, len(ats), min(ats), max(ats)) for key, ats in groups.items()]
    return sorted(rows, key=lambda w: (w.first, w.node, w.action, w.subject))


def would_have_done(store: Any, since: dt.datetime, until: dt.datetime) -> list[Would]:
    """What observe-only mode recorded in the window, from the store."""
    found = [*store.events(since=since, kind=OBSERVED, limit=SCAN_LIMIT)]
    found += store.events(since=since, kind=GATE, limit=SCAN_LIMIT)
    return summarise(found, since, until)

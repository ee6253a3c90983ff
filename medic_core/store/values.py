"""What the store is given, checked before it is written: names, statuses, severities and
an event's columns; ValueError (one line) for what the store cannot take."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from medic_core.store.models import (
    NAME_LEN,
    NODE_LEN,
    TARGET_LEN,
    Severity,
    Status,
    check_evidence,
    check_text,
    utc,
)


def status_of(value: Status | str) -> Status:
    try:
        return Status(value)
    except ValueError:
        known = ", ".join(s.value for s in Status)
        raise ValueError(f"unknown status {value!r}; use one of {known}") from None


def severity_of(value: Severity | str) -> Severity:
    try:
        return Severity(value)
    except ValueError:
        known = ", ".join(s.value for s in Severity)
        raise ValueError(f"unknown severity {value!r}; use one of {known}") from None


def required_name(value: str, what: str, max_len: int) -> str:
    check_text(value, what, max_len)
    if not value:
        raise ValueError(f"{what} must not be empty")
    return value


def event_values(
    node: str,
    at: datetime,
    kind: str,
    severity: Severity | str,
    source: str,
    message: str = "",
    fault_class: str = "",
    target: str = "",
    evidence: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An event row's columns, checked; ValueError (one line) for what the store cannot take."""
    return {
        "node": required_name(node, "node", NODE_LEN),
        "at": utc(at, "event time"),
        "kind": required_name(kind, "event kind", NAME_LEN),
        "fault_class": check_text(fault_class, "fault class", NAME_LEN),
        "target": check_text(target, "event target", TARGET_LEN),
        "severity": severity_of(severity).value,
        "message": check_text(message, "event message"),
        "evidence": check_evidence(evidence),
        "source": required_name(source, "event source", NAME_LEN),
    }

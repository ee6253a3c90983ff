"""The one status vocabulary: check results, conditions in the store, verdicts."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Status(StrEnum):
    OK = "OK"
    WARN = "WARN"
    CRITICAL = "CRITICAL"
    UNKNOWN = "UNKNOWN"  # the check could not tell: it failed, timed out or hangs
    NOT_APPLICABLE = "NOT_APPLICABLE"  # the hardware or feature is absent and not expected

    @property
    def severity(self) -> int:
        """Order for "worst of": CRITICAL > UNKNOWN > WARN > OK > NOT_APPLICABLE."""
        return _SEVERITY[self]


_SEVERITY = {
    Status.NOT_APPLICABLE: 0,
    Status.OK: 1,
    Status.WARN: 2,
    Status.UNKNOWN: 3,
    Status.CRITICAL: 4,
}


def worst(statuses: Iterable[Status]) -> Status:
    return max(statuses, key=lambda s: s.severity, default=Status.NOT_APPLICABLE)


class Severity(StrEnum):
    """An event's severity."""

    INFO = "INFO"
    WARN = "WARN"
    CRITICAL = "CRITICAL"

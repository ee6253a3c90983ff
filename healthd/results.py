"""Check results in the forms the rest of Medic reads: JSON for the socket, one result per
(check, target) for the store, and a store severity per status."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from healthd.checks.base import Result, Status
from medic_core.status import Severity
from medic_core.vocabulary import Finding

SEVERITY_OF = {
    Status.CRITICAL: Severity.CRITICAL,
    Status.WARN: Severity.WARN,
    Status.UNKNOWN: Severity.WARN,
}


def result_json(result: Result) -> dict[str, Any]:
    return {
        "check": result.check,
        "status": result.status.value,
        "fault_class": result.fault_class,
        "target": result.target,
        "message": result.message,
        "remediation": result.remediation.value if result.remediation else None,
        "evidence": dict(result.evidence),
    }


def merge_by_target(results: Iterable[Result]) -> list[Result]:
    """One result per (check, target): a condition is keyed by those two, so two findings on
    one GPU (XID 79 and XID 48, say) become the worst of them, the rest in its evidence."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.check, r.target or ""), []).append(r)
    merged = []
    for group in groups.values():
        top = max(group, key=lambda r: r.status.severity)
        others = [r for r in group if r is not top and r.status.severity >= Status.WARN.severity]
        if others:
            also = [{"fault_class": r.fault_class, "message": r.message} for r in others]
            top = Result(
                top.check,
                top.status,
                top.fault_class,
                top.target,
                top.message,
                {**top.evidence, "also": also},
                top.remediation,
                top.kind,
            )
        merged.append(top)
    return merged


def finding_of(result: Result) -> Finding:
    return Finding.from_json(result_json(result))

"""The words every layer shares: what a check found (a Finding), how bad (Status), and what
to do about it (one Recommendation enum, GPU resets included). Sensors produce them, the
decision core reads them, the actions carry them out; nothing here imports anything above.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from medic_core.status import Status, worst


class Recommendation(StrEnum):
    """What to do about one finding. The decision core maps it to drain / requeue / rung."""

    NONE = "none"  # report only
    RESTART_APP = "restart_app"  # the application must restart (NVIDIA's RESTART_APP bucket)
    DRAIN = "drain"  # take the node out of service for a human
    RESTART_SERVICE = "restart_service"  # a host service is down: restart it or a human
    RECHECK = "recheck"  # a link that may come back: drain, re-check, then a human
    # A trend before a failure: drain now, running jobs finish untouched, then the ladder.
    DRAIN_AFTER_JOB = "drain_after_job"
    GPU_RESET_WHEN_IDLE = "gpu_reset_when_idle"  # running jobs finish, then reset
    GPU_RESET = "gpu_reset"
    REBOOT = "reboot"
    RMA = "rma"  # hardware replacement

    @classmethod
    def parse(cls, word: object) -> Recommendation:
        """A recommendation word from JSON or a store row; anything unknown is DRAIN (the
        safe reading: a human looks)."""
        try:
            return cls(str(word)) if word else cls.DRAIN
        except ValueError:
            return cls.DRAIN


RECOMMENDATION_WORDS: tuple[str, ...] = tuple(r.value for r in Recommendation)


@dataclass(frozen=True)
class Finding:
    """One check result as the decision core sees it."""

    check: str
    status: Status
    fault_class: str
    target: str
    message: str
    recommendation: Recommendation = Recommendation.DRAIN
    # What the check saw (an HCA's port and GUID, an XID's follow-up): carried to the
    # episode and an RMA ticket; never part of a decision's equality.
    evidence: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        evidence = data.get("evidence") or {}
        word = ""
        if isinstance(evidence, Mapping):
            word = str(evidence.get("recommendation") or "")
        word = word or str(data.get("remediation") or "")
        try:
            status = Status(str(data.get("status", "UNKNOWN")))
        except ValueError:
            status = Status.UNKNOWN
        return cls(
            check=str(data.get("check", "")),
            status=status,
            fault_class=str(data.get("fault_class") or ""),
            target=str(data.get("target") or ""),
            message=str(data.get("message", "")),
            recommendation=Recommendation.parse(word),
            evidence=storable_evidence(evidence),
        )

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "check": self.check,
            "status": self.status.value,
            "fault_class": self.fault_class,
            "target": self.target,
            "message": self.message,
            "recommendation": self.recommendation.value,
        }
        if self.evidence:
            data["evidence"] = dict(self.evidence)
        return data


EVIDENCE_LIMIT = 8192  # bytes of JSON a finding carries into an episode or a ticket


def storable_evidence(evidence: object) -> dict[str, Any]:
    """A check's evidence as a plain JSON object both stores accept (no NaN, no NUL, at most
    EVIDENCE_LIMIT bytes); anything else is replaced by a note saying why it was dropped."""
    if not isinstance(evidence, Mapping) or not evidence:
        return {}
    try:
        text = json.dumps(dict(evidence), allow_nan=False, default=str)
    except (TypeError, ValueError, RecursionError) as exc:
        return {"dropped": f"evidence is not JSON: {type(exc).__name__}"}
    if "\\u0000" in text:
        return {"dropped": "evidence contains a NUL character"}
    if len(text) > EVIDENCE_LIMIT:
        return {"dropped": f"evidence is {len(text)} bytes; the limit is {EVIDENCE_LIMIT}"}
    decoded: dict[str, Any] = json.loads(text)
    return decoded


@dataclass(frozen=True)
class Verdict:
    status: Status
    findings: tuple[Finding, ...]
    source: str  # "healthd", "inline"
    seconds: float
    note: str = ""  # why the daemon was not used, when it was not

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any], source: str, seconds: float) -> Verdict:
        results = reply.get("results", [])
        findings = tuple(
            Finding.from_json(r) for r in (results if isinstance(results, list) else [])
        )
        return cls(worst(f.status for f in findings), findings, source, seconds)

    @classmethod
    def of(cls, findings: Iterable[Finding], source: str, seconds: float = 0.0) -> Verdict:
        found = tuple(findings)
        return cls(worst(f.status for f in found), found, source, seconds)

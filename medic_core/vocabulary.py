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
        # as_json's own key first (so a finding survives its JSON whole), then the forms a
        # check result carries: its evidence's recommendation, its `remediation`.
        word = str(data.get("recommendation") or "")
        if not word and isinstance(evidence, Mapping):
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

    @property
    def component(self) -> Component:
        return component_of(self)

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


class ComponentKind(StrEnum):
    GPU = "gpu"
    HCA = "hca"  # an InfiniBand port: `<device>/<port>`
    NVSWITCH = "nvswitch"
    JOB = "job"  # a job's own fault (a hang): only that job
    HOST = "host"  # the node as a whole: a service, memory, a filesystem, an unplaced GPU


@dataclass(frozen=True)
class Component:
    """What a fault belongs to. A GPU's fault touches the jobs that hold that GPU; a host
    or fabric fault touches every job on the node. The identity (UUID, serial, GUID, PCI
    slot) comes from the finding's evidence where the check read it, "" otherwise."""

    kind: ComponentKind
    name: str = ""  # the GPU's index, the HCA's "<device>/<port>", the job's id
    uuid: str = ""
    serial: str = ""
    guid: str = ""
    slot: str = ""  # the PCI bus id

    @property
    def gpu_index(self) -> int | None:
        if self.kind is ComponentKind.GPU and self.name.isascii() and self.name.isdigit():
            return int(self.name)
        return None

    def __str__(self) -> str:
        return self.kind.value if self.kind is ComponentKind.HOST else f"{self.kind}:{self.name}"

    def describe(self) -> str:
        """For people (a ticket, a report): `GPU 3 (serial 1650..., GPU-8e...)`."""
        ids = [f"serial {self.serial}" if self.serial else "", self.uuid, self.guid and
               f"GUID {self.guid}", self.slot and f"slot {self.slot}"]  # fmt: skip
        known = ", ".join(i for i in ids if i)
        word = {ComponentKind.GPU: "GPU", ComponentKind.HCA: "HCA port",
                ComponentKind.NVSWITCH: "NVSwitch", ComponentKind.JOB: "job"}  # fmt: skip
        head = f"{word[self.kind]} {self.name}" if self.kind in word else "the host"
        return f"{head} ({known})" if known else head


def component_of(finding: Finding) -> Component:
    """The component a finding is about, from its fault class, target and evidence. A GPU
    finding without an index (an XID placed only by its PCI address) is the host's: Medic
    cannot tell which jobs hold that GPU, so every job counts."""
    target, family = finding.target, finding.fault_class.split(".", 1)[0]
    ev = finding.evidence

    def text(key: str) -> str:
        value = ev.get(key)
        return value[:128] if isinstance(value, str) else ""

    if target.startswith("job:"):
        return Component(ComponentKind.JOB, target.removeprefix("job:"))
    if family == "gpu" and target.isascii() and target.isdigit():
        return Component(ComponentKind.GPU, target, text("uuid"), text("serial"),
                         slot=text("pci_bus_id"))  # fmt: skip
    if family == "ib" and target:
        guid = text("port_guid") or text("node_guid") or text("guid")
        return Component(ComponentKind.HCA, target, guid=guid)
    if family == "nvswitch" or target.startswith("nvswitch:"):
        return Component(ComponentKind.NVSWITCH, target.removeprefix("nvswitch:"))
    return Component(ComponentKind.HOST)


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

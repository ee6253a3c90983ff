"""What an RMA ticket is, as values: the Ticket, the GPUs it names, an audit entry, the
errors of a refused request, and how the part it is for is named for a vendor (its
component, the one-line summary, the evidence bundle's fixed keys). No store."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from medic_core.vocabulary import Component, ComponentKind
from remediation.policy import part_name
from remediation.ticket_states import TicketState

REPLACED = "replaced"
CANCELLED = "cancelled"


class TicketError(ValueError):
    """An illegal request about a ticket; the message is one line and says what is allowed."""


@dataclass(frozen=True)
class Gpu:
    """One GPU named in a ticket: what a vendor needs to find the part."""

    index: int
    uuid: str = ""
    serial: str = ""
    pci_bus_id: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "serial": self.serial,
            "pci_bus_id": self.pci_bus_id,
        }


def ticket_component(component: Component, gpus: Sequence[Mapping[str, Any]]) -> Component:
    """The part a ticket is for: the fault's component, a GPU's identity completed from the
    GPU the ticket names (an XID finding knows the index only; NVML knows the serial)."""
    if component.kind is not ComponentKind.GPU:
        return component
    gpu = next((g for g in gpus if str(g.get("index")) == component.name), None)
    if gpu is None:
        return component

    def text(key: str) -> str:
        value = gpu.get(key)
        return value if isinstance(value, str) else ""

    return Component(
        component.kind,
        component.name,
        uuid=component.uuid or text("uuid"),
        serial=component.serial or text("serial"),
        guid=component.guid,
        slot=component.slot or text("pci_bus_id"),
    )


def component_json(component: Component) -> dict[str, str]:
    """The component as a ticket's evidence and the webhook payload carry it: `id`
    (`gpu:3`, `hca:mlx5_0/1`, `host`), each identity known, and `describe` for people."""
    known = {
        "uuid": component.uuid,
        "serial": component.serial,
        "guid": component.guid,
        "slot": component.slot,
    }
    return {
        "id": str(component),
        "kind": component.kind.value,
        "name": component.name,
        **{k: v for k, v in known.items() if v},
        "describe": component.describe(),
    }


def rma_summary(node: str, fault_class: str, component: Component, reason: str) -> str:
    """The vendor-facing one line: which part, where, what fault, and why it goes back:
    `GPU 3 (serial 1650...) on n2: gpu.ecc.dbe; lemon: 3 gpu-memory episodes on GPU 3
    (serial 1650...) in 7 days`."""
    return f"{part_name(component)} on {node}: {fault_class}; {reason}"


@dataclass(frozen=True)
class Ticket:
    id: int
    node: str
    state: TicketState
    fault_class: str
    summary: str
    gpus: tuple[Gpu, ...]
    evidence: dict[str, Any]
    resolution: str  # "" until closed; then "replaced" or "cancelled"
    requalify: bool  # closed, and the node has not re-qualified since
    external_id: str  # the ticketing system's id, once known
    external_url: str
    created_at: dt.datetime
    updated_at: dt.datetime
    closed_at: dt.datetime | None

    @property
    def is_open(self) -> bool:
        return self.state is not TicketState.CLOSED

    @property
    def component(self) -> dict[str, Any]:
        """The part the ticket is for (component_json), {} when the opener named none (an
        operator's `medic rma open`, a ticket from before components were recorded)."""
        found = self.evidence.get("component")
        return dict(found) if isinstance(found, Mapping) else {}

    @property
    def reason(self) -> str:
        """Why the part goes back (the lemon rule, or the rungs tried), "" when not said."""
        found = self.evidence.get("reason")
        return found if isinstance(found, str) else ""

    @property
    def bundle(self) -> dict[str, Any]:
        """The node's evidence bundle (remediation.evidence: path, sha256, bytes, parts), {}
        until the node has written it."""
        found = self.evidence.get("bundle")
        return dict(found) if isinstance(found, Mapping) else {}

    def as_dict(self) -> dict[str, Any]:
        """The ticket as JSON (without its evidence, which payloads carry separately)."""
        return {
            "id": self.id,
            "node": self.node,
            "state": self.state.value,
            "fault_class": self.fault_class,
            "summary": self.summary,
            "component": self.component,
            "reason": self.reason,
            "bundle": self.bundle,
            "gpus": [g.as_dict() for g in self.gpus],
            "resolution": self.resolution,
            "external_id": self.external_id,
            "external_url": self.external_url,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
        }


@dataclass(frozen=True)
class AuditEntry:
    id: int
    ticket_id: int
    at: dt.datetime
    actor: str
    from_state: TicketState | None  # None: the ticket was created
    to_state: TicketState
    note: str


def evidence_bundle(
    *,
    conditions: Sequence[Mapping[str, Any]] = (),
    xids: Sequence[Mapping[str, Any]] = (),
    nvml: Mapping[str, Any] | None = None,
    checks: Sequence[Mapping[str, Any]] = (),
    history: Sequence[Mapping[str, Any]] = (),
    actions: Sequence[Mapping[str, Any]] = (),
    **extra: Any,
) -> dict[str, Any]:
    """The evidence a vendor asks for, under fixed keys: the node's conditions, XIDs (with
    the kernel-log lines that reported them), NVML fields per GPU, check outputs, the fault
    history (events) and the repair actions tried (the ladder's steps)."""
    bundle: dict[str, Any] = {
        "conditions": [dict(c) for c in conditions],
        "xids": [dict(x) for x in xids],
        "nvml": dict(nvml or {}),
        "checks": [dict(c) for c in checks],
        "history": [dict(h) for h in history],
        "actions": [dict(a) for a in actions],
    }
    bundle.update(extra)
    return bundle

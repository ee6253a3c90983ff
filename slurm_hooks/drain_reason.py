"""Medic's drain reasons, and the rule that Medic only drains and resumes what is its own.

A Medic drain says `medic: <fault class> <where> <short evidence>` and fits Slurm's reason
field; anything else (an admin's note, NHC's, Slurm's "Prolog error" on a node Medic did
not drain) belongs to someone else and is never overwritten or resumed by Medic.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from slurm_hooks.slurm import SlurmClient

PREFIX = "medic: "
MAX_REASON = 120  # Slurm keeps more; short reasons stay readable in `sinfo -R`


@dataclass(frozen=True)
class MedicReason:
    fault_class: str
    where: str
    evidence: str


def format_reason(fault_class: str, where: str = "", evidence: str = "") -> str:
    """`medic: gpu.xid.79 gpu2 GPU has fallen off the bus`, cut to MAX_REASON (evidence
    first). Characters Slurm's reason field mangles are replaced."""
    head = PREFIX + " ".join(p for p in (fault_class, _where(where)) if p)
    text = " ".join(evidence.replace("=", ":").split())
    room = MAX_REASON - len(head) - 1
    if text and room > 3:
        head += " " + (text if len(text) <= room else text[: room - 1] + "…")
    return head[:MAX_REASON]


def _where(target: str) -> str:
    return f"gpu{target}" if target.isdigit() else target


def is_medic_reason(reason: str | None) -> bool:
    return bool(reason) and str(reason).startswith(PREFIX)


def parse_reason(reason: str | None) -> MedicReason | None:
    if not reason or not is_medic_reason(reason):
        return None
    words = reason[len(PREFIX) :].split(" ", 2)
    words += [""] * (3 - len(words))
    return MedicReason(words[0], words[1], words[2])


class DrainOutcome(StrEnum):
    DRAINED = "drained"
    ALREADY_MEDIC = "already drained by medic"
    NOT_OURS_KEPT = "drained by someone else: reason kept"
    RESUMED = "resumed"
    NOT_DRAINED = "not drained"
    NOT_OURS = "not medic's drain: left alone"
    UNKNOWN_NODE = "no such node"


def drain_if_allowed(client: SlurmClient, node: str, reason: str) -> DrainOutcome:
    assert is_medic_reason(reason), reason
    info = client.node(node)
    if info is None:
        return DrainOutcome.UNKNOWN_NODE
    if info.drained or "DOWN" in (info.state, *info.flags):
        if not info.reason:
            client.drain(node, reason)  # Slurm's own state without a reason: say why
            return DrainOutcome.DRAINED
        if is_medic_reason(info.reason):
            return DrainOutcome.ALREADY_MEDIC
        return DrainOutcome.NOT_OURS_KEPT
    client.drain(node, reason)
    return DrainOutcome.DRAINED


def resume_if_medic(client: SlurmClient, node: str) -> DrainOutcome:
    info = client.node(node)
    if info is None:
        return DrainOutcome.UNKNOWN_NODE
    down = "DOWN" in (info.state, *info.flags)  # after `scontrol reboot nextstate=DOWN`
    if not info.drained and not down:
        return DrainOutcome.NOT_DRAINED
    if not is_medic_reason(info.reason):
        return DrainOutcome.NOT_OURS
    client.resume(node)
    return DrainOutcome.RESUMED

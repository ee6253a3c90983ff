"""The ladder's decisions, pure: where an episode starts, what comes after a failed rung,
whether a node is a lemon, how many nodes may be drained, and whether a fault class looks
fleet-wide (a bad driver rollout, a switch) rather than one node's.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from medic_core.status import Status
from medic_core.vocabulary import Component, ComponentKind, Finding, component_of
from remediation.episode_types import CLOSED, RESOLVED, RMA, Episode


class Rung(IntEnum):
    GPU_RESET = 1
    DRIVER_RELOAD = 2
    REBOOT = 3
    RMA = 4

    @property
    def word(self) -> str:
        return self.name.lower()

    @classmethod
    def from_word(cls, word: str) -> Rung:
        return cls[word.upper()]


# The finding's recommendation (NVIDIA's XID bucket for XIDs, the check's own otherwise)
# -> the first rung; every word of medic_core.vocabulary.Recommendation has an entry. None
# starts no repair rung:
# * "drain", "none": a human looks, or nothing to do.
# * "restart_app": the application restarts (the decision core requeues the job it hit); the
#   node stays in service and nothing on it is repaired.
# * "restart_service": a host service (munged, ...) is down. Restarting the GPU driver would
#   not bring it back and would kill every job's GPUs: a human restarts the service.
# * "recheck": a link (an InfiniBand port) that may come back by itself or by a cable
#   reseat: the node is drained and the finding re-checked; no GPU rung touches a link.
FIRST_RUNG: Mapping[str, Rung | None] = {
    "gpu_reset": Rung.GPU_RESET,
    "gpu_reset_when_idle": Rung.GPU_RESET,
    # a rising trend (healthd.checks.gpu_trends): the node drains after its job, then the
    # GPU's reset and the re-qualification checks decide whether it comes back
    "drain_after_job": Rung.GPU_RESET,
    "reboot": Rung.REBOOT,
    "rma": Rung.RMA,
    "restart_app": None,
    "restart_service": None,
    "recheck": None,
    "drain": None,
    "none": None,
}


# Fault classes whose first rung is not their recommendation's: a repeat straggler drains
# after its job like a rising trend, but names no GPU to reset; a reboot clears what slows a
# node (clocks, thermal state, a leaking service) and the re-qualification checks follow.
FIRST_RUNG_BY_CLASS: Mapping[str, Rung] = {"node.straggler": Rung.REBOOT}


def first_rung(
    fault_class: str, recommendation: str, overrides: Mapping[str, str] | None = None
) -> Rung | None:
    """The rung an episode for this finding starts at; the longest matching override wins,
    then the fault class's own (FIRST_RUNG_BY_CLASS), then the recommendation's."""
    parts = fault_class.split(".")
    for end in range(len(parts), 0, -1):
        word = (overrides or {}).get(".".join(parts[:end]))
        if word is not None:
            return None if word == "none" else Rung.from_word(word)
    if fault_class in FIRST_RUNG_BY_CLASS:
        return FIRST_RUNG_BY_CLASS[fault_class]
    return FIRST_RUNG.get(recommendation)


def after_failure(rung: Rung, attempts_made: int, attempts_allowed: int) -> Rung:
    """The same rung while it has attempts left, else the next one up."""
    if rung is Rung.RMA:
        return Rung.RMA
    if attempts_made < attempts_allowed:
        return rung
    return Rung(rung + 1)


HOST = Component(ComponentKind.HOST)

# --- the lemon rule ------------------------------------------------------------------------

# Fault families: the faults that are one kind of trouble of one part. The lemon rule counts
# a component's episodes of one family only (a flapping InfiniBand link says nothing of a
# GPU's memory). Dotted fault-class prefix -> family; the longest prefix wins. Every fault
# class a check declares and every XID of healthd/xid_catalog.json has an entry here
# (tests/test_lemon.py holds that); a class without one is its own first word's family.
GPU_MEMORY = "gpu-memory"
GPU_BUS = "gpu-bus"
GPU_NVLINK = "gpu-nvlink"
GPU_THERMAL = "gpu-thermal"
GPU_ENGINE = "gpu-engine"
LINK = "link"
FAULT_FAMILIES: Mapping[str, str] = {
    # A GPU's memory: ECC errors, row remapping, retired pages, their trends and XIDs.
    "gpu.ecc": GPU_MEMORY,
    "gpu.remap": GPU_MEMORY,
    "gpu.retired_pages": GPU_MEMORY,
    "gpu.trend.ecc_corrected": GPU_MEMORY,
    "gpu.trend.remapped_rows": GPU_MEMORY,
    "gpu.trend.retired_pages": GPU_MEMORY,
    "gpu.xid.48": GPU_MEMORY,  # double-bit ECC error
    "gpu.xid.63": GPU_MEMORY,  # row remapping event
    "gpu.xid.64": GPU_MEMORY,  # row remapping failure
    "gpu.xid.92": GPU_MEMORY,  # excessive single-bit errors
    "gpu.xid.94": GPU_MEMORY,  # contained memory error
    "gpu.xid.95": GPU_MEMORY,  # uncontained memory error
    "gpu.xid.140": GPU_MEMORY,  # unrecovered ECC error
    # A GPU's link to the host: off the bus, missing, PCIe width or replays.
    "gpu.xid.79": GPU_BUS,
    "gpu.missing": GPU_BUS,
    "gpu.count": GPU_BUS,
    "gpu.pcie": GPU_BUS,
    "gpu.trend.pcie_replay": GPU_BUS,
    "gpu.xid.54": GPU_BUS,  # auxiliary power not connected: the board's seating
    # NVLink.
    "gpu.nvlink": GPU_NVLINK,
    "gpu.trend.nvlink_crc": GPU_NVLINK,
    "gpu.trend.nvlink_replay": GPU_NVLINK,
    **{f"gpu.xid.{x}": GPU_NVLINK for x in (74, 136, 137, 144, 145, 146, 147, 148, 149, 150, 155)},
    # Heat and power.
    "gpu.thermal": GPU_THERMAL,
    "gpu.clocks": GPU_THERMAL,
    "gpu.trend.temperature_c": GPU_THERMAL,
    "gpu.trend.throttle_ms": GPU_THERMAL,
    # Everything else of a GPU: engine hangs and timeouts, GSP, the diag, its performance.
    "gpu": GPU_ENGINE,
    "nvswitch": "nvswitch",
    "ib": LINK,  # InfiniBand ports: down, missing, slow, error counters, their trends
    "nccl": "fabric",
    "mem": "host-memory",
    "cpu": "host-cpu",
    "kernel": "host-kernel",
    "kernel.mce": "host-memory",
    "kernel.pcie": "host-pcie",
    "fs": "filesystem",
    "service": "service",
    "node": "node",  # node.straggler
    "command": "site-check",
    "check": "check",
}


def fault_family(fault_class: str) -> str:
    """The family of `fault_class` (FAULT_FAMILIES: the longest dotted prefix), else its
    first word."""
    parts = fault_class.split(".")
    for end in range(len(parts), 0, -1):
        family = FAULT_FAMILIES.get(".".join(parts[:end]))
        if family is not None:
            return family
    return parts[0]


def same_part(a: Component, b: Component) -> bool:
    """The same component: the same kind and name (GPU index, HCA port), and the same part
    where both know its identity (a GPU swapped at that index has another serial)."""
    if (a.kind, a.name) != (b.kind, b.name):
        return False
    for mine, theirs in ((a.serial, b.serial), (a.uuid, b.uuid), (a.guid, b.guid)):
        if mine and theirs and mine != theirs:
            return False
    return True


def part_name(component: Component) -> str:
    """The part in one short phrase, by the identity a vendor looks it up by: `GPU 3 (serial
    1650...)` (else its UUID, else its PCI slot), `HCA port mlx5_0/1 (GUID b8ce:...)`."""
    ident = (
        f"serial {component.serial}"
        if component.serial
        else component.uuid
        or (component.guid and f"GUID {component.guid}")
        or (component.slot and f"slot {component.slot}")
    )
    head = component.describe().split(" (", 1)[0]
    return f"{head} ({ident})" if ident else head


def with_identity(component: Component, seen: Iterable[Component]) -> Component:
    """`component` with the identity (serial, UUID, GUID, slot) the same part showed in
    earlier findings (the newest first), where this one's finding did not read it (an XID
    names the index only)."""
    out = component
    for other in seen:
        out = Component(
            out.kind,
            out.name,
            uuid=out.uuid or other.uuid,
            serial=out.serial or other.serial,
            guid=out.guid or other.guid,
            slot=out.slot or other.slot,
        )
    return out


@dataclass(frozen=True)
class LemonEpisode:
    """What the lemon rule reads of one earlier episode of the node."""

    component: Component
    family: str
    opened_at: dt.datetime
    # A repair was tried: a rung's step ran (reset, reload, reboot) or it ended in RMA. A
    # link that came back by itself while re-checked needed none.
    repaired: bool
    failed_requalifications: int = 0
    closed_by_human: bool = False  # `medic episode close`: a human judged it (no fault)
    ticketed: bool = False  # it ended in an RMA ticket: the part went back (or was judged)
    resolved: bool = False  # it closed with the node given back (by itself or repaired)


def counts(episode: LemonEpisode, family: str, since: dt.datetime) -> bool:
    """What the lemon rule and strikes both count from: an episode of `family` opened at or
    after `since` that no human closed (a human's close says the part was fine)."""
    return episode.family == family and episode.opened_at >= since and not episode.closed_by_human


@dataclass(frozen=True)
class LemonScore:
    """The lemon rule for one fault about to be admitted: with `episodes_limit` = N, the Nth
    episode of one component and fault family within the window (N-1 earlier ones that
    needed a repair, and this one) goes straight to RMA instead of its first rung; so does
    any episode once the earlier ones of that component and family failed
    `failed_limit` re-qualifications in all."""

    episodes_recent: int  # counted episodes, the one being admitted included
    failed_requalifications: int
    episodes_limit: int
    failed_limit: int
    component: Component = HOST
    family: str = ""
    days: float = 0.0

    @classmethod
    def of(
        cls,
        component: Component,
        family: str,
        history: Iterable[LemonEpisode],
        *,
        since: dt.datetime,
        episodes_limit: int,
        failed_limit: int,
        days: float,
    ) -> LemonScore:
        """Count `history` (the node's earlier episodes) for a fault of `family` on
        `component`. Only episodes of the same part and family, opened at or after `since`,
        that needed a repair and that no human closed count; an RMA ticket of the part
        starts the count afresh (the part was replaced, or a human judged it good)."""
        mine = sorted(
            (e for e in history if same_part(e.component, component)), key=lambda e: e.opened_at
        )
        last_ticket = max((i for i, e in enumerate(mine) if e.ticketed), default=-1)
        counted = [e for e in mine[last_ticket + 1 :] if counts(e, family, since) and e.repaired]
        return cls(
            episodes_recent=len(counted) + 1,
            failed_requalifications=sum(e.failed_requalifications for e in counted),
            episodes_limit=episodes_limit,
            failed_limit=failed_limit,
            component=with_identity(component, (e.component for e in reversed(counted))),
            family=family,
            days=days,
        )

    @property
    def by_episodes(self) -> bool:
        return self.episodes_recent >= self.episodes_limit

    @property
    def is_lemon(self) -> bool:
        return self.by_episodes or self.failed_requalifications >= self.failed_limit

    def why(self) -> str:
        """Why it is a lemon (or how far it is from one), for people: the ticket, the
        episode, the event."""
        family = f"{self.family} " if self.family else ""
        days = f" in {self.days:g} days" if self.days else ""
        where = part_name(self.component)
        if self.is_lemon and not self.by_episodes:
            return (
                f"{self.failed_requalifications} failed re-qualifications after {family}"
                f"repairs of {where}{days} (limit {self.failed_limit})"
            )
        return f"{self.episodes_recent} {family}episodes on {where}{days}"

    def describe(self) -> str:
        """`lemon: 3 gpu-memory episodes on GPU 3 (serial 1650...) in 7 days`."""
        return f"lemon: {self.why()}"


def drain_cap(partition_nodes: int, share: float, minimum: int) -> int:
    """How many nodes of a partition Medic may hold drained at once."""
    return max(minimum, math.floor(partition_nodes * share))


def fleet_signature(nodes_by_fault: Mapping[str, Iterable[str]], threshold: int) -> str | None:
    """A fault class seen on `threshold` or more distinct nodes (within the caller's window)."""
    worst = max(
        ((fault, len(set(nodes))) for fault, nodes in nodes_by_fault.items()),
        key=lambda item: item[1],
        default=None,
    )
    if worst is not None and worst[1] >= threshold:
        return worst[0]
    return None


# --- strikes: a part that keeps coming back by itself -----------------------------------------


@dataclass(frozen=True)
class StrikeRule:
    """`count` faults of one part and family within `window` seconds, each of which came
    back with no repair, make the next one a standing fault: the node stays out for a
    human instead of being re-checked and given back again (Azure's healthagent "strikes":
    a link that flaps 3 times in 3 hours is a failure)."""

    count: int
    window: float

    def words(self) -> str:
        hours = self.window / 3600
        return (
            f"{self.count} within {hours:g} h"
            if hours >= 1
            else f"{self.count} within {self.window:g} s"
        )


# Per fault family, as data: a family without a rule never latches (a repaired fault is the
# lemon rule's to count).
STRIKE_RULES: Mapping[str, StrikeRule] = {
    LINK: StrikeRule(3, 3 * 3600.0),
    GPU_NVLINK: StrikeRule(3, 3 * 3600.0),
}


@dataclass(frozen=True)
class StrikeScore:
    """The strike rule for one fault about to be admitted: the episodes of the same part and
    family within the rule's window that came back by themselves (no repair step, resolved,
    not closed by a human), this one included."""

    flaps: int
    rule: StrikeRule | None
    component: Component = HOST
    family: str = ""

    @classmethod
    def of(
        cls,
        component: Component,
        family: str,
        history: Iterable[LemonEpisode],
        *,
        now: dt.datetime,
        rules: Mapping[str, StrikeRule] = STRIKE_RULES,
    ) -> StrikeScore:
        rule = rules.get(family)
        if rule is None:
            return cls(1, None, component, family)
        since = now - dt.timedelta(seconds=rule.window)
        came_back = [
            e
            for e in history
            if same_part(e.component, component)
            and counts(e, family, since)
            and e.resolved
            and not e.repaired
        ]
        return cls(len(came_back) + 1, rule, component, family)

    @property
    def latched(self) -> bool:
        return self.rule is not None and self.flaps >= self.rule.count

    def why(self) -> str:
        rule = f" (strikes: {self.rule.words()})" if self.rule is not None else ""
        return f"{self.flaps} {self.family} faults of {part_name(self.component)}{rule}"


def episode_finding(episode: Episode) -> Finding:
    """The finding an episode was opened for (its evidence keeps every finding of the fault),
    or one made of the episode's own columns for an episode recorded without them."""
    found = episode.evidence.get("findings")
    rows = [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []
    for row in rows:
        if (row.get("fault_class"), row.get("target")) == (episode.fault_class, episode.target):
            return Finding.from_json(row)
    return Finding(episode.check, Status.CRITICAL, episode.fault_class, episode.target, "")


def lemon_episode(episode: Episode) -> LemonEpisode:
    """What the lemon rule reads of a stored episode. It needed a repair when a rung's step
    was recorded (the attempt counts from its intent; a reboot Slurm refused is given back)
    or it ended in an RMA ticket; a link re-checked until it came back ran no rung."""
    return LemonEpisode(
        component=component_of(episode_finding(episode)),
        family=fault_family(episode.fault_class),
        opened_at=episode.opened_at,
        repaired=episode.state == RMA
        or episode.ticket_id is not None
        or any(int(n) > 0 for n in episode.attempts.values()),
        failed_requalifications=episode.failed_requalifications,
        closed_by_human=episode.state == CLOSED,
        ticketed=episode.ticket_id is not None,
        resolved=episode.state == RESOLVED,
    )

"""The ladder's decisions, pure: where an episode starts, what comes after a failed rung,
whether a node is a lemon, how many nodes may be drained, and whether a fault class looks
fleet-wide (a bad driver rollout, a switch) rather than one node's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum


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


@dataclass(frozen=True)
class LemonScore:
    episodes_recent: int
    failed_requalifications: int
    episodes_limit: int
    failed_limit: int

    @property
    def is_lemon(self) -> bool:
        return (
            self.episodes_recent >= self.episodes_limit
            or self.failed_requalifications >= self.failed_limit
        )

    def describe(self) -> str:
        return (
            f"{self.episodes_recent} episodes recently (limit {self.episodes_limit}), "
            f"{self.failed_requalifications} failed re-qualifications (limit {self.failed_limit})"
        )


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

"""What the daemon last learned of its own node from Slurm, without asking Slurm for it.

The Slurm clients of the daemon's ladder thread (its ticks and its answers to fresh faults)
go through `SlurmSeen.wrap`: every record of this node they read, and every drain, reboot or
resume of it they do, is noted with its time. The metrics export that view; a scrape never
calls Slurm. It is only as fresh as the daemon's last Slurm call about its node: a healthy
node's daemon makes none, and a drain or resume done elsewhere (a human, the prolog, the
HealthCheckProgram) is seen only at the next one.

Whether an out-of-service node is Medic's drain comes from Medic's drain records (`owns`, set
by the daemon: medic_core.drain_book), asked once per reason seen; a drain or reboot through
the wrapped client is Medic's (recorded before it was asked). Only without an answer from the
records (none set, or unreachable) does the reason's prefix decide.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from medic_core.drain_reason import as_slurm_stores, is_medic_reason
from medic_core.slurm import JobInfo, NodeInfo, SlurmClient

# Slurm starts no job on a node with any of these (its base state or a flag).
OUT_OF_SERVICE = frozenset({"DRAIN", "DOWN", "FAIL"})


@dataclass(frozen=True)
class SlurmView:
    """The node as Slurm had it when the daemon last read it or changed it."""

    out_of_service: bool  # DRAIN, DOWN or FAIL: Slurm starts no job there
    medic_drain: bool  # out of service with a drain Medic's records hold
    at: float  # Unix time it was learned
    how: str  # "read", "drain", "reboot" or "resume"


class SlurmSeen:
    def __init__(
        self,
        node: str,
        clock: Callable[[], float] = time.time,
        owns: Callable[[NodeInfo], bool | None] | None = None,
    ) -> None:
        self.node = node
        self._clock = clock
        # Medic's drain records: True/False, None when they cannot tell (set by the daemon).
        self.owns = owns
        self._judged: tuple[str, bool] | None = None  # (reason, Medic's?) last answered
        self.view: SlurmView | None = None  # replaced whole: a reader sees one or the other

    def read(self, info: NodeInfo) -> None:
        out = bool(OUT_OF_SERVICE & info.states)
        self.view = SlurmView(out, out and self._medic(info), self._clock(), "read")

    def _medic(self, info: NodeInfo) -> bool:
        if self._judged is not None and self._judged[0] == info.reason:
            return self._judged[1]
        ours = self.owns(info) if self.owns is not None else None
        if ours is None:  # no records to ask: the prefix, not remembered
            return is_medic_reason(info.reason)
        self._judged = (info.reason, ours)
        return ours

    def changed(self, how: str, reason: str = "") -> None:
        """`how` ("drain", "reboot", "resume") succeeded: `scontrol reboot ASAP` drains.
        Medic's own drain (recorded before it was asked)."""
        out = how != "resume"
        if out:
            self._judged = (as_slurm_stores(reason), True)
        self.view = SlurmView(out, out, self._clock(), how)

    def wrap(self, client: SlurmClient) -> SlurmClient:
        return _Recording(client, self)


class _Recording:
    """A SlurmClient that tells `seen` what it learns about `seen.node`."""

    def __init__(self, client: SlurmClient, seen: SlurmSeen) -> None:
        self.client = client
        self.seen = seen
        # Observe-only mode (remediation.observe): a change recorded, not made, is not seen.
        self.observer = getattr(client, "observer", None)

    @property
    def observing(self) -> bool:
        return bool(getattr(self.client, "observing", False))

    def nodes(self) -> list[NodeInfo]:
        found = self.client.nodes()
        for info in found:
            if info.name == self.seen.node:
                self.seen.read(info)
        return found

    def node(self, name: str) -> NodeInfo | None:
        info = self.client.node(name)
        if info is not None and name == self.seen.node:
            self.seen.read(info)
        return info

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]:
        return self.client.jobs(ids)

    def jobs_on(self, node: str) -> list[JobInfo]:
        return self.client.jobs_on(node)

    def drain(self, node: str, reason: str) -> None:
        self.client.drain(node, reason)
        if node == self.seen.node and not self.observing:
            self.seen.changed("drain", reason)

    def resume(self, node: str) -> None:
        self.client.resume(node)
        if node == self.seen.node and not self.observing:
            self.seen.changed("resume")

    def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        self.client.reboot(node, reason, nextstate)
        if node == self.seen.node and not self.observing:
            self.seen.changed("reboot", reason)

    def requeue(self, job_id: str) -> None:
        self.client.requeue(job_id)

    def release(self, job_id: str) -> None:
        self.client.release(job_id)

    def hold(self, job_id: str) -> None:
        self.client.hold(job_id)

    def start_now(self, job_id: str) -> None:
        self.client.start_now(job_id)

    def controller_time(self) -> int:
        return self.client.controller_time()

    def set_admin_comment(self, job_id: str, text: str) -> None:
        self.client.set_admin_comment(job_id, text)

"""What Medic knows of Slurm: its node and job records (NodeInfo, JobInfo), their state
words, the error a Slurm command raises, and the SlurmClient protocol every part of Medic talks
to (medic_core.slurm_cli's CliSlurm implements it with Slurm's commands; tests use a fake).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from medic_core.hostlist import expand_hostlist

# Base node states; every other word in a node's state is a flag (DRAIN, REBOOT_ISSUED, ...).
NODE_BASE_STATES = frozenset(
    {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "END"})  # fmt: skip
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
JOB_BASE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
    "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})  # fmt: skip
FINAL_JOB_STATES = JOB_BASE_STATES - {"PENDING", "RUNNING", "SUSPENDED"}
# 22.05 prints one job state word and lets these flags win over the base state (Slurm's
# job_state_string()); newer layouts list base and flags, so we pick the same word.
JOB_FLAG_PRECEDENCE = (
    "COMPLETING", "CONFIGURING", "RESIZING", "RESV_DEL_HOLD", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED",
)  # fmt: skip
NEXT_STATES = ("RESUME", "DOWN")


class SlurmError(RuntimeError):
    """A Slurm command failed or printed what Medic cannot read; the message is one line."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # base state, upper case: IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: frozenset[str]  # DRAIN, REBOOT_REQUESTED, NOT_RESPONDING, ...
    reason: str = ""
    reason_user: str = ""
    partitions: tuple[str, ...] = ()
    reason_time: int = 0  # epoch seconds the reason was set; 0 without a reason
    gres: str = ""  # "gpu:8", as Slurm prints it
    gres_used: str = ""
    boot_time: int = 0

    @property
    def states(self) -> frozenset[str]:
        """Base state and flags together, e.g. {"IDLE", "DRAIN"}."""
        return self.flags | {self.state}

    @property
    def drained(self) -> bool:
        """DRAIN is set: DRAINING while jobs run, DRAINED once idle."""
        return "DRAIN" in self.flags

    @property
    def down(self) -> bool:
        return "DOWN" in self.states

    @property
    def reboot_pending(self) -> bool:
        return bool(REBOOT_FLAGS & self.flags)


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    name: str
    user: str
    state: str  # RUNNING, PENDING, COMPLETING, ... (22.05's single word)
    reason: str  # state_reason: None, JobHeldUser, launch_failed_requeued_held, ...
    nodes: str  # Slurm's host list, e.g. "n[1-3]"; "" while pending
    requeue: bool
    restart_count: int
    comment: str = ""
    admin_comment: str = ""
    required_nodes: str = ""  # what `-w` asked for, as a host list; "" for none
    partition: str = ""
    description: str = ""  # state_description: "launch failed requeued held", ...
    flags: frozenset[str] = frozenset()  # the job state's flags in newer layouts
    # The GPU indices the job holds on each of its nodes (`gres_detail`, "gpu:4(IDX:0-3)"
    # per node in host-list order); a node missing here: not known (no GRES, an odd entry).
    gpus_by_node: Mapping[str, frozenset[int]] = field(default_factory=dict)

    @property
    def node_names(self) -> list[str]:
        return expand_hostlist(self.nodes)

    @property
    def held(self) -> bool:
        return self.reason in ("JobHeldUser", "JobHeldAdmin") or "held" in self.description


class SlurmClient(Protocol):
    """What Medic needs from Slurm. `CliSlurm` implements it with Slurm's commands."""

    def nodes(self) -> list[NodeInfo]: ...

    def node(self, name: str) -> NodeInfo | None:
        """One node's record (None: no such node); the same fields `nodes()` gives it."""
        ...

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]: ...

    def jobs_on(self, node: str) -> list[JobInfo]:
        """Jobs not yet finished that hold `node` (running, completing, suspended)."""
        ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        """`scontrol reboot ASAP nextstate=... reason=... node`: drains, reboots when idle."""
        ...

    def requeue(self, job_id: str) -> None: ...

    def release(self, job_id: str) -> None: ...

    def hold(self, job_id: str) -> None: ...

    def start_now(self, job_id: str) -> None:
        """Clear the BeginTime Slurm puts on a requeued job (cred_expire + 1 s)."""
        ...

    def controller_time(self) -> int:
        """slurmctld's clock in whole seconds: what it stamps credentials with."""
        ...

    def set_admin_comment(self, job_id: str, text: str) -> None:
        """The job's AdminComment (not Comment, which belongs to the user and carries
        the `medic:resilient=N` tag)."""
        ...

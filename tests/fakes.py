"""The tests' one stand-in for each of Slurm, a clock and pynvml (issue 25).

`FakeSlurm` is slurmctld in memory: it implements `medic_core.slurm.SlurmClient` (the module
end checks that statically) and answers the calls as the lab's real Slurm does, which
tests/test_fakes_conformance.py runs against both. A test that needs more (reservations, a
crash point, a model's bookkeeping) subclasses it; one that needs a call refused configures
`forbid`, `fail` or `unreachable`.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from healthd.checks.base import Clock as CheckClock
from medic_core.slurm import (
    NEXT_STATES,
    JobInfo,
    NodeInfo,
    SlurmClient,
    SlurmError,
    expand_hostlist,
)

# --- Slurm -----------------------------------------------------------------------------------

# What slurmctld answers (scontrol's message after "scontrol: error: ") for the refusals the
# lab shows; tests/test_fakes_conformance.py holds the fake to them.
NO_SUCH_NODE = "Invalid node name specified"
NOT_DRAINED = "Invalid node state specified"
NO_SUCH_JOB = "Invalid job id specified"
PENDING_EXECUTION = "Job is pending execution"  # requeue of a job not yet (re)started
NO_LONGER_PENDING = "Job is no longer pending execution"  # start_now of a started job
REQUEUE_DISABLED = "Requested operation is presently disabled"
TIMED_OUT = "Socket timed out on send/recv operation"
UNREACHABLE = "Unable to contact slurm controller (connect failure)"
# A job whose state is one of these holds its nodes (SlurmClient.jobs_on).
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})


@dataclass
class SlurmNode:
    """One node as slurmctld keeps it; `info()` is what a read returns."""

    name: str
    state: str = "IDLE"  # base state: IDLE, ALLOCATED, MIXED, DOWN
    drain: bool = False
    reason: str = ""
    reason_time: int = 0
    reboot_next: str = ""  # the nextstate of a reboot Slurm holds; "" when none
    partitions: tuple[str, ...] = ("gpu",)
    flags: frozenset[str] = frozenset()  # the other flags: RESERVED, NOT_RESPONDING, ...
    reason_user: str = ""
    gres: str = ""

    @classmethod
    def of(cls, info: NodeInfo) -> SlurmNode:
        return cls(
            info.name,
            info.state,
            info.drained,
            info.reason,
            info.reason_time,
            "RESUME" if info.reboot_pending else "",
            info.partitions,
            info.flags - {"DRAIN", "REBOOT_REQUESTED", "REBOOT_ISSUED"},
            info.reason_user,
            info.gres,
        )

    def info(self) -> NodeInfo:
        flags = set(self.flags)
        if self.drain:
            flags.add("DRAIN")
        if self.reboot_next:
            flags.add("REBOOT_REQUESTED")
        has_reason = bool(self.reason)
        return NodeInfo(
            self.name,
            self.state,
            frozenset(flags),
            self.reason,
            self.reason_user if has_reason else "",
            self.partitions,
            self.reason_time if has_reason else 0,
            self.gres,
        )

    @property
    def in_service(self) -> bool:
        return not self.drain and self.state != "DOWN"


@dataclass
class SlurmJob:
    """One job as slurmctld keeps it; `node` is its host list ("" while pending)."""

    job_id: str
    node: str = ""
    comment: str = ""
    admin_comment: str = ""
    state: str = "RUNNING"
    gpus: frozenset[int] | None = None  # its GRES index on its node; None: not shown
    name: str = "train"
    user: str = "alice"
    reason: str = "None"
    requeue: bool = True
    restart_count: int = 0
    required_nodes: str = ""
    partition: str = "gpu"

    @classmethod
    def of(cls, info: JobInfo) -> SlurmJob:
        gpus = next(iter(info.gpus_by_node.values()), None)
        return cls(
            info.job_id, info.nodes, info.comment, info.admin_comment, info.state, gpus,
            info.name, info.user, info.reason, info.requeue, info.restart_count,
            info.required_nodes, info.partition,
        )  # fmt: skip

    def info(self) -> JobInfo:
        names = expand_hostlist(self.node) if self.node else []
        return JobInfo(
            self.job_id, self.name, self.user, self.state, self.reason, self.node,
            self.requeue, self.restart_count, self.comment, self.admin_comment,
            self.required_nodes, self.partition,
            gpus_by_node={} if self.gpus is None else {n: self.gpus for n in names},
        )  # fmt: skip

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"


class FakeSlurm:
    """slurmctld in memory. Every write is recorded in `calls` as (method, *args), reads too
    with `record_reads`. `fail(method)` makes the next call(s) of a method raise SlurmError
    as a timed-out slurmctld does, `unreachable` every call; a method named in `forbid`
    fails the test."""

    def __init__(
        self,
        nodes: Iterable[str | NodeInfo] = (),
        jobs: Iterable[JobInfo] = (),
        *,
        clock: Callable[[], float] = time.time,
        forbid: Iterable[str] = (),
        user: str = "root",
        record_reads: bool = False,
    ) -> None:
        self.clock = clock  # epoch seconds, for reason times
        self.user = user  # who Medic's calls run as: Slurm's reason_user
        self.by_name: dict[str, SlurmNode] = {}
        self.jobs_: dict[str, SlurmJob] = {}
        self.calls: list[tuple[str, ...]] = []
        self.failing: dict[str, tuple[int | None, str]] = {}
        self.unreachable = False
        self.forbid = frozenset(forbid)
        self.record_reads = record_reads  # a test counting every call to slurmctld
        for n in nodes:
            self.add_node(n)
        for j in jobs:
            self.add_job(j)

    # --- the test's hands: the cluster as it is, recorded as no call ---

    def add_node(
        self,
        node: str | NodeInfo,
        state: str = "IDLE",
        flags: Iterable[str] = (),
        reason: str = "",
    ) -> SlurmNode:
        """A node by name (with its state, flags, reason) or as Slurm would show it."""
        if isinstance(node, NodeInfo):
            made = SlurmNode.of(node)
        else:
            made = SlurmNode.of(NodeInfo(node, state, frozenset(flags), reason, "", ("gpu",)))
        self.by_name[made.name] = made
        return made

    def add_job(self, job: JobInfo) -> SlurmJob:
        self.jobs_[job.job_id] = made = SlurmJob.of(job)
        return made

    def start_job(
        self,
        job_id: str,
        node: str,
        comment: str = "",
        gpus: frozenset[int] | None = None,
        *,
        requeue: bool = True,
        user: str = "alice",
    ) -> SlurmJob:
        """A job running on `node` (a host list), its nodes allocated."""
        job = SlurmJob(job_id, node, comment, gpus=gpus, requeue=requeue, user=user)
        self.jobs_[job_id] = job
        for name in expand_hostlist(node):
            self.by_name[name].state = "ALLOCATED"
        return job

    def end_job(self, job_id: str) -> None:
        job = self.jobs_[job_id]
        job.state = "COMPLETED"
        self._free(job.node)

    def running_on(self, node: str) -> bool:
        return any(j.running and node in expand_hostlist(j.node) for j in self.jobs_.values())

    def admin_drain(self, node: str, reason: str, user: str = "slurm") -> None:
        n = self.by_name[node]
        n.drain, n.reason, n.reason_time, n.reason_user = True, reason, self._now(), user

    def admin_resume(self, node: str) -> None:
        n = self.by_name[node]
        n.drain, n.reason, n.reason_time, n.state = False, "", 0, "IDLE"

    def fail(self, method: str, times: int | None = 1, message: str = TIMED_OUT) -> None:
        """The next `times` calls of `method` raise SlurmError(message); None: until
        `fail(method, 0)`."""
        self.failing[method] = (times, message)

    def called(self, method: str, target: str | None = None) -> list[tuple[str, ...]]:
        """The recorded writes of `method` (on `target`, a node or a job id)."""
        return [c for c in self.calls if c[0] == method and (target is None or c[1] == target)]

    # --- the gate every call passes ---

    def record(self, method: str, *args: str) -> None:
        """A write: recorded, then refused as `fail` / `unreachable` say."""
        self.calls.append((method, *args))
        self.answer(method)

    def read(self, method: str, *args: str) -> None:
        """A read: recorded only with `record_reads`, refused as a write is."""
        if self.record_reads:
            self.calls.append((method, *args))
        self.answer(method)

    def answer(self, method: str) -> None:
        if method in self.forbid:
            raise AssertionError(f"unexpected Slurm call: {method}")
        if self.unreachable:
            raise SlurmError(UNREACHABLE)
        times, message = self.failing.get(method, (0, ""))
        if times is None or times > 0:
            if times is not None:
                self.failing[method] = (times - 1, message)
            raise SlurmError(message)

    def _now(self) -> int:
        return int(self.clock())

    def _node(self, name: str) -> SlurmNode:
        if name not in self.by_name:
            raise SlurmError(f"{NO_SUCH_NODE}: {name}")
        return self.by_name[name]

    def _job(self, job_id: str) -> SlurmJob:
        if job_id not in self.jobs_:
            raise SlurmError(f"{NO_SUCH_JOB} for job {job_id}")
        return self.jobs_[job_id]

    def _free(self, hostlist: str) -> None:
        for name in expand_hostlist(hostlist) if hostlist else []:
            n = self.by_name.get(name)
            if n is not None and n.state == "ALLOCATED" and not self.running_on(name):
                n.state = "IDLE"

    # --- reads ---

    def nodes(self) -> list[NodeInfo]:
        self.read("nodes")
        return [n.info() for n in self.by_name.values()]

    def node(self, name: str) -> NodeInfo | None:
        self.read("node", name)
        found = self.by_name.get(name)
        return found.info() if found is not None else None

    def jobs(self, ids: Sequence[str] | None = None) -> list[JobInfo]:
        self.read("jobs", *(ids or ()))
        wanted = None if ids is None else {str(i) for i in ids}
        return [j.info() for j in self.jobs_.values() if wanted is None or j.job_id in wanted]

    def jobs_on(self, node: str) -> list[JobInfo]:
        self.read("jobs_on", node)
        return [
            j.info()
            for j in self.jobs_.values()
            if j.state in HOLDING_STATES and j.node and node in expand_hostlist(j.node)
        ]

    # --- writes ---

    def drain(self, node: str, reason: str) -> None:
        self.record("drain", node, reason)
        n = self._node(node)
        n.drain, n.reason, n.reason_time, n.reason_user = True, reason, self._now(), self.user

    def resume(self, node: str) -> None:
        self.record("resume", node)
        n = self._node(node)
        if n.in_service:
            raise SlurmError(f"{NOT_DRAINED}: {node}")
        n.drain, n.reason, n.reason_time = False, "", 0
        if n.state == "DOWN":
            n.state = "IDLE"

    def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        if nextstate.upper() not in NEXT_STATES:
            raise ValueError(f"nextstate must be one of {', '.join(NEXT_STATES)}: {nextstate!r}")
        self.record("reboot", node, reason, nextstate)
        n = self._node(node)
        # ASAP: drained so that nothing new starts, rebooted once idle (by the test's hands).
        n.drain, n.reason, n.reason_time, n.reason_user = True, reason, self._now(), self.user
        n.reboot_next = nextstate.upper()

    def requeue(self, job_id: str) -> None:
        self.record("requeue", job_id)
        job = self._job(job_id)
        if job.state == "PENDING":
            raise SlurmError(f"{PENDING_EXECUTION} for job {job_id}")
        if not job.requeue:
            raise SlurmError(f"{REQUEUE_DISABLED} for job {job_id}")
        was_on = job.node
        # Running, suspended or finished alike (scontrol(1)); Slurm holds a requeued job back
        # until its old credential expires (BeginTime).
        job.state, job.node, job.reason = "PENDING", "", "BeginTime"
        job.restart_count += 1
        self._free(was_on)

    def hold(self, job_id: str) -> None:
        self.record("hold", job_id)
        self._job(job_id).reason = "JobHeldAdmin"  # running or pending alike

    def release(self, job_id: str) -> None:
        self.record("release", job_id)
        job = self._job(job_id)
        if job.reason in ("JobHeldUser", "JobHeldAdmin"):
            job.reason = "None"

    def start_now(self, job_id: str) -> None:
        self.record("start_now", job_id)
        job = self._job(job_id)
        if job.state != "PENDING":
            raise SlurmError(f"{NO_LONGER_PENDING} for job {job_id}")
        if job.reason == "BeginTime":
            job.reason = "None"

    def controller_time(self) -> int:
        self.read("controller_time")
        return int(self.clock())

    def set_admin_comment(self, job_id: str, text: str) -> None:
        self.record("set_admin_comment", job_id, text)
        self._job(job_id).admin_comment = text


# --- a clock ---------------------------------------------------------------------------------

CLOCK_EPOCH = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


class FakeClock:
    """Seconds that move only when the test moves them (`now`, or `advance`). Called, it
    stands in for `time.monotonic`; `checks` is the same time as the checks' Clock
    (monotonic(), now() as a UTC datetime, `now` seconds after CLOCK_EPOCH)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def wall(self) -> dt.datetime:
        return CLOCK_EPOCH + dt.timedelta(seconds=self.now)

    @property
    def checks(self) -> CheckClock:
        return _CheckView(self)


@dataclass(frozen=True)
class _CheckView:
    clock: FakeClock

    def monotonic(self) -> float:
        return self.clock.now

    def now(self) -> dt.datetime:
        return self.clock.wall()


# --- pynvml ----------------------------------------------------------------------------------


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_FunctionNotFound(NVMLError):
    pass


class FakeNvml:
    """The pynvml module as the client loads it: its errors, init and shutdown (counted),
    the device count and handles (a handle is the GPU's index). A test subclasses it for the
    device reads it needs."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVML_SUCCESS = 0

    def __init__(self, gpus: int = 1) -> None:
        self.gpus = gpus
        self.inits = 0
        self.shutdowns = 0
        self.open = False  # between an nvmlInit and its nvmlShutdown

    def nvmlInit(self) -> None:
        self.inits += 1
        self.open = True

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        self.open = False

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index


def _a_slurm_client(fake: FakeSlurm) -> SlurmClient:
    return fake  # mypy checks here that FakeSlurm implements SlurmClient

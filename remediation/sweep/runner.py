"""Offline sweeps (`medic sweep`): take idle nodes out of scheduling a few at a time, run the
deep tier on each as a Slurm job, give back the healthy ones and hand the failing ones to
the remediation ladder.

    planned --take--> taking --reservation made--> held --srun--> running --report--> checked
                        |                            |                                   |
                        +--> skipped (busy, drained) +--> (resume: job cancelled, again) |
                                                         returned <--- pass, inconclusive -+
                                                         handed   <--- fail: ladder admits,
                                                                       Medic's drain stays

A node is taken with a Slurm reservation named `medic-sweep-<sweep>-<node>` (created only
while the node is idle: Slurm refuses a reservation on a busy node, so no job is ever
pre-empted), the deep tier runs as `srun --reservation=... -w NODE medic sweep probe`, and
giving the node back is deleting that reservation: a sweep never resumes, drains or
undrains a node it did not take, and a reservation outlives a killed sweep by at most its
duration. Every step is written to the store before it is taken; `Sweeper.run` after a
crash resumes the unfinished sweep from those rows (schema version 4).

Pure planning (`risk`, `rank`, `share_cap`, `next_batch`, `judge`) is separate from the
runner (`Sweeper`), which gathers from Slurm and the store and acts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import fcntl
import json
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from medic_core import proc
from medic_core.config import MedicConfig
from medic_core.drain_reason import drain_if_allowed, format_reason
from medic_core.settings import SweepSettings
from medic_core.slurm import CliSlurm, NodeInfo, SlurmError
from medic_core.status import Status, worst
from medic_core.store import Severity, Store
from medic_core.store.engine import writer
from medic_core.store.models import NAMING_CONVENTION
from medic_core.vocabulary import Finding, Recommendation
from remediation import episodes as ep

log = logging.getLogger("medic.sweep")

SWEEP_LOCK_KEY = 0x4D45445357  # "MEDSW": the PostgreSQL advisory lock held by a running sweep
RESERVATION_PREFIX = "medic-sweep-"
EVENT_KIND = "sweep"
# Seconds a reservation outlives the node's deep-tier timeout: room for srun to start and
# for the sweep to record the result and delete it.
RESERVATION_SLACK = 600.0

# Sweep states.
RUNNING, DONE = "running", "done"
# Node states, in order; see the module docstring.
PLANNED, TAKING, HELD, PROBING, CHECKED = "planned", "taking", "held", "running", "checked"
RETURNED, HANDED, SKIPPED = "returned", "handed", "skipped"
HOLDING = (TAKING, HELD, PROBING, CHECKED)  # the sweep may hold the node: counts on the share
FINAL = (RETURNED, HANDED, SKIPPED)

# Node verdicts.
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"

METADATA = MetaData(naming_convention=NAMING_CONVENTION)
_ident = BigInteger().with_variant(Integer(), "sqlite")
_data = JSON().with_variant(JSONB(), "postgresql")
_when = DateTime(timezone=True)

sweeps = Table(
    "sweeps",
    METADATA,
    Column("id", _ident, primary_key=True, autoincrement=True),
    Column("state", String(16), nullable=False),
    Column("partition", String(255), nullable=False),
    Column("share", Float, nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("message", Text, nullable=False),
    Column("started_at", _when, nullable=False),
    Column("updated_at", _when, nullable=False),
    Column("finished_at", _when, nullable=True),
    Index(None, "state"),
)
sweep_nodes = Table(
    "sweep_nodes",
    METADATA,
    Column("id", _ident, primary_key=True, autoincrement=True),
    Column("sweep_id", _ident, ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False),
    Column("node", String(255), nullable=False),
    Column("position", Integer, nullable=False),
    Column("partitions", _data, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reservation", String(255), nullable=False),
    Column("risk", _data, nullable=False),
    Column("status", String(16), nullable=False),
    Column("findings", _data, nullable=False),
    Column("message", Text, nullable=False),
    Column("episode_id", BigInteger, nullable=True),
    Column("taken_at", _when, nullable=True),
    Column("checked_at", _when, nullable=True),
    Column("returned_at", _when, nullable=True),
    Column("seconds", Float, nullable=True),
    Index(None, "sweep_id", "node", unique=True),
    Index(None, "node", "checked_at"),
)


# ---- settings ------------------------------------------------------------------------------


# ---- pure: risk, share, next batch, verdict -----------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """What the planner knows of one node."""

    node: str
    partitions: tuple[str, ...]
    available: bool  # idle, not drained, down, rebooting or held by an open episode
    why_not: str = ""
    episodes_recent: int = 0
    failed_requalifications: int = 0
    last_deep: dt.datetime | None = None  # the last deep-tier verdict, any source
    correctable: int = 0  # lifetime correctable ECC errors now (sum over GPUs)
    correctable_before: int | None = None  # ...at the node's previous sweep
    correctable_since: dt.datetime | None = None


@dataclass(frozen=True)
class Risk:
    node: str
    score: float
    due: bool  # not deep-checked within min_interval_days
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"score": round(self.score, 2), "due": self.due, "reasons": list(self.reasons)}


NEVER_CHECKED_STALENESS = 3.0  # a node never deep-checked ranks as three intervals overdue
MAX_STALENESS = 10.0


def risk(c: Candidate, now: dt.datetime, min_interval_days: float) -> Risk:
    """Higher first: a lemon's history, time since the last deep check (in units of the
    interval), and how fast correctable ECC errors grew since the previous sweep."""
    reasons: list[str] = []
    lemon = 10.0 * c.episodes_recent + 20.0 * c.failed_requalifications
    if lemon:
        reasons.append(
            f"{c.episodes_recent} episodes, {c.failed_requalifications} failed re-qualifications"
        )
    interval = max(min_interval_days, 1.0 / 24)
    if c.last_deep is None:
        staleness, due = NEVER_CHECKED_STALENESS, True
        reasons.append("never deep-checked")
    else:
        days = max(0.0, (now - c.last_deep).total_seconds() / 86400)
        staleness = min(MAX_STALENESS, days / interval)
        due = days >= min_interval_days
        reasons.append(f"deep-checked {days:.1f} days ago")
    trend = 0.0
    if c.correctable_before is not None and c.correctable_since is not None:
        grown = c.correctable - c.correctable_before
        days = max((now - c.correctable_since).total_seconds() / 86400, 1.0 / 24)
        if grown > 0:
            trend = min(30.0, 10.0 * math.log10(1 + grown / days))
            reasons.append(f"correctable ECC errors +{grown} in {days:.1f} days")
    return Risk(c.node, lemon + 10.0 * staleness + trend, due, tuple(reasons))


def natural_key(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def rank(
    candidates: Iterable[Candidate], now: dt.datetime, min_interval_days: float
) -> list[tuple[Candidate, Risk]]:
    """Available nodes that are due, riskiest first (ties: longest unchecked, then name)."""
    scored = [(c, risk(c, now, min_interval_days)) for c in candidates if c.available and c.node]
    due = [(c, r) for c, r in scored if r.due]
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    return sorted(
        due, key=lambda cr: (-cr[1].score, cr[0].last_deep or epoch, natural_key(cr[0].node))
    )


def share_cap(partition_nodes: int, share: float, minimum: int) -> int:
    """Nodes of a partition a sweep may hold at once: the share rounded down, but at least
    `minimum` (default 1: 5 % of a 5-node partition is one node, not none), never more than
    the partition has."""
    return min(partition_nodes, max(minimum, math.floor(partition_nodes * share + 1e-9)))


def partition_caps(nodes: Iterable[NodeInfo], share: float, minimum: int) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for node in nodes:
        for partition in node.partitions:
            sizes[partition] = sizes.get(partition, 0) + 1
    return {p: share_cap(n, share, minimum) for p, n in sizes.items()}


def next_batch(
    queue: Sequence[str],
    partitions_of: Mapping[str, Sequence[str]],
    held: Mapping[str, int],
    caps: Mapping[str, int],
) -> list[str]:
    """The nodes of `queue` (in order) that can be taken now: each must fit under the cap of
    every partition it belongs to, counting what is held and what this batch takes."""
    taken = dict(held)
    batch: list[str] = []
    for node in queue:
        parts = partitions_of.get(node, ())
        if all(taken.get(p, 0) < caps.get(p, 0) for p in parts) and parts:
            batch.append(node)
            for p in parts:
                taken[p] = taken.get(p, 0) + 1
    return batch


@dataclass(frozen=True)
class NodeVerdict:
    outcome: str  # pass, fail, inconclusive
    status: str  # the worst status reported (or UNKNOWN)
    findings: tuple[Finding, ...]  # what failed (CRITICAL), for the ladder
    message: str
    report: Mapping[str, Any] = field(default_factory=dict)


TIMEOUT_FAULT = "sweep.deep_timeout"


def judge(
    returncode: int | None, stdout: str, timed_out: bool, why: str, timeout: float
) -> NodeVerdict:
    """A probe's outcome. CRITICAL results fail the node; a deep tier that overran its
    timeout fails it too (a hung diagnostic is a finding); a probe that never ran or printed
    no report (srun could not start, say) is inconclusive and the node goes back."""
    report = _last_json(stdout)
    if timed_out:
        finding = Finding(
            check="sweep",
            status=Status.CRITICAL,
            fault_class=TIMEOUT_FAULT,
            target="",
            message=f"the deep tier did not finish within {timeout:g}s",
            recommendation=Recommendation.DRAIN,
        )
        return NodeVerdict(FAIL, Status.CRITICAL.value, (finding,), finding.message, report or {})
    if report is None:
        return NodeVerdict(
            INCONCLUSIVE, Status.UNKNOWN.value, (), f"no report from the probe: {why}"
        )
    results = [r for r in report.get("results", []) if isinstance(r, Mapping)]
    findings = [Finding.from_json(dict(r)) for r in results]
    critical = tuple(f for f in findings if f.status is Status.CRITICAL)
    status = worst(f.status for f in findings)
    ran = sorted({f.check for f in findings if f.status is not Status.NOT_APPLICABLE})
    if critical:
        first = critical[0]
        return NodeVerdict(
            FAIL, status.value, critical, f"{first.fault_class}: {first.message}", report
        )
    if not ran:
        return NodeVerdict(
            INCONCLUSIVE, status.value, (), "no deep check applies on this node", report
        )
    note = f"{len(ran)} deep checks: {', '.join(ran)}"
    if returncode not in (0, None):
        note += f" (probe exit {returncode})"
    return NodeVerdict(PASS, status.value, (), f"{status.value}: {note}", report)


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict) and "results" in doc:
                    return doc
    return None


def reservation_name(sweep_id: int, node: str) -> str:
    return f"{RESERVATION_PREFIX}{sweep_id}-{node}"


def gres_request(gres: str) -> str | None:
    """`--gres` asking for every GPU the node has ("gpu:h100:8(S:0-1)" -> "gpu:8"): the deep
    tier needs them all, and a job sees only the GPUs it asked for."""
    total = 0
    for part in re.split(r",(?![^(]*\))", gres):
        match = re.match(r"^gpu(?::[^:(]+)?:(\d+)", part.strip())
        if match:
            total += int(match.group(1))
    return f"gpu:{total}" if total else None


# ---- persistence ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepRow:
    id: int
    state: str
    partition: str
    share: float
    host: str
    pid: int
    message: str
    started_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None


@dataclass(frozen=True)
class SweepNode:
    id: int
    sweep_id: int
    node: str
    position: int
    partitions: tuple[str, ...]
    state: str
    reservation: str
    risk: Mapping[str, Any]
    status: str
    findings: Sequence[Mapping[str, Any]]
    message: str
    episode_id: int | None
    taken_at: dt.datetime | None
    checked_at: dt.datetime | None
    returned_at: dt.datetime | None
    seconds: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "position": self.position,
            "partitions": list(self.partitions),
            "state": self.state,
            "status": self.status,
            "message": self.message,
            "episode_id": self.episode_id,
            "risk": dict(self.risk),
            "reservation": self.reservation,
            "taken_at": _iso(self.taken_at),
            "checked_at": _iso(self.checked_at),
            "returned_at": _iso(self.returned_at),
            "seconds": self.seconds,
        }


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def _utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    assert isinstance(value, dt.datetime)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


class SweepBusy(RuntimeError):
    """Another sweep holds the lock."""


@dataclass
class SweepStore:
    store: Store

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """One sweep at a time, fleet-wide; never waits: a second sweep raises SweepBusy.
        The lock dies with its holder (a lock file next to SQLite, a session-level advisory
        lock on PostgreSQL), so a killed sweep never blocks the next."""
        if self.store.backend == "sqlite":
            database = self.store.engine.url.database
            if not database or database == ":memory:":
                yield
                return
            with Path(database + ".sweep.lock").open("a") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise SweepBusy(self._holder()) from None
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
            return
        with self.store.engine.connect() as conn:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": SWEEP_LOCK_KEY})
            if not got.scalar():
                conn.rollback()
                raise SweepBusy(self._holder())
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": SWEEP_LOCK_KEY})
                conn.commit()

    def _holder(self) -> str:
        active = self.active()
        if active is None:
            return "another sweep is starting"
        return f"sweep {active.id} is running (pid {active.pid} on {active.host})"

    def create(self, partition: str, share: float, plan: Sequence[tuple[Candidate, Risk]]) -> int:
        now = self.now()
        with writer(self.store.engine).begin() as conn:
            result = conn.execute(
                insert(sweeps).values(
                    state=RUNNING,
                    partition=partition,
                    share=share,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    message="",
                    started_at=now,
                    updated_at=now,
                    finished_at=None,
                )
            )
            key = result.inserted_primary_key
            assert key is not None
            sweep_id = int(key[0])
            for position, (candidate, score) in enumerate(plan):
                conn.execute(
                    insert(sweep_nodes).values(
                        sweep_id=sweep_id,
                        node=candidate.node,
                        position=position,
                        partitions=list(candidate.partitions),
                        state=PLANNED,
                        reservation=reservation_name(sweep_id, candidate.node),
                        risk={**score.to_json(), "correctable": candidate.correctable},
                        status="",
                        findings=[],
                        message="",
                        episode_id=None,
                    )
                )
        return sweep_id

    def adopt(self, sweep_id: int) -> None:
        """A resumed sweep: this process runs it now."""
        with writer(self.store.engine).begin() as conn:
            conn.execute(
                update(sweeps)
                .where(sweeps.c.id == sweep_id)
                .values(host=socket.gethostname(), pid=os.getpid(), updated_at=self.now())
            )

    def finish(self, sweep_id: int, message: str) -> None:
        now = self.now()
        with writer(self.store.engine).begin() as conn:
            conn.execute(
                update(sweeps)
                .where(sweeps.c.id == sweep_id)
                .values(state=DONE, message=message, updated_at=now, finished_at=now)
            )

    def set_node(self, row_id: int, **values: Any) -> None:
        with writer(self.store.engine).begin() as conn:
            conn.execute(update(sweep_nodes).where(sweep_nodes.c.id == row_id).values(**values))

    def active(self) -> SweepRow | None:
        query = select(sweeps).where(sweeps.c.state == RUNNING).order_by(sweeps.c.id)
        with self.store.engine.connect() as conn:
            row = conn.execute(query).first()
        return _sweep(row._mapping) if row is not None else None

    def get(self, sweep_id: int) -> SweepRow | None:
        with self.store.engine.connect() as conn:
            row = conn.execute(select(sweeps).where(sweeps.c.id == sweep_id)).first()
        return _sweep(row._mapping) if row is not None else None

    def latest(self) -> SweepRow | None:
        with self.store.engine.connect() as conn:
            row = conn.execute(select(sweeps).order_by(sweeps.c.id.desc())).first()
        return _sweep(row._mapping) if row is not None else None

    def nodes(self, sweep_id: int) -> list[SweepNode]:
        query = (
            select(sweep_nodes)
            .where(sweep_nodes.c.sweep_id == sweep_id)
            .order_by(sweep_nodes.c.position)
        )
        with self.store.engine.connect() as conn:
            return [_sweep_node(r._mapping) for r in conn.execute(query)]

    def history(self) -> dict[str, SweepNode]:
        """Each node's most recent sweep verdict (its last deep check by a sweep)."""
        query = (
            select(sweep_nodes)
            .where(sweep_nodes.c.checked_at.is_not(None))
            .order_by(sweep_nodes.c.checked_at)
        )
        with self.store.engine.connect() as conn:
            return {r.node: _sweep_node(r._mapping) for r in conn.execute(query)}


def _sweep(m: Mapping[Any, Any]) -> SweepRow:
    started, updated = _utc(m["started_at"]), _utc(m["updated_at"])
    assert started is not None and updated is not None
    return SweepRow(
        id=int(m["id"]),
        state=m["state"],
        partition=m["partition"],
        share=float(m["share"]),
        host=m["host"],
        pid=int(m["pid"]),
        message=m["message"],
        started_at=started,
        updated_at=updated,
        finished_at=_utc(m["finished_at"]),
    )


def _sweep_node(m: Mapping[Any, Any]) -> SweepNode:
    return SweepNode(
        id=int(m["id"]),
        sweep_id=int(m["sweep_id"]),
        node=m["node"],
        position=int(m["position"]),
        partitions=tuple(m["partitions"] or ()),
        state=m["state"],
        reservation=m["reservation"],
        risk=dict(m["risk"] or {}),
        status=m["status"],
        findings=list(m["findings"] or []),
        message=m["message"],
        episode_id=m["episode_id"],
        taken_at=_utc(m["taken_at"]),
        checked_at=_utc(m["checked_at"]),
        returned_at=_utc(m["returned_at"]),
        seconds=m["seconds"],
    )


# ---- Slurm: reservations and the probe job --------------------------------------------------


class SweepSlurm(CliSlurm):
    """Slurm's commands a sweep needs beyond the common client's."""

    def create_reservation(self, name: str, node: str, minutes: int, user: str) -> None:
        self._run(
            "scontrol",
            "create",
            "reservation",
            f"reservationname={name}",
            f"nodes={node}",
            "starttime=now",
            f"duration={minutes}",
            f"users={user}",
        )

    def reservation_exists(self, name: str) -> bool:
        try:
            self._run("scontrol", "show", "reservation", name)
        except SlurmError as exc:
            if "not found" in str(exc):
                return False
            raise
        return True

    def delete_reservation(self, name: str) -> bool:
        """False when it was already gone (expired, or deleted before a crash)."""
        try:
            self._run("scontrol", "delete", f"reservation={name}")
        except SlurmError as exc:
            if not self.reservation_exists(name):
                return False
            raise SlurmError(f"cannot give back {name}: {exc}") from exc
        return True

    def cancel_reservation_jobs(self, name: str) -> None:
        self._run("scancel", f"--reservation={name}")

    def srun(
        self, args: Sequence[str], timeout: float, env: Mapping[str, str]
    ) -> proc.CommandResult:
        return proc.run([self._binary("srun"), *args], timeout=timeout, env=env)


# ---- the runner ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """One step of a sweep, for the CLI's progress bar or log lines."""

    node: str
    state: str
    message: str
    done: int
    total: int


@dataclass(frozen=True)
class SweepReport:
    sweep_id: int | None
    resumed: bool
    dry_run: bool
    nodes: tuple[SweepNode, ...]
    plan: tuple[tuple[Candidate, Risk], ...]
    caps: Mapping[str, int]
    seconds: float
    message: str

    def to_json(self) -> dict[str, Any]:
        if self.dry_run:
            nodes = [
                {"node": c.node, "partitions": list(c.partitions), "risk": r.to_json()}
                for c, r in self.plan
            ]
        else:
            nodes = [n.to_json() for n in self.nodes]
        return {
            "sweep": self.sweep_id,
            "resumed": self.resumed,
            "dry_run": self.dry_run,
            "caps": dict(self.caps),
            "seconds": round(self.seconds, 3),
            "message": self.message,
            "nodes": nodes,
        }


def _episode_counts(episodes: Iterable[ep.Episode]) -> dict[str, tuple[int, int]]:
    counts: dict[str, tuple[int, int]] = {}
    for e in episodes:
        n, failed = counts.get(e.node, (0, 0))
        counts[e.node] = (n + 1, failed + e.failed_requalifications)
    return counts


# Flags of a node someone else holds or that cannot run a job now. RESERVED is ours once
# our reservation exists (newer Slurm shows it), so it is judged only before taking.
NOT_TAKEN_FLAGS = frozenset(
    {
        "COMPLETING",
        "NOT_RESPONDING",
        "MAINTENANCE",
        "RESERVED",
        "POWER_DOWN",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWERING_UP",
        "FAIL",
        "PLANNED",
        "INVALID_REG",
    }
)


def availability(node: NodeInfo, open_episode: bool, ours: bool = False) -> str:
    """Why a node cannot be taken now; "" when it can (idle and nobody's)."""
    if open_episode:
        return "an open remediation episode holds it"
    if node.drained or node.down:
        return f"out of service ({node.reason or node.state})"
    if node.reboot_pending:
        return "a reboot is pending"
    blocking = node.flags & (NOT_TAKEN_FLAGS - ({"RESERVED", "MAINTENANCE"} if ours else set()))
    if node.state != "IDLE" or blocking:
        return f"not idle ({','.join(sorted({node.state, *blocking}))})"
    return ""


class Sweeper:
    def __init__(
        self,
        config: MedicConfig,
        store: Store,
        slurm: SweepSlurm,
        settings: SweepSettings,
        progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.rows = SweepStore(store)
        self.episodes = ep.EpisodeStore(store)
        self.slurm = slurm
        self.settings = settings
        self.progress = progress or (lambda _p: None)
        self._done = 0
        self._total = 0

    # ---- gather --------------------------------------------------------------------------

    def candidates(self, nodes: Sequence[NodeInfo]) -> list[Candidate]:
        now = self.rows.now()
        since = now - dt.timedelta(days=self.settings.lemon_days)
        counts = _episode_counts(self.episodes.find(since=since))
        open_nodes = {e.node for e in self.episodes.find(states=ep.OPEN_STATES)}
        history = self.rows.history()
        deep_seen: dict[str, dt.datetime] = {}
        correctable: dict[str, int] = {}
        for cond in self.store.conditions():
            if cond.type.startswith("deep_") and cond.status.value != "NOT_APPLICABLE":
                deep_seen[cond.node] = max(
                    cond.updated_at, deep_seen.get(cond.node, cond.updated_at)
                )
            if cond.type == "gpu_ecc":
                correctable[cond.node] = correctable.get(cond.node, 0) + int(
                    cond.evidence.get("aggregate_sbe") or 0
                )
        found = []
        for node in nodes:
            last = history.get(node.name)
            seen = [t for t in (deep_seen.get(node.name), last.checked_at if last else None) if t]
            before = last.risk.get("correctable") if last else None
            episodes, failed = counts.get(node.name, (0, 0))
            why = availability(node, node.name in open_nodes)
            found.append(
                Candidate(
                    node=node.name,
                    partitions=node.partitions,
                    available=not why,
                    why_not=why,
                    episodes_recent=episodes,
                    failed_requalifications=failed,
                    last_deep=max(seen) if seen else None,
                    correctable=correctable.get(node.name, 0),
                    correctable_before=int(before) if isinstance(before, int) else None,
                    correctable_since=last.checked_at if last else None,
                )
            )
        return found

    def plan(
        self, nodes: Sequence[NodeInfo], partition: str | None
    ) -> list[tuple[Candidate, Risk]]:
        wanted = {partition} if partition else set(self.settings.partitions)
        chosen = [n for n in nodes if not wanted or wanted & set(n.partitions)]
        ranked = rank(self.candidates(chosen), self.rows.now(), self.settings.min_interval_days)
        if self.settings.max_nodes:
            ranked = ranked[: self.settings.max_nodes]
        return ranked

    # ---- run -----------------------------------------------------------------------------

    def run(
        self, partition: str | None = None, share: float | None = None, dry_run: bool = False
    ) -> SweepReport:
        started = time.monotonic()
        share = self.settings.share if share is None else share
        if dry_run:
            nodes = self.slurm.nodes()
            plan = self.plan(nodes, partition)
            caps = partition_caps(nodes, share, self.settings.min_nodes)
            return SweepReport(
                None,
                False,
                True,
                (),
                tuple(plan),
                caps,
                time.monotonic() - started,
                f"would check {len(plan)} nodes",
            )
        with self.rows.exclusive():
            active = self.rows.active()
            resumed = active is not None
            if active is None:
                nodes = self.slurm.nodes()
                plan = self.plan(nodes, partition)
                sweep_id = self.rows.create(partition or "", share, plan)
                log.info("sweep %d: %d nodes planned", sweep_id, len(plan))
            else:
                sweep_id, share = active.id, active.share
                self.rows.adopt(sweep_id)
                log.warning(
                    "resuming sweep %d (was pid %d on %s)", sweep_id, active.pid, active.host
                )
            caps = self._drive(sweep_id, share)
            rows = self.rows.nodes(sweep_id)
            message = _summary(rows)
            self.rows.finish(sweep_id, message)
            plan_rows = tuple(rows)
        return SweepReport(
            sweep_id, resumed, False, plan_rows, (), caps, time.monotonic() - started, message
        )

    def _drive(self, sweep_id: int, share: float) -> dict[str, int]:
        rows = self.rows.nodes(sweep_id)
        self._total = len(rows)
        self._done = sum(1 for r in rows if r.state in FINAL)
        nodes = self.slurm.nodes()
        caps = partition_caps(nodes, share, self.settings.min_nodes)
        workers = max(1, sum(caps.values()))
        with concurrent.futures.ThreadPoolExecutor(workers, "sweep") as pool:
            running: dict[concurrent.futures.Future[None], SweepNode] = {}
            for row in rows:  # what a killed sweep left half done, first
                if row.state in HOLDING:
                    running[pool.submit(self._recover, row)] = row
            while True:
                rows = self.rows.nodes(sweep_id)
                queue = [r for r in rows if r.state == PLANNED]
                if not queue and not running:
                    break
                held: dict[str, int] = {}
                for r in rows:
                    if r.state in HOLDING:
                        for p in r.partitions:
                            held[p] = held.get(p, 0) + 1
                if queue:
                    nodes = self.slurm.nodes()
                    caps = partition_caps(nodes, share, self.settings.min_nodes)
                    by_name = {n.name: n for n in nodes}
                    partitions_of = {
                        r.node: by_name[r.node].partitions if r.node in by_name else ()
                        for r in queue
                    }
                    for name in next_batch([r.node for r in queue], partitions_of, held, caps):
                        row = next(r for r in queue if r.node == name)
                        if self._take(row, by_name.get(name)):
                            running[pool.submit(self._check, row)] = row
                        for p in partitions_of[name]:
                            held[p] = held.get(p, 0) + 1
                    unplaceable = [r for r in queue if not partitions_of[r.node]]
                    for r in unplaceable:
                        self._skip(r, "no longer in Slurm's node list")
                if not running:
                    continue
                finished, _ = concurrent.futures.wait(
                    running, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in finished:
                    row = running.pop(future)
                    try:
                        future.result()
                    except Exception:
                        log.exception("sweep of %s failed; its reservation expires", row.node)
                        self.rows.set_node(
                            row.id, state=SKIPPED, message="sweep error: see the log"
                        )
        return caps

    # ---- one node ------------------------------------------------------------------------

    def _report(self, row: SweepNode, state: str, message: str) -> None:
        if state in FINAL:
            self._done += 1
        self.progress(Progress(row.node, state, message, self._done, self._total))

    def _skip(self, row: SweepNode, why: str) -> None:
        self.rows.set_node(row.id, state=SKIPPED, message=why)
        self._report(row, SKIPPED, why)

    def _minutes(self) -> int:
        return math.ceil((self.settings.timeout + self.settings.immediate + RESERVATION_SLACK) / 60)

    def _take(self, row: SweepNode, node: NodeInfo | None) -> bool:
        why = "no longer in Slurm's node list" if node is None else ""
        if node is not None:
            why = availability(node, self.episodes.open_for(row.node) is not None)
        if why:
            self._skip(row, why)
            return False
        self.rows.set_node(row.id, state=TAKING, taken_at=self.rows.now())
        user = self.settings.reservation_user or _user()
        try:
            self.slurm.create_reservation(row.reservation, row.node, self._minutes(), user)
        except SlurmError as exc:  # busy since we looked (Slurm refuses), or gone
            self._skip(row, f"not taken: {exc}")
            return False
        # Someone may have drained it between our look and the reservation: theirs now.
        again = self.slurm.node(row.node)
        why = "gone" if again is None else availability(again, False, ours=True)
        if why:
            self._give_back(row, SKIPPED, f"not taken: {why}")
            return False
        self.rows.set_node(row.id, state=HELD)
        self._report(row, HELD, f"taken ({row.reservation})")
        return True

    def _recover(self, row: SweepNode) -> None:
        """A node a killed sweep left held: cancel its orphaned probe and decide again."""
        if row.state == CHECKED:
            self._finish(row, _stored_verdict(row))
            return
        if not self.slurm.reservation_exists(row.reservation):
            # Never made (killed right after the intent), or expired: plan it again.
            self.rows.set_node(row.id, state=PLANNED, taken_at=None)
            self._report(row, PLANNED, "reservation gone: planned again")
            return
        self.slurm.cancel_reservation_jobs(row.reservation)
        self.rows.set_node(row.id, state=HELD)
        self._report(row, HELD, "resumed: the interrupted probe is run again")
        self._check(row)

    def _check(self, row: SweepNode) -> None:
        self.rows.set_node(row.id, state=PROBING)
        self._report(row, PROBING, "deep tier running")
        info = self.slurm.node(row.node)
        args = [
            f"--reservation={row.reservation}",
            f"--nodelist={row.node}",
            "--nodes=1",
            "--ntasks=1",
            "--exclusive",
            f"--job-name={row.reservation}",
            f"--time={math.ceil(self.settings.timeout / 60) + 1}",
            f"--immediate={math.ceil(self.settings.immediate)}",
            "--quiet",
        ]
        gres = gres_request(info.gres) if info else None
        if gres:
            args.append(f"--gres={gres}")
        probe = [*self.settings.probe, "--timeout", f"{self.settings.timeout:g}"]
        for name in self.settings.checks:
            probe += ["--check", name]
        started = time.monotonic()
        result = self.slurm.srun(
            [*args, *self.settings.srun_args, *probe],
            timeout=self.settings.timeout + self.settings.immediate + 30,
            env=self._job_env(),
        )
        if result.timed_out:
            with contextlib.suppress(SlurmError):
                self.slurm.cancel_reservation_jobs(row.reservation)
        verdict = judge(
            result.returncode,
            result.stdout,
            result.timed_out,
            result.describe_failure(),
            self.settings.timeout,
        )
        self._record(row, verdict, time.monotonic() - started)
        self._finish(row, verdict)

    def _job_env(self) -> dict[str, str]:
        # The probe names its node from SLURMD_NODENAME: a MEDIC_NODE_NAME of ours would
        # make it speak for the wrong node.
        env = {k: v for k, v in os.environ.items() if k != "MEDIC_NODE_NAME"}
        env.update(self.slurm.env)
        return env

    def _record(self, row: SweepNode, verdict: NodeVerdict, seconds: float) -> None:
        now = self.rows.now()
        findings = [
            {
                "check": f.check,
                "status": f.status.value,
                "fault_class": f.fault_class,
                "target": f.target,
                "message": f.message,
                "recommendation": f.recommendation,
            }
            for f in verdict.findings
        ]
        self.rows.set_node(
            row.id,
            state=CHECKED,
            status=verdict.outcome,
            findings=findings,
            message=verdict.message[:2000],
            checked_at=now,
            seconds=round(seconds, 3),
        )
        severity = {PASS: Severity.INFO, FAIL: Severity.CRITICAL}.get(
            verdict.outcome, Severity.WARN
        )
        self.store.add_event(
            node=row.node,
            at=now,
            kind=EVENT_KIND,
            severity=severity,
            source=f"sweep:{row.sweep_id}",
            message=f"deep tier {verdict.outcome}: {verdict.message}",
            fault_class=verdict.findings[0].fault_class if verdict.findings else "",
            target=verdict.findings[0].target if verdict.findings else "",
            evidence={
                "sweep": row.sweep_id,
                "seconds": round(seconds, 3),
                "findings": findings,
                "source": verdict.report.get("source"),
            },
        )
        self._report(row, CHECKED, f"{verdict.outcome}: {verdict.message}")

    def _finish(self, row: SweepNode, verdict: NodeVerdict) -> None:
        if verdict.outcome != FAIL:
            self._give_back(row, RETURNED, verdict.message)
            return
        episode_id, why = self._hand_to_ladder(row.node, verdict.findings, row.taken_at)
        self.rows.set_node(row.id, episode_id=episode_id)
        self._give_back(row, HANDED, why)

    def _hand_to_ladder(
        self, node: str, findings: Sequence[Finding], taken: dt.datetime | None
    ) -> tuple[int | None, str]:
        """The ladder's own admission (kill switch, drain cap, lemon, fleet signature), then
        Medic's drain with the fault's reason: the node is the episode's from here on."""
        from medic_core.settings import RemediationSettings
        from remediation.ladder import Ladder

        # The node's medic-healthd ran the probe, recorded the fault and admitted it itself
        # (its episode may be closed already: needs_human); a second episode would double
        # count towards the lemon score.
        since = taken or self.rows.now()
        own = self.episodes.find(node=node, since=since)
        if own and not own[-1].open:
            return own[-1].id, f"episode {own[-1].id} ({own[-1].state}) opened by medic-healthd"

        ladder = Ladder(
            node,
            self.episodes,
            self.slurm,
            _SweepLadderHost(self.store, node),
            RemediationSettings.from_config(self.config),
        )
        admission = ladder.admit(findings)
        episode = admission.episode
        if not admission.drain:
            return (episode.id if episode else None), f"ladder: not drained ({admission.why})"
        first = findings[0]
        reason = format_reason(first.fault_class or first.check, first.target, first.message)
        outcome = drain_if_allowed(self.slurm, node, reason)
        ladder.drained(admission, outcome.value)
        return (episode.id if episode else None), (
            f"episode {episode.id if episode else '-'}: {admission.why}; drain {outcome.value}"
        )

    def _give_back(self, row: SweepNode, state: str, message: str) -> None:
        self.slurm.delete_reservation(row.reservation)
        self.rows.set_node(row.id, state=state, message=message[:2000], returned_at=self.rows.now())
        self._report(row, state, message)


def _stored_verdict(row: SweepNode) -> NodeVerdict:
    findings = tuple(
        Finding(
            check=str(f.get("check", "")),
            status=Status(f.get("status", "CRITICAL")),
            fault_class=str(f.get("fault_class", "")),
            target=str(f.get("target", "")),
            message=str(f.get("message", "")),
            recommendation=Recommendation.parse(f.get("recommendation")),
        )
        for f in row.findings
    )
    return NodeVerdict(row.status or INCONCLUSIVE, "", findings, row.message)


def _summary(rows: Sequence[SweepNode]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "nothing to check"


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


class _SweepLadderHost:
    """The ladder's host for an admission made by the sweep. Only `event` is used there;
    the node's own medic-healthd runs the episode (its ladder thread reads the store)."""

    def __init__(self, store: Store, node: str) -> None:
        self.store = store
        self.node = node

    def event(self, message: str, *, severity: str, fault_class: str, target: str) -> None:
        self.store.add_event(
            node=self.node,
            at=dt.datetime.now(dt.UTC),
            kind="remediation",
            severity=Severity(severity),
            source="sweep",
            message=message,
            fault_class=fault_class,
            target=target,
        )

    def _not_here(self) -> Any:
        raise RuntimeError("the sweep only admits; the node's medic-healthd runs the episode")

    def boot_id(self) -> str:
        return str(self._not_here())

    def jobs_running(self) -> bool:
        return bool(self._not_here())

    def gpu_busy(self, gpu: int) -> bool:
        return bool(self._not_here())

    def after_repair(self, gpu: int | None, before: float) -> None:
        self._not_here()

    def verify(self, extra_checks: Sequence[str]) -> list[Finding]:
        return list(self._not_here())

    def open_rma(self, episode: ep.Episode, why: str) -> int | None:
        return int(self._not_here())


# ---- the probe: the deep tier on the node itself -------------------------------------------


def probe(config: MedicConfig, checks: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run the deep tier here: through the node's medic-healthd when it answers (it records
    the results and responds to a fault as always), else inline in this process."""
    from healthd.api import HealthdUnavailable, ask

    started = time.monotonic()
    request: dict[str, Any] = {"op": "check", "budget": timeout}
    if checks:
        request["checks"] = list(checks)
    else:
        request["tier"] = "deep"
    try:
        reply = ask(config.paths.socket, request, timeout=timeout + 30)
        source = "healthd"
        results = list(reply.get("results", []))
    except HealthdUnavailable:
        from healthd.checks import load_check_configs
        from healthd.checks.base import CheckContext, Tier
        from healthd.results import result_json
        from healthd.runner import Runner

        runner = Runner(CheckContext.for_root(config.paths.host_root), load_check_configs(config))
        names = list(checks) if checks else runner.selected(tier=Tier.DEEP)
        report = runner.run(names, budget=timeout)
        source = "inline"
        results = [result_json(r) for r in report.results]
    return {
        "node": config.node_name,
        "source": source,
        "status": worst(Status(r.get("status", "UNKNOWN")) for r in results).value,
        "seconds": round(time.monotonic() - started, 3),
        "results": results,
    }

"""Offline sweeps, the pure part: which nodes to check first (`risk`, `rank`), how many of a
partition a sweep may hold (`share_cap`, `partition_caps`, `next_batch`), whether a node can be
taken now (`availability`) and what a probe's report means (`judge`). No store, no Slurm
command, no subprocess: the store (`remediation.sweep.store`) and the runner
(`remediation.sweep.runner`) import this module, never the other way round.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from medic_core.slurm import NodeInfo
from medic_core.status import Status, worst
from medic_core.vocabulary import Finding, Recommendation

RESERVATION_PREFIX = "medic-sweep-"

# Sweep states.
RUNNING, DONE = "running", "done"
# Node states, in order; see the diagram in `remediation.sweep`'s docstring.
PLANNED, TAKING, HELD, PROBING, CHECKED = "planned", "taking", "held", "running", "checked"
RETURNED, HANDED, SKIPPED = "returned", "handed", "skipped"
HOLDING = (TAKING, HELD, PROBING, CHECKED)  # the sweep may hold the node: counts on the share
FINAL = (RETURNED, HANDED, SKIPPED)

# Node verdicts.
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


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


def summary(states: Iterable[str]) -> str:
    """A sweep's one-line outcome from its nodes' states: "3 returned, 1 handed"."""
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "nothing to check"

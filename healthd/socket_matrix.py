"""Who may ask the daemon's socket what: the authorization matrix, as data.

Every op the socket serves has an entry: which peers may send it, told apart by what the
kernel says of the connecting process (SO_PEERCRED), never by the request, and which fields
each of them may send, with the values each field accepts. A request whose op has no entry,
sent by a peer the entry does not name, or carrying a field or a value its grant does not
list, is refused with one line before anything runs. docs/security.md shows this table
(`matrix_table` renders it; tests/test_socket_matrix.py checks the two agree, and that every
op `SocketApi.handle` answers is here).

The peers: `root` (uid 0, or the daemon's own user, who can do whatever the daemon can),
the `socket group` (`[healthd] socket_group`, SlurmdUser's group when slurmd does not run as
root; a member by its primary or a supplementary group), and `anyone` else the socket's mode
let in (none with the shipped 0660 root:socket_group; a stray ACL or mode would).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from healthd.checks.base import Tier
from healthd.launch_gate import HOOK_EVENT_KINDS
from medic_core.status import Severity

JOB_ID = re.compile(r"[0-9]{1,20}")  # SLURM_JOB_ID: an array task or a het job has its own
MAX_TEXT, MAX_EVIDENCE, MAX_NAMES = 4096, 64 * 1024, 256


class Caller(StrEnum):
    ROOT = "root"
    GROUP = "socket group"
    ANYONE = "anyone"


@dataclass(frozen=True)
class Peer:
    """The connecting process as the kernel tells it (SO_PEERCRED)."""

    pid: int
    uid: int
    gid: int


ROOT_PEER = Peer(0, 0, 0)  # a call in the daemon's own process


def caller_of(peer: Peer, socket_gid: int | None) -> Caller:
    """Which column of the matrix `peer` falls in; `socket_gid`: the socket group's id, None
    when the socket is root-only."""
    if peer.uid == 0 or peer.uid == os.geteuid():
        return Caller.ROOT
    if socket_gid is not None and (peer.gid == socket_gid or socket_gid in _groups(peer.pid)):
        return Caller.GROUP
    return Caller.ANYONE


def _groups(pid: int) -> frozenset[int]:
    """The supplementary groups of process `pid` (its Groups: line), none if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:] if g.isdigit())
    except OSError:
        pass
    return frozenset()


# --- the fields --------------------------------------------------------------------------------


def _number(limit: float) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "is not a number"
        if not math.isfinite(value) or not 0 <= value <= limit:
            return f"is not a number of seconds from 0 to {limit:g}"
        return ""

    return check


def _flag(value: Any) -> str:
    return "" if isinstance(value, bool) else "is not true or false"


def _job_id(value: Any) -> str:
    ok = isinstance(value, str) and JOB_ID.fullmatch(value)
    return "" if ok else "is not a Slurm job id (digits)"


def _job_id_or_none(value: Any) -> str:
    """The prolog sends SLURM_JOB_ID as it finds it: "" when slurmd set none (run by hand)."""
    return "" if value == "" else _job_id(value)


def _one_of(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        return "" if value in allowed else f"is not one of {', '.join(allowed)}"

    return check


def _text(limit: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            return "is not text"
        return f"is longer than {limit} characters" if len(value) > limit else ""

    return check


def _names(value: Any) -> str:
    if not isinstance(value, list) or len(value) > MAX_NAMES:
        return f"is not a list of at most {MAX_NAMES} check names"
    bad = [n for n in value if not isinstance(n, str) or not 0 < len(n) <= 100]
    return "holds something that is not a check name" if bad else ""


def _evidence(value: Any) -> str:
    if not isinstance(value, dict):
        return "is not an object"
    if len(json.dumps(value)) > MAX_EVIDENCE:
        return f"is larger than {MAX_EVIDENCE} bytes"
    return ""


def _job_target(value: Any) -> str:
    ok = isinstance(value, str) and value.startswith("job:") and JOB_ID.fullmatch(value[4:])
    return "" if ok else "is not job:N (N a Slurm job id)"


@dataclass(frozen=True)
class Arg:
    name: str
    accepts: str  # in words, for docs/security.md
    check: Callable[[Any], str]  # "" when the value is accepted, else why not
    required: bool = False


@dataclass(frozen=True)
class Grant:
    """What the peers in `callers` may send with an op."""

    callers: frozenset[Caller]
    args: tuple[Arg, ...] = ()
    rule: str = ""  # a rule across fields, in words
    whole: Callable[[Mapping[str, Any]], str] | None = None


@dataclass(frozen=True)
class OpEntry:
    op: str
    sent_by: str  # who sends it, in words
    grants: tuple[Grant, ...]  # the first whose callers include the peer applies


EVERYONE = frozenset(Caller)
HOOKS = frozenset({Caller.ROOT, Caller.GROUP})
ROOT = frozenset({Caller.ROOT})

JOB = Arg("job_id", "a Slurm job id (digits)", _job_id, required=True)
SEVERITY = Arg("severity", "INFO, WARN or CRITICAL", _one_of(tuple(s.value for s in Severity)))
EVIDENCE = Arg("evidence", f"a JSON object of at most {MAX_EVIDENCE} bytes", _evidence)
MESSAGE = Arg("message", f"text, at most {MAX_TEXT} characters", _text(MAX_TEXT))
FAULT = Arg("fault_class", "text, at most 128 characters", _text(128))


def _the_jobs_own_gate(request: Mapping[str, Any]) -> str:
    """A gate record from the socket group: the prolog's, for the job its target names."""
    job = str(request["target"])[4:]
    evidence = request.get("evidence") or {}
    if str(evidence.get("job_id", job)) != job:
        return "evidence.job_id is not the job its target names"
    return ""


MATRIX: dict[str, OpEntry] = {
    e.op: e
    for e in (
        OpEntry("ping", "the lab harness (is the daemon up)", (Grant(EVERYONE),)),
        OpEntry("status", "the HealthCheckProgram (root)", (Grant(EVERYONE),)),
        OpEntry(
            "adopt",
            "the HealthCheckProgram (root), having seen Slurm's own drain on the node",
            (Grant(ROOT, rule="no fields: the daemon reads the node from Slurm itself"),),
        ),
        OpEntry("metrics", "a scrape without the HTTP port (the benches)", (Grant(EVERYONE),)),
        OpEntry(
            "launch",
            "the prolog (compiled front and Python), as SlurmdUser",
            (
                Grant(
                    HOOKS,
                    (
                        Arg(
                            "budget",
                            "seconds, 0 to 3600 (capped by [hooks] launch_budget)",
                            _number(3600.0),
                        ),
                        Arg("fresh_only", "true or false", _flag),
                        Arg(
                            "job_id",
                            'a Slurm job id (digits), or "": then no gate record',
                            _job_id_or_none,
                        ),
                        Arg(
                            "partition",
                            "the job's partition (slurmd's), at most 64 characters",
                            _text(64),
                        ),
                        Arg(
                            "account",
                            "the job's account (slurmd's), at most 64 characters",
                            _text(64),
                        ),
                    ),
                    rule="a partition or account in [hooks] skip_launch_* runs no launch check",
                ),
            ),
        ),
        OpEntry(
            "job_end",
            "the epilog (compiled front and Python), as SlurmdUser",
            (Grant(HOOKS, (JOB,), rule="queued for the one post-job worker; busy when full"),),
        ),
        OpEntry(
            "job_summary",
            "an operator or test asking for the post-job summary at once",
            (
                Grant(
                    HOOKS,
                    (JOB, Arg("budget", "seconds, 0 to 3600 (capped)", _number(3600.0))),
                    rule="runs the daemon's own post-job checks; a caller cannot name checks",
                ),
            ),
        ),
        OpEntry(
            "event",
            "record_event: the Python prolog's gate record (SlurmdUser), the releaser's"
            " job_action (root when started by medic-healthd)",
            (
                Grant(
                    ROOT,
                    (
                        Arg(
                            "kind",
                            " or ".join(HOOK_EVENT_KINDS),
                            _one_of(HOOK_EVENT_KINDS),
                            required=True,
                        ),
                        SEVERITY,
                        Arg("source", "text, at most 64 characters", _text(64)),
                        MESSAGE,
                        FAULT,
                        Arg("target", "text, at most 256 characters", _text(256)),
                        EVIDENCE,
                    ),
                ),
                Grant(
                    frozenset({Caller.GROUP}),
                    (
                        Arg("kind", "gate", _one_of(("gate",)), required=True),
                        SEVERITY,
                        Arg("source", "prolog", _one_of(("prolog",))),
                        MESSAGE,
                        FAULT,
                        Arg("target", "job:N, N a Slurm job id", _job_target, required=True),
                        EVIDENCE,
                    ),
                    rule="evidence.job_id, when given, is the target's job",
                    whole=_the_jobs_own_gate,
                ),
            ),
        ),
        OpEntry(
            "check",
            "the HealthCheckProgram, `medic sweep probe` (root)",
            (
                Grant(
                    ROOT,
                    (
                        Arg(
                            "tier",
                            " or ".join(t.value for t in Tier),
                            _one_of(tuple(t.value for t in Tier)),
                        ),
                        Arg("checks", f"a list of at most {MAX_NAMES} check names", _names),
                        Arg("budget", "seconds, 0 to 86400", _number(86400.0)),
                    ),
                ),
            ),
        ),
    )
}


def refusal(op: Any, request: Mapping[str, Any], peer: Peer, caller: Caller) -> str:
    """Why `peer` (in column `caller`) may not send `request`, in one line; "" if it may."""
    entry = MATRIX.get(op) if isinstance(op, str) else None
    if entry is None:
        # The caller's op echoed at most 40 characters: the refusal stays one short line.
        return f"unknown op {repr(op)[:40]}: use one of {', '.join(MATRIX)}"
    grant = next((g for g in entry.grants if caller in g.callers), None)
    if grant is None:
        may = set().union(*(g.callers for g in entry.grants))
        who = "root only" if may == ROOT else " and ".join(c.value for c in Caller if c in may)
        return f"{op}: permission denied for uid {peer.uid}: {who}"
    names = {a.name for a in grant.args}
    extra = sorted(str(k)[:40] for k in request if k != "op" and k not in names)
    if extra:
        return f"{op}: field {extra[0]!r} is not accepted"
    for arg in grant.args:
        if arg.name in request:
            why = arg.check(request[arg.name])
            if why:
                return f"{op}: {arg.name} {why}"
        elif arg.required:
            return f"{op}: {arg.name} is required"
    if grant.whole is not None:
        why = grant.whole(request)
        if why:
            return f"{op}: {why}"
    return ""


def matrix_table() -> str:
    """The matrix as the Markdown table docs/security.md shows."""
    lines = [
        "| op | sent by | root | socket group | anyone | fields accepted |",
        "|---|---|---|---|---|---|",
    ]
    for entry in MATRIX.values():
        cells = []
        for caller in Caller:
            grant = next((g for g in entry.grants if caller in g.callers), None)
            cells.append("refused" if grant is None else _grant_words(entry.grants, grant))
        fields = []
        for i, grant in enumerate(entry.grants):
            words = "; ".join(
                f"`{a.name}`{' (required)' if a.required else ''}: {a.accepts}" for a in grant.args
            )
            rule = f"; {grant.rule}" if grant.rule else ""
            label = f"grant {i + 1}: " if len(entry.grants) > 1 else ""
            fields.append(f"{label}{words or 'none'}{rule}")
        lines.append(
            f"| `{entry.op}` | {entry.sent_by} | {' | '.join(cells)} | {'<br>'.join(fields)} |"
        )
    return "\n".join(lines)


def _grant_words(grants: tuple[Grant, ...], grant: Grant) -> str:
    return "yes" if len(grants) == 1 else f"grant {grants.index(grant) + 1}"

"""One word per node, the same in every view.

`medic nodes`, `medic node show` and `medic remediation status` each describe a node; they
used to derive what they said from different inputs (the newest episode, or the newest
open one; Slurm's state, or none), so they disagreed. Here the store side is gathered once
(`gather`: conditions, the open episode, the newest episode waiting for a human, the newest
RMA episode, RMA tickets that keep the node out) and `node_state` turns it and Slurm's view
of the node into one word and one line of why. Every view calls these two.

The words, the first that applies:

    rma          an RMA ticket is open (or closed and waiting for re-qualification)
    paused       the node's episode is paused (kill switch, fleet-wide signature)
    waiting_cap  the drain cap kept the faulty node in service; drained when the cap frees
    needs_human  an episode waits for a human (`medic episode close|retry`), or an episode
                 is open while Slurm has the node in service (stuck), or an RMA episode has
                 no ticket left
    repairing    an open episode, the node out of service (or Slurm not asked)
    user_problem drained by post-job hygiene: what a job left survived SIGKILL (no
                 hardware fault); given back by itself once clean
    drained      out of service, no episode of Medic's (an admin's drain, DOWN, ...)
    unhealthy    a condition WARN, CRITICAL or UNKNOWN, no episode, in service
    silent       its medic-healthd has not written for SILENT_AFTER
    no_data      no medic-healthd has ever written
    ok           healthy and in service
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from medic_core.drain_reason import is_user_problem_reason
from medic_core.status import Status
from medic_core.store_reader import Reader, placeholders, reader_of
from remediation import episode_types as ep
from remediation.policy import Rung

if TYPE_CHECKING:
    from medic_core.slurm import NodeInfo
    from medic_core.store import Store

NOT_OK = (Status.WARN.value, Status.CRITICAL.value, Status.UNKNOWN.value)
NO_DATA = "NO_DATA"  # no condition in the store: no medic-healthd has reported
# A running medic-healthd rewrites its conditions at least every 5 minutes (REFRESH_SECONDS in
# healthd.recorder); three missed refreshes mean the node is not being watched.
SILENT_AFTER = dt.timedelta(minutes=15)
# Slurm states and flags that take a node out of service.
OUT_STATES = frozenset({"DOWN", "FAIL", "ERROR", "UNKNOWN", "FUTURE"})
OUT_FLAGS = frozenset(
    {"DRAIN", "FAIL", "NOT_RESPONDING", "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
)

# The words, most urgent first.
RMA = "rma"
PAUSED = "paused"
WAITING_CAP = "waiting_cap"
NEEDS_HUMAN = "needs_human"
REPAIRING = "repairing"
USER_PROBLEM = "user_problem"
DRAINED = "drained"
UNHEALTHY = "unhealthy"
SILENT = "silent"
NO_DATA_WORD = "no_data"
OK = "ok"
WORDS = (RMA, PAUSED, WAITING_CAP, NEEDS_HUMAN, REPAIRING, USER_PROBLEM, DRAINED, UNHEALTHY,
         SILENT, NO_DATA_WORD, OK)  # fmt: skip
QUIET_WORDS = frozenset({OK, NO_DATA_WORD})  # nothing for a human to look at
# What a summary line calls the nodes with each word.
PHRASES = {
    REPAIRING: "being repaired",
    PAUSED: "with repairs paused",
    WAITING_CAP: "waiting for the drain cap",
    NEEDS_HUMAN: "waiting for a human",
    RMA: "in RMA",
    USER_PROBLEM: "drained for a user problem",
}
_SEVERITY = {s.value: s.severity for s in Status}


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[Any, ...]:
    """gpu2 before gpu10."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(name))


def rung_word(rung: int) -> str:
    try:
        return Rung(rung).word
    except ValueError:
        return str(rung)


def out_of_service(slurm: NodeInfo | None) -> bool:
    return slurm is not None and (slurm.state in OUT_STATES or bool(slurm.flags & OUT_FLAGS))


@dataclass(frozen=True)
class Fault:
    """A condition that is not OK."""

    type: str
    target: str
    status: str
    reason: str
    since: dt.datetime

    @property
    def label(self) -> str:
        where = f"gpu{self.target}" if self.target.isdigit() else self.target
        return f"{self.reason or self.type}@{where}" if where else self.reason or self.type


@dataclass(frozen=True)
class TicketBrief:
    """An RMA ticket that keeps its node out: not closed, or closed and not re-qualified."""

    id: int
    state: str
    requalify: bool


@dataclass
class StoreFacts:
    """What the store knows of one node, as every view reads it."""

    health: str = NO_DATA
    faults: list[Fault] = field(default_factory=list)
    last_report: dt.datetime | None = None
    open_episode: ep.Episode | None = None
    human_episode: ep.Episode | None = None  # the newest needs_human (a human closes it)
    rma_episode: ep.Episode | None = None  # the newest in state rma
    tickets: list[TicketBrief] = field(default_factory=list)
    # The reason of the node's open drain record (medic_core.drain_book): Medic drained it
    # with this reason and has not resumed it. None: no open record in this store.
    drain_record: str | None = None

    @property
    def known(self) -> bool:
        """This store holds the node's daemon's records (its reports, episodes, drains)."""
        return (
            self.last_report is not None
            or self.drain_record is not None
            or bool(self.faults or self.open_episode or self.human_episode or self.rma_episode)
        )

    def silent(self, now: dt.datetime) -> bool:
        return self.last_report is not None and self.last_report < now - SILENT_AFTER


@dataclass(frozen=True)
class NodeState:
    word: str
    why: str
    episode: ep.Episode | None = None  # the episode the word is about

    @property
    def attention(self) -> bool:
        return self.word not in QUIET_WORDS

    def to_json(self) -> dict[str, Any]:
        return {
            "word": self.word,
            "why": self.why,
            "episode_id": self.episode.id if self.episode else None,
        }


def node_state(slurm: NodeInfo | None, facts: StoreFacts, now: dt.datetime) -> NodeState:
    """The node's one word and why, from Slurm's view of it (None: not asked or not known)
    and the store's facts. Pure."""
    in_service = slurm is not None and not out_of_service(slurm)
    if facts.tickets:
        t = facts.tickets[0]
        why = (
            f"RMA ticket #{t.id} closed, waiting for re-qualification"
            if t.state == "closed"
            else f"RMA ticket #{t.id} {t.state}"
        )
        if len(facts.tickets) > 1:
            why += f" (+{len(facts.tickets) - 1} more)"
        if in_service:
            why += "; Slurm has the node IN SERVICE: drain it (medic node drain)"
        return NodeState(RMA, why, facts.rma_episode)
    e = facts.open_episode
    if e is not None:
        about = f"episode #{e.id} {e.fault_class}{' ' + e.target if e.target else ''}"
        if e.state == ep.PAUSED:
            return NodeState(PAUSED, f"{about} paused at rung {rung_word(e.rung)}", e)
        if e.state == ep.WAITING_CAP:
            return NodeState(WAITING_CAP, f"{about}: in service until the drain cap frees", e)
        if in_service:
            return NodeState(
                NEEDS_HUMAN,
                f"{about} is {e.state} but Slurm has the node in service: stuck "
                f"(medic episode close {e.id})",
                e,
            )
        return NodeState(REPAIRING, f"{about} {e.state}, rung {rung_word(e.rung)}", e)
    h = facts.human_episode
    if h is not None:
        about = f"episode #{h.id} {h.fault_class}{' ' + h.target if h.target else ''}"
        return NodeState(
            NEEDS_HUMAN, f"{about} waits for a human (medic episode close|retry {h.id})", h
        )
    r = facts.rma_episode
    if r is not None:
        return NodeState(
            NEEDS_HUMAN,
            f"episode #{r.id} {r.fault_class} reached RMA but no ticket keeps the node out "
            f"(medic episode close|retry {r.id})",
            r,
        )
    if out_of_service(slurm):
        assert slurm is not None
        state = "+".join([slurm.state, *sorted(slurm.flags)])
        if facts.drain_record is not None and is_user_problem_reason(facts.drain_record):
            why = "a job's leftovers survived SIGKILL; given back once clean"
            return NodeState(USER_PROBLEM, f"{state}: {why}: {slurm.reason}")
        return NodeState(DRAINED, f"{state}: {slurm.reason or 'no reason given'}")
    if facts.health in NOT_OK:
        return NodeState(UNHEALTHY, ", ".join(f.label for f in facts.faults[:3]) or facts.health)
    if facts.silent(now):
        return NodeState(SILENT, "medic-healthd has not reported for 15 minutes")
    if facts.health == NO_DATA:
        return NodeState(NO_DATA_WORD, "no medic-healthd has reported")
    return NodeState(OK, "healthy and in service" if slurm else "healthy (Slurm not asked)")


def gather(source: Store | Reader, only: str | None = None) -> dict[str, StoreFacts]:
    """Every node the store knows (or only `only`), in four queries whatever the fleet's
    size: the newest condition write per node, the conditions that are not OK, the episodes
    that can still say something (open, needs_human, rma), and the tickets that keep nodes
    out. Plain SQL through the driver (medic_core.store_reader): `medic nodes` reads it
    without SQLAlchemy."""
    if not isinstance(source, Reader):
        with reader_of(source) as reader:
            return gather(reader, only)
    reader = source
    node_is, node_args = ("", ()) if only is None else (" AND node = ?", (only,))
    seen = reader.rows(
        "SELECT node, max(updated_at) FROM conditions WHERE node = ? GROUP BY node"
        if only is not None
        else NEWEST_REPORTS[reader.backend],
        node_args,
    )
    bad = reader.rows(
        "SELECT node, type, target, status, reason, since FROM conditions"
        f" WHERE status IN ({placeholders(NOT_OK)}){node_is}",
        (*NOT_OK, *node_args),
    )
    held = reader.rows(
        "SELECT id, node, state, requalify FROM rma_tickets"
        f" WHERE (state <> ? OR requalify = ?){node_is} ORDER BY id",
        ("closed", True, *node_args),
    )
    wanted = (*ep.OPEN_STATES, ep.NEEDS_HUMAN, ep.RMA)
    episodes = [
        episode_of(reader, row)
        for row in reader.rows(
            f"SELECT {EPISODE_COLUMNS} FROM remediation_episodes"
            f" WHERE state IN ({placeholders(wanted)}){node_is} ORDER BY id",
            (*wanted, *node_args),
        )
    ]
    drains = reader.rows(
        f"SELECT node, reason FROM drain_records WHERE closed_at IS NULL{node_is}", node_args
    )
    when = reader.when
    facts: dict[str, StoreFacts] = {}
    for name, last in seen:
        f = facts.setdefault(name, StoreFacts())
        f.health = Status.OK.value
        f.last_report = when(last)
    for node, type_, target, status, reason, since in bad:
        f = facts.setdefault(node, StoreFacts())
        at = when(since)
        assert at is not None
        f.faults.append(Fault(type_, target, status, reason, at))
        if _SEVERITY[status] > _SEVERITY.get(f.health, 0):
            f.health = status
    for e in episodes:  # by id: the newest of each kind wins
        f = facts.setdefault(e.node, StoreFacts())
        if e.open:
            f.open_episode = e
        elif e.state == ep.NEEDS_HUMAN:
            f.human_episode = e
        else:
            f.rma_episode = e
    for id_, node, state, requalify in held:
        facts.setdefault(node, StoreFacts()).tickets.append(
            TicketBrief(int(id_), state, bool(requalify))
        )
    for node, reason in drains:
        facts.setdefault(node, StoreFacts()).drain_record = str(reason)
    for f in facts.values():
        f.faults.sort(key=lambda x: (-_SEVERITY[x.status], x.type, natural_key(x.target)))
    return facts


# Each node's newest condition write, read from the index conditions (node, updated_at)
# (schema version 6) by skipping from one node to the next instead of reading every
# condition: on PostgreSQL one probe per node (the next lower node's newest entry, LATERAL),
# on SQLite (no LATERAL) two (the next node, then its max). 10,000 nodes / 760,000
# conditions: PostgreSQL 40 ms (two probes: 68 ms, GROUP BY: 74 ms); SQLite 31 ms (GROUP BY
# over the index: 55 ms, over the table: 319 ms).
NEWEST_REPORTS = {
    "postgresql": (
        "WITH RECURSIVE newest(node, last) AS ("
        " (SELECT node, updated_at FROM conditions ORDER BY node DESC, updated_at DESC LIMIT 1)"
        " UNION ALL"
        " SELECT c.node, c.updated_at FROM newest CROSS JOIN LATERAL"
        " (SELECT node, updated_at FROM conditions WHERE node < newest.node"
        " ORDER BY node DESC, updated_at DESC LIMIT 1) AS c)"
        " SELECT node, last FROM newest"
    ),
    "sqlite": (
        "WITH RECURSIVE nodes(node) AS ("
        " SELECT min(node) FROM conditions"
        " UNION ALL"
        " SELECT (SELECT min(node) FROM conditions WHERE node > nodes.node) FROM nodes"
        " WHERE nodes.node IS NOT NULL)"
        " SELECT node, (SELECT max(updated_at) FROM conditions AS c WHERE c.node = nodes.node)"
        " FROM nodes WHERE node IS NOT NULL"
    ),
}

# remediation_episodes' columns in the order episode_of() reads them.
EPISODE_COLUMNS = (
    "id, node, state, fault_class, target, check_name, recommendation, first_rung, rung,"
    " attempts, message, evidence, failed_requalifications, ticket_id, opened_at,"
    " updated_at, closed_at"
)


def _episode_time(value: Any) -> dt.datetime | None:
    """As remediation.episodes reads its times: aware, a naive one taken as UTC."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return ep._utc(value)


def episode_of(reader: Reader, row: tuple[Any, ...]) -> ep.Episode:
    """An Episode from a row of EPISODE_COLUMNS, as remediation.episodes builds it."""
    (id_, node, state, fault_class, target, check, recommendation, first_rung, rung,
     attempts, message, evidence, failed, ticket_id, opened, updated, closed) = row  # fmt: skip
    opened_at, updated_at = _episode_time(opened), _episode_time(updated)
    assert opened_at is not None and updated_at is not None
    return ep.Episode(
        id=int(id_), node=node, state=state, fault_class=fault_class, target=target,
        check=check, recommendation=recommendation, first_rung=int(first_rung),
        rung=int(rung), attempts=dict(reader.data(attempts) or {}), message=message,
        evidence=dict(reader.data(evidence) or {}), failed_requalifications=int(failed),
        ticket_id=ticket_id, opened_at=opened_at, updated_at=updated_at,
        closed_at=_episode_time(closed),
    )  # fmt: skip


def control_of(reader: Reader) -> ep.Control:
    """The fleet-wide pause switch, as remediation.episodes.EpisodeStore.control reads it."""
    rows = reader.rows("SELECT paused, reason, actor, since FROM remediation_control WHERE id = 1")
    if not rows:
        return ep.Control(paused=False)
    paused, reason, actor, since = rows[0]
    return ep.Control(bool(paused), reason, actor, _episode_time(since))


def states_of(
    slurm_nodes: Iterable[NodeInfo] | None, facts: Mapping[str, StoreFacts], now: dt.datetime
) -> dict[str, NodeState]:
    """Every node Slurm or the store knows, with its word."""
    by_name = {n.name: n for n in slurm_nodes or ()}
    names = sorted(set(by_name) | set(facts), key=natural_key)
    return {n: node_state(by_name.get(n), facts.get(n) or StoreFacts(), now) for n in names}


def summary_counts(states: Iterable[NodeState]) -> str:
    """`2 being repaired, 1 waiting for a human`: the words a human should look at; the
    repairs always, the others when there are any."""
    counts: dict[str, int] = {}
    for s in states:
        counts[s.word] = counts.get(s.word, 0) + 1
    parts = [f"{counts.get(REPAIRING, 0)} {PHRASES[REPAIRING]}"]
    parts += [f"{counts[w]} {PHRASES[w]}"
              for w in (PAUSED, WAITING_CAP, NEEDS_HUMAN, RMA, USER_PROBLEM)
              if counts.get(w)]  # fmt: skip
    return ", ".join(parts)


__all__ = [
    "NOT_OK",
    "NO_DATA",
    "SILENT_AFTER",
    "WORDS",
    "Fault",
    "NodeState",
    "StoreFacts",
    "TicketBrief",
    "control_of",
    "episode_of",
    "gather",
    "node_state",
    "states_of",
    "summary_counts",
]

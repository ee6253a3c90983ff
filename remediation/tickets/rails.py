"""What keeps a node out of service or holds its repair (its rails): its open tickets, the
re-qualification a closed ticket waits for, and its open episode, read together by the ladder
at each tick and by the launch gate after job starts."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, select

from medic_core.store import Store
from medic_core.store.models import RmaTicketRow
from remediation.episodes import Episode, read_open_episode
from remediation.ticket_states import TicketState

# Built once: the ladder asks at every tick and the launch gate after job starts. Ids only,
# from the (state, node) index.
_OPEN_IDS = (
    select(RmaTicketRow.id)
    .where(RmaTicketRow.node == bindparam("node"), RmaTicketRow.state != TicketState.CLOSED.value)
    .order_by(RmaTicketRow.id)
)
_REQUALIFY = (
    select(RmaTicketRow.id)
    .where(RmaTicketRow.node == bindparam("node"), RmaTicketRow.requalify.is_(True))
    .limit(1)
)


def open_tickets(store: Store, node: str) -> list[int]:
    """Ids of `node`'s tickets not closed, by id: while there is one, the node stays out."""
    with store.engine.connect() as conn:
        return list(conn.scalars(_OPEN_IDS, {"node": node}))


def needs_requalification(store: Store, node: str) -> bool:
    """True while a closed ticket of `node` waits for the node to pass re-qualification:
    the ladder and the HealthCheckProgram must not resume the node before."""
    with store.engine.connect() as conn:
        return conn.scalars(_REQUALIFY, {"node": node}).first() is not None


@dataclass(frozen=True)
class NodeRails:
    """What keeps a node out of service or holds its repair, as one read sees it."""

    episode: Episode | None  # its open remediation episode
    open_tickets: list[int]  # ids of its RMA tickets not closed: it stays out
    requalify: bool  # a closed ticket waits for it to pass re-qualification


def read_rails(store: Store, node: str) -> NodeRails:
    """`node`'s open episode, open tickets and re-qualification flag in one transaction (one
    consistent snapshot, one connection): what the ladder reads at each tick and the launch
    gate after job starts."""
    with store.engine.connect() as conn:
        episode = read_open_episode(conn, node)
        ids = list(conn.scalars(_OPEN_IDS, {"node": node}))
        requalify = conn.scalars(_REQUALIFY, {"node": node}).first() is not None
    return NodeRails(episode, ids, requalify)

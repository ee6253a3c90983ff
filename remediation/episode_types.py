"""What the ladder's episodes are, without their tables: the states, Episode, Step and
Control (the pause switch) as plain dataclasses.

remediation.episodes keeps them in the store and re-exports every name here; the CLI's
read-only listings (`medic nodes`) build them from rows without importing SQLAlchemy.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Episode states. Open: the ladder is working on the node. Closed: done, one way or another.
WAITING_IDLE = "waiting_idle"  # drained; waiting for running jobs to leave
ACTING = "acting"  # a rung's step is recorded and running (or, after a crash, was)
REBOOTING = "rebooting"  # the reboot was asked of Slurm; waiting for the new boot
VERIFYING = "verifying"
PAUSED = "paused"  # repairs paused (kill switch, fleet-wide signature); the node is drained
WAITING_CAP = "waiting_cap"  # not drained: the drain cap is reached; drained once it frees
OPEN_STATES = (WAITING_IDLE, ACTING, REBOOTING, VERIFYING, PAUSED, WAITING_CAP)
RESOLVED = "resolved"  # repaired, re-qualified and resumed
RMA = "rma"  # a ticket is open; the node stays drained
NEEDS_HUMAN = "needs_human"  # beyond the drain cap, an unknown first rung, a drain not ours
CLOSED = "closed"  # a human closed it (`medic episode close`): it waits on nothing any more
CLOSED_STATES = (RESOLVED, RMA, NEEDS_HUMAN, CLOSED)
# Open episodes whose node Medic holds drained (they count against the drain cap).
DRAINING_STATES = (WAITING_IDLE, ACTING, REBOOTING, VERIFYING, PAUSED)


def _utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    assert isinstance(value, dt.datetime)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Episode:
    id: int
    node: str
    state: str
    fault_class: str
    target: str
    check: str
    recommendation: str
    first_rung: int
    rung: int
    attempts: Mapping[str, int]
    message: str
    evidence: Mapping[str, Any]
    failed_requalifications: int
    ticket_id: int | None
    opened_at: dt.datetime
    updated_at: dt.datetime
    closed_at: dt.datetime | None

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES

    def attempts_at(self, rung: int) -> int:
        return int(self.attempts.get(str(rung), 0))


@dataclass(frozen=True)
class Step:
    id: int
    episode_id: int
    rung: int
    action: str
    attempt: int
    state: str  # intent, done, failed, interrupted
    argv: Sequence[str]
    returncode: int | None
    output: str
    boot_id: str
    started_at: dt.datetime
    ended_at: dt.datetime | None


@dataclass(frozen=True)
class Control:
    paused: bool
    reason: str = ""
    actor: str = ""
    since: dt.datetime | None = None

"""An RMA ticket's states and the moves between them, without the tables: what
`medic rma list` needs to know of tickets (remediation.tickets re-exports both names)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class TicketState(StrEnum):
    OPEN = "open"  # Medic opened it; the node stays drained
    SUBMITTED = "submitted"  # handed to the site's ticketing system / the vendor
    ACKNOWLEDGED = "acknowledged"  # the vendor accepted the RMA
    REPLACED = "replaced"  # the part was swapped
    CLOSED = "closed"  # done: replaced, or cancelled with a note


NEXT_STATES: Mapping[TicketState, tuple[TicketState, ...]] = {
    TicketState.OPEN: (TicketState.SUBMITTED, TicketState.CLOSED),
    TicketState.SUBMITTED: (TicketState.ACKNOWLEDGED, TicketState.CLOSED),
    TicketState.ACKNOWLEDGED: (TicketState.REPLACED, TicketState.CLOSED),
    TicketState.REPLACED: (TicketState.CLOSED,),
    TicketState.CLOSED: (),
}

"""RMA tickets: a node's hardware sent back, with its evidence, an audit trail and outbound
notifications (schema version 3; see docs/rma.md).

    open --> submitted --> acknowledged --> replaced --> closed      (resolution "replaced")
      |          |               |                          ^
      +----------+---------------+--------------------------+        (resolution "cancelled",
                                                                       a note is required)

Every change writes, in one transaction: the ticket, one audit row (who, when, from, to,
note) and one outbox row (the webhook payload, delivered later by
`remediation.webhook.deliver_pending`), so a crash between the change and the POST loses
nothing. Closing a ticket, either way, marks its node as needing re-qualification: the
ladder and the HealthCheckProgram must not resume the node until `requalified()` clears it.

One module per concern, imported one way (values <- outbox <- lifecycle; rails apart):

- `values`: what a ticket is (`Ticket`, `Gpu`, `AuditEntry`, `TicketError`) and how its part
  is named for a vendor (`ticket_component`, `component_json`, `rma_summary`,
  `evidence_bundle`);
- `outbox`: one change's audit and outbox rows, the outbox's states, `retry_failed`;
- `lifecycle`: the state machine in the store (`open_ticket`, `transition`, `attach_bundle`,
  `requalified`) and the reads of tickets and their audit (`get`, `list_tickets`, `audit`);
- `rails`: what keeps a node out (`open_tickets`, `needs_requalification`, `read_rails`).

This package re-exports their public names: `from remediation import tickets;
tickets.open_ticket(...)`. The states and their moves are remediation.ticket_states, light
enough for `medic rma list` (re-exported here too).
"""

from __future__ import annotations

from remediation.ticket_states import NEXT_STATES, TicketState
from remediation.tickets.lifecycle import (
    attach_bundle,
    audit,
    get,
    list_tickets,
    open_ticket,
    requalified,
    transition,
)
from remediation.tickets.outbox import (
    OUTBOX_DELIVERED,
    OUTBOX_FAILED,
    OUTBOX_PENDING,
    retry_failed,
)
from remediation.tickets.rails import NodeRails, needs_requalification, open_tickets, read_rails
from remediation.tickets.values import (
    CANCELLED,
    REPLACED,
    AuditEntry,
    Gpu,
    Ticket,
    TicketError,
    component_json,
    evidence_bundle,
    rma_summary,
    ticket_component,
)

__all__ = [
    "CANCELLED",
    "NEXT_STATES",
    "OUTBOX_DELIVERED",
    "OUTBOX_FAILED",
    "OUTBOX_PENDING",
    "REPLACED",
    "AuditEntry",
    "Gpu",
    "NodeRails",
    "Ticket",
    "TicketError",
    "TicketState",
    "attach_bundle",
    "audit",
    "component_json",
    "evidence_bundle",
    "get",
    "list_tickets",
    "needs_requalification",
    "open_ticket",
    "open_tickets",
    "read_rails",
    "requalified",
    "retry_failed",
    "rma_summary",
    "ticket_component",
    "transition",
]

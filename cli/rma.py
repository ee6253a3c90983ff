"""`medic rma list|show|open|update|close|retry`: RMA tickets from the store (remediation.tickets;
docs/rma.md), for the operator following a part back to the vendor and the node back into
service: the click commands. The list's query and cells are in cli/rma_lines.py, what
`show` tells of one ticket in cli/rma_detail.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.common import (
    EXIT_USAGE,
    AdminError,
    actor,
    config_option,
    echo_json,
    echo_table,
    iso,
    json_option,
    load,
    now_utc,
    opened_store,
    read_store,
    rung_name,
    store_option,
    when,
)
from cli.complete import complete_node, complete_open_ticket, complete_ticket
from cli.rma_detail import (
    audit_json,
    audit_rows,
    deliveries,
    evidence_summary,
    linked_episodes,
    requalification_line,
    ticket_json,
)
from cli.rma_lines import (
    LIST_HEADERS,
    STATE_WORDS,
    gpus_cell,
    list_rows,
    list_summary,
    state_cell,
    ticket_lines,
)
from remediation.ticket_states import NEXT_STATES, TicketState

if TYPE_CHECKING:
    from medic_core.store import Store
    from remediation.tickets import Ticket

# `medic rma list` reads the store through the driver alone (cli.common.read_store); the other
# commands import the store proper (SQLAlchemy) and remediation.tickets where they use them.

OPEN_WORDS = tuple(s.value for s in TicketState if s is not TicketState.CLOSED)
# What `update --state` takes; closing has its own command (it triggers re-qualification).
UPDATE_WORDS = tuple(w for w in OPEN_WORDS if w != TicketState.OPEN.value)
FAULT_CLASS = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")
EVIDENCE_EVENTS = 50  # recent events of the node a manual ticket carries
# --- medic rma ------------------------------------------------------------------------------


@click.group("rma")
def rma_group() -> None:
    """RMA tickets: hardware going back to the vendor, from open to closed."""


@rma_group.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(STATE_WORDS, case_sensitive=False),
    help="Only tickets in this state (repeatable; implies --all for closed).",
)
@click.option("--node", help="Only this node's tickets.", shell_complete=complete_node)
@click.option(
    "--open/--all",
    "open_only",
    default=True,
    show_default=True,
    help="Tickets that are not closed (default), or every ticket.",
)
@json_option
@store_option
@config_option
def rma_list(
    states: tuple[str, ...],
    node: str | None,
    open_only: bool,
    as_json: bool,
    store_url: str | None,
    config_path: Path | None,
) -> None:
    """Where every RMA is: tickets with their state, vendor reference and last change."""
    now = now_utc()
    wanted: Sequence[str] | None = None
    if states:
        wanted = sorted({s.lower() for s in states})
    elif open_only:
        wanted = OPEN_WORDS
    config = load(config_path)
    with read_store(config, store_url) as reader:
        lines = ticket_lines(reader, wanted, node)
    if as_json:
        echo_json([t.to_json() for t in lines])
        return
    if not lines:
        where = f" for {node}" if node else ""
        which = "in state " + ", ".join(wanted) if states and wanted else "open"
        hint = "" if not open_only or states else "; --all lists closed ones too"
        click.echo(f"no RMA tickets {which}{where}{hint}")
        return
    click.echo(list_summary(lines))
    echo_table(LIST_HEADERS, list_rows(lines, now))


def _ticket_or_fail(store: Store, ticket_id: int) -> Ticket:
    from remediation import tickets as rma

    ticket = rma.get(store, ticket_id)
    if ticket is None:
        raise AdminError(
            f"no RMA ticket {ticket_id}",
            "the store has no ticket with that id",
            "list them with `medic rma list --all`",
        )
    return ticket


@rma_group.command("show")
@click.argument("ticket_id", metavar="ID", type=int, shell_complete=complete_ticket)
@json_option
@store_option
@config_option
def rma_show(
    ticket_id: int, as_json: bool, store_url: str | None, config_path: Path | None
) -> None:
    """One ticket: its GPUs, evidence, audit trail, notifications and re-qualification."""
    from remediation import tickets as rma

    config = load(config_path)
    with opened_store(config, store_url) as store:
        ticket = _ticket_or_fail(store, ticket_id)
        trail = rma.audit(store, ticket_id)
        sent = deliveries(store, ticket_id)
        episodes = linked_episodes(store, ticket_id)
    if as_json:
        echo_json(
            {
                **ticket_json(ticket),
                "evidence": ticket.evidence,
                "audit": [audit_json(e) for e in trail],
                "notifications": sent.to_json(),
                "episodes": [e.id for e in episodes],
                "next_states": [s.value for s in NEXT_STATES[ticket.state]],
            }
        )
        return
    state = state_cell(ticket.state.value, ticket.resolution, ticket.requalify)
    click.echo(f"RMA ticket {ticket.id}  {ticket.node}  {state}  {ticket.fault_class}")
    click.echo(f"summary: {ticket.summary}")
    if ticket.component:
        click.echo(f"part: {ticket.component.get('describe') or ticket.component.get('id')}")
    if ticket.reason:
        click.echo(f"reason: {ticket.reason}")
    if ticket.external_id or ticket.external_url:
        url = f"  {ticket.external_url}" if ticket.external_url else ""
        click.echo(f"vendor ref: {ticket.external_id or '-'}{url}")
    closed = f", closed {when(ticket.closed_at)}" if ticket.closed_at else ""
    click.echo(f"opened {when(ticket.created_at)}, updated {when(ticket.updated_at)}{closed}")
    for e in episodes:
        click.echo(
            f"episode #{e.id}: {e.state}, rung {rung_name(e.rung)}, opened {when(e.opened_at)}"
        )
    legal = [s.value for s in NEXT_STATES[ticket.state]]
    if legal:
        click.echo(f"next: {' or '.join(legal)}")
    click.echo(requalification_line(ticket, trail))
    click.echo(sent.line())
    click.echo("")
    click.echo(f"GPUs ({len(ticket.gpus)}):" if ticket.gpus else "GPUs: none named")
    if ticket.gpus:
        echo_table(
            ("  INDEX", "UUID", "SERIAL", "PCI BUS ID"),
            (
                ["  " + str(g.index), g.uuid or "-", g.serial or "-", g.pci_bus_id or "-"]
                for g in ticket.gpus
            ),
        )
    click.echo("")
    summary = evidence_summary(ticket.evidence)
    click.echo("evidence (--json for all of it):" if summary else "evidence: none")
    if summary:
        echo_table(("  KEY", "HOLDS"), (["  " + k, v] for k, v in summary))
    click.echo("")
    click.echo(f"audit trail ({len(trail)}):")
    echo_table(("  TIME", "ACTOR", "FROM", "TO", "NOTE"), audit_rows(trail))


def _node_known(store: Store, node: str) -> bool:
    from remediation import episodes as ep

    if store.conditions(node=node):
        return True
    if store.events(node=node, limit=1):
        return True
    return bool(ep.EpisodeStore(store).find(node=node))


def manual_evidence(store: Store, node: str, note: str, who: str) -> dict[str, Any]:
    """What the store knows of `node`, in the usual bundle: its conditions that are not OK,
    its recent events and the steps of its newest remediation episode."""
    from remediation import episodes as ep
    from remediation import tickets as rma

    conditions = [
        {"type": c.type, "target": c.target, "status": c.status.value, "reason": c.reason,
         "message": c.message, "since": iso(c.since)}
        for c in store.conditions(node=node)
        if c.status.value not in ("OK", "NOT_APPLICABLE")
    ]  # fmt: skip
    history = [
        {"at": iso(e.at), "kind": e.kind, "severity": e.severity.value,
         "fault_class": e.fault_class, "target": e.target, "message": e.message}
        for e in store.events(node=node, limit=EVIDENCE_EVENTS)
    ]  # fmt: skip
    episodes = ep.EpisodeStore(store)
    found = episodes.find(node=node)
    actions = []
    if found:
        actions = [
            {"episode": found[-1].id, "action": s.action, "attempt": s.attempt,
             "state": s.state, "returncode": s.returncode, "argv": list(s.argv)}
            for s in episodes.steps(found[-1].id)
        ]  # fmt: skip
    return rma.evidence_bundle(
        conditions=conditions, history=history, actions=actions, opened_by=who, note=note
    )


def _note(text: str, what: str) -> str:
    text = " ".join(text.split())
    if not text:
        raise AdminError(f"{what} is empty", "every ticket change says why in the audit trail",
                         f"give {what} TEXT", EXIT_USAGE)  # fmt: skip
    return text


@rma_group.command("open")
@click.argument("node_name", metavar="NODE", shell_complete=complete_node)
@click.option("--fault", "fault_class", required=True,
              help="Fault class, e.g. gpu.xid.79, gpu.ecc.dbe, mem.edac.ue.")  # fmt: skip
@click.option("--note", required=True, help="What is broken (the ticket's summary).")
@click.option("--gpu", "gpus", multiple=True, type=click.IntRange(0),
              help="Index of a GPU to send back (repeatable).")  # fmt: skip
@click.option("--force", is_flag=True, help="Open it even if the store knows nothing of NODE.")
@json_option
@store_option
@config_option
def rma_open(
    node_name: str,
    fault_class: str,
    note: str,
    gpus: tuple[int, ...],
    force: bool,
    as_json: bool,
    store_url: str | None,
    config_path: Path | None,
) -> None:
    """Open a ticket by hand, with the store's evidence for NODE (conditions, events, the
    ladder's steps). One ticket per node and fault class: an open one is not duplicated."""
    from remediation import tickets as rma

    note = _note(note, "--note")
    if not FAULT_CLASS.match(fault_class):
        raise AdminError(
            f"bad fault class {fault_class!r}",
            "a fault class is dotted lower case, like the checks report it",
            "e.g. --fault gpu.xid.79 (see `medic checks docs`)",
            EXIT_USAGE,
        )
    who = actor()
    config = load(config_path)
    with opened_store(config, store_url) as store:
        if not force and not _node_known(store, node_name):
            raise AdminError(
                f"no node {node_name!r} in the store",
                "no medic-healthd has reported it, so it is probably a typo",
                "check the name with `medic nodes --all`, or --force to open the ticket anyway",
            )
        existing = [
            t
            for t in rma.list_tickets(store, OPEN_WORDS, node_name)
            if t.fault_class == fault_class
        ]
        if existing:
            t = existing[0]
            raise AdminError(
                f"RMA ticket {t.id} is already open for {node_name} {fault_class} "
                f"({t.state.value})",
                "one ticket per node and fault class: the vendor already has its evidence",
                f"follow it with `medic rma show {t.id}`, or close it first",
            )
        evidence = manual_evidence(store, node_name, note, who)
        try:
            ticket = rma.open_ticket(
                store, node_name, fault_class, note, [rma.Gpu(g) for g in sorted(set(gpus))],
                evidence, who,
            )  # fmt: skip
        except ValueError as exc:
            raise AdminError(
                "cannot open the ticket", str(exc), "fix the value", EXIT_USAGE
            ) from exc
    if as_json:
        echo_json(ticket_json(ticket))
        return
    gpu_text = f" GPUs {gpus_cell([g.index for g in ticket.gpus])}" if ticket.gpus else ""
    click.echo(f"RMA ticket {ticket.id} opened for {ticket.node} {ticket.fault_class}{gpu_text}")
    click.echo(f"next: medic rma update {ticket.id} --state submitted --vendor-ref REF")


def _move(
    store_url: str | None,
    config_path: Path | None,
    ticket_id: int,
    target: TicketState,
    note: str,
    vendor_ref: str | None,
    url: str | None,
) -> Ticket:
    from remediation import tickets as rma
    from remediation.tickets import TicketError

    config = load(config_path)
    with opened_store(config, store_url) as store:
        ticket = _ticket_or_fail(store, ticket_id)
        legal = NEXT_STATES[ticket.state]
        if target not in legal:
            if not legal:
                fix = f"open a new one: medic rma open {ticket.node} --fault {ticket.fault_class}"
            else:
                fix = " or ".join(
                    f"medic rma close {ticket_id} --note TEXT"
                    if s is TicketState.CLOSED
                    else f"medic rma update {ticket_id} --state {s.value}"
                    for s in legal
                )
            raise AdminError(
                f"RMA ticket {ticket_id} ({ticket.node}) cannot go from {ticket.state.value} "
                f"to {target.value}",
                "tickets move open -> submitted -> acknowledged -> replaced -> closed"
                + ("; this one is closed" if not legal else ""),
                fix,
            )
        try:
            return rma.transition(
                store, ticket_id, target, actor(), note, vendor_ref, external_url=url
            )
        except TicketError as exc:  # changed under us, or closing without a note
            raise AdminError(
                str(exc).split(";")[0],
                "the change was refused by the ticket's rules",
                str(exc).split("; ", 1)[-1],
            ) from exc
        except ValueError as exc:
            raise AdminError("bad value", str(exc), "fix the value", EXIT_USAGE) from exc


@rma_group.command("update")
@click.argument("ticket_id", metavar="ID", type=int, shell_complete=complete_open_ticket)
@click.option(
    "--state",
    "state",
    required=True,
    type=click.Choice(UPDATE_WORDS, case_sensitive=False),
    help="The next state (to close: medic rma close).",
)
@click.option("--note", default="", help="What happened (kept in the audit trail).")
@click.option("--vendor-ref", help="The vendor's or ticketing system's reference, e.g. INC-4711.")
@click.option("--url", help="A link to it.")
@json_option
@store_option
@config_option
def rma_update(
    ticket_id: int,
    state: str,
    note: str,
    vendor_ref: str | None,
    url: str | None,
    as_json: bool,
    store_url: str | None,
    config_path: Path | None,
) -> None:
    """Move a ticket on: submitted (to the vendor), acknowledged, replaced."""
    target = TicketState(state.lower())
    note = " ".join(note.split())
    ticket = _move(store_url, config_path, ticket_id, target, note, vendor_ref, url)
    if as_json:
        echo_json(ticket_json(ticket))
        return
    ref = f" (vendor ref {ticket.external_id})" if ticket.external_id else ""
    click.echo(f"RMA ticket {ticket.id} ({ticket.node}): now {ticket.state.value}{ref}")


@rma_group.command("close")
@click.argument("ticket_id", metavar="ID", type=int, shell_complete=complete_open_ticket)
@click.option(
    "--note",
    default="",
    help="Why (required unless the part was replaced: closing earlier cancels).",
)
@json_option
@store_option
@config_option
def rma_close(
    ticket_id: int, note: str, as_json: bool, store_url: str | None, config_path: Path | None
) -> None:
    """Close a ticket: after `replaced` the RMA is done; earlier it is cancelled. Either way
    the node must pass re-qualification before it takes jobs again."""
    note = " ".join(note.split())
    if not note:
        config = load(config_path)
        with opened_store(config, store_url) as store:
            current = _ticket_or_fail(store, ticket_id)
        if current.state not in (TicketState.REPLACED, TicketState.CLOSED):
            raise AdminError(
                f"closing RMA ticket {ticket_id} ({current.node}) from {current.state.value} "
                "cancels it",
                "a cancelled RMA must say why in the audit trail",
                "give --note TEXT, e.g. --note 'vendor found no fault'",
                EXIT_USAGE,
            )
    ticket = _move(store_url, config_path, ticket_id, TicketState.CLOSED, note, None, None)
    if as_json:
        echo_json(ticket_json(ticket))
        return
    click.echo(f"RMA ticket {ticket.id} ({ticket.node}) closed: {ticket.resolution}")
    click.echo(
        f"{ticket.node} must pass re-qualification before it takes jobs again "
        f"(medic rma show {ticket.id} says when it has)"
    )


@rma_group.command("retry")
@click.argument("ticket_id", metavar="[ID]", type=int, required=False,
                shell_complete=complete_ticket)  # fmt: skip
@store_option
@config_option
def rma_retry(ticket_id: int | None, store_url: str | None, config_path: Path | None) -> None:
    """Queue again the webhook deliveries the receiver refused (HTTP 4xx), of ticket ID or of
    every ticket, once the cause (the secret, the receiver) is fixed; the daemons send them."""
    from remediation import tickets as rma

    config = load(config_path)
    with opened_store(config, store_url) as store:
        if ticket_id is not None:
            _ticket_or_fail(store, ticket_id)
        count = rma.retry_failed(store, ticket_id)
    which = f"of RMA ticket {ticket_id}" if ticket_id is not None else "of every ticket"
    click.echo(f"{count} refused notification(s) {which} queued again")


# `rma` is the name operators type; `rma_group` keeps the Python name free for the module.
rma_command = rma_group

__all__ = ["rma_command"]

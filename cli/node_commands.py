"""`medic node show|drain|resume|reboot NODE`: one node's whole story (Slurm's state, its
conditions, trends, episodes with their steps, RMA tickets and recent events), and the
manual actions on it through Slurm, each checked (an admin's reason, Medic's own drains,
an open repair or RMA ticket) and recorded in the store with who did it.

A node's row and word are cli/nodes.py's NodeView (cli.node_view.node_state).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cli.common import (
    EXIT_USAGE,
    AdminError,
    actor,
    age,
    clip,
    config_option,
    echo_json,
    echo_table,
    iso,
    json_option,
    load,
    now_utc,
    opened_store,
    rung_name,
    slurm_client,
    store_option,
    warn,
    when,
)
from cli.complete import complete_node
from cli.node_view import NOT_OK, StoreFacts, gather, natural_key
from cli.nodes import NodeView
from medic_core.drain_reason import (
    admin_reason_problem,
    as_slurm_stores,
    claims_medic_prefix,
    is_medic_reason,
)
from medic_core.slurm import NodeInfo, SlurmError
from medic_core.status import Severity

# `medic node` imports only what it needs (tests/test_cli_startup.py): the store proper
# (SQLAlchemy), the Slurm client's settings and the RMA commands load when a command uses them.

SLURM_PERMISSION_FIX = (
    "Slurm decides who may: run as root or SlurmUser, or as a user with AdminLevel=Operator"
)


@click.group("node")
def node() -> None:
    """One node: show it, or drain, resume or reboot it through Slurm."""


def _one_node(config: Any, name: str) -> NodeInfo | None:
    try:
        return slurm_client(config).node(name)
    except SlurmError as exc:
        raise AdminError(
            f"cannot read {name}'s state from Slurm", str(exc),
            "check slurmctld (sinfo) and [slurm] conf",
        ) from exc  # fmt: skip


@node.command("show")
@click.argument("name", shell_complete=complete_node)
@click.option("--all", "show_all", is_flag=True, help="Every condition, the OK ones too.")
@click.option("--events", "n_events", default=20, show_default=True, type=click.IntRange(0),
              help="How many recent events.")  # fmt: skip
@click.option("--episodes", "n_episodes", default=5, show_default=True, type=click.IntRange(0),
              help="How many recent episodes, with their steps.")  # fmt: skip
@json_option
@store_option
@config_option
def show(
    name: str,
    show_all: bool,
    n_events: int,
    n_episodes: int,
    as_json: bool,
    store_url: str | None,
    config_path: Path | None,
) -> None:
    """A node's Slurm state, conditions, recent events, episodes with their steps, and RMA
    tickets."""
    from cli.admin import EVENT_HEADERS, episode_json, event_json, event_rows
    from cli.rma_lines import LIST_HEADERS, list_rows, ticket_lines
    from medic_core.drain_book import DrainBook, Holding
    from remediation.episodes import NEEDS_HUMAN, EpisodeStore

    now = now_utc()
    config = load(config_path)
    info: NodeInfo | None = None
    slurm_error = ""
    try:
        info = slurm_client(config).node(name)
    except SlurmError as exc:
        slurm_error = str(exc)
        warn("Slurm did not answer: the store's view only", slurm_error, "check slurmctld")
    with opened_store(config, store_url) as store:
        conditions = store.conditions(node=name)
        recent = store.events(node=name, limit=n_events) if n_events else []
        episodes = EpisodeStore(store)
        found = episodes.find(node=name)[-n_episodes:][::-1] if n_episodes else []
        steps = {e.id: episodes.steps(e.id) for e in found}
        tickets = ticket_lines(store, node=name)
        facts = gather(store, only=name).get(name) or StoreFacts()
        # Whose the drain is, by Medic's drain records (never by the reason's text).
        own = DrainBook.of(store).ownership(name, info) if info is not None else None
    if info is None and not conditions and not recent and not found and not tickets:
        slurm_said = "Slurm did not answer" if slurm_error else "Slurm does not list it"
        raise AdminError(
            f"no node {name!r}",
            f"{slurm_said} and the store has nothing about it",
            "check the name with `medic nodes --all` or `sinfo -N`",
        )
    view = NodeView.of(name, info, facts, now)
    if as_json:
        echo_json(
            {
                **view.to_json(),
                "conditions": [
                    {"type": c.type, "target": c.target, "status": c.status.value,
                     "reason": c.reason, "message": c.message, "evidence": c.evidence,
                     "since": iso(c.since), "updated_at": iso(c.updated_at)}
                    for c in conditions
                ],
                "events": [event_json(e) for e in recent],
                "episodes": [episode_json(e, steps[e.id]) for e in found],
                "tickets": [t.to_json() for t in tickets],
            }
        )  # fmt: skip
        return
    partitions = ",".join(info.partitions) if info else "?"
    click.echo(
        f"{name}  state {view.slurm_state}  partitions {partitions}  health {view.health_cell}"
    )
    click.echo(f"medic: {view.state.word}: {view.state.why}")
    if view.silent:
        click.echo(
            f"medic-healthd has not reported since {when(view.last_report)}: this node is not"
            " being watched (systemctl status medic-healthd on it)"
        )
    if view.drain_reason:
        by = f" (set by {info.reason_user})" if info and info.reason_user else ""
        recorded = own is not None and own.holding is Holding.RECORDED
        owner = "Medic's" if recorded else "not Medic's: Medic leaves it alone"
        if own is not None and own.holding is Holding.UNREACHABLE:
            owner = "Medic's records cannot tell"
        click.echo(f"drain reason: {view.drain_reason}{by} [{owner}]")
    click.echo("")
    listed = [c for c in conditions if show_all or c.status.value in NOT_OK]
    listed.sort(key=lambda c: (-c.status.severity, c.type, natural_key(c.target)))
    click.echo(f"conditions ({len(conditions)}):")
    if listed:
        echo_table(
            ("  TYPE", "TARGET", "STATUS", "REASON", "SINCE", "UPDATED", "MESSAGE"),
            (
                ["  " + c.type, c.target or "-", c.status.value, c.reason or "-",
                 when(c.since), f"{age(c.updated_at, now)} ago", clip(c.message, 70)]
                for c in listed
            ),
        )  # fmt: skip
    hidden = len(conditions) - len(listed)
    if hidden:
        click.echo(f"  ({hidden} OK or not applicable; --all to list them)")
    from cli.trend_view import trend_lines

    trends = trend_lines(conditions, show_all=show_all)
    if trends:
        click.echo("")
        click.echo("trends (last values, rate per hour over the window):")
        click.echo("\n".join(trends))
    click.echo("")
    click.echo(f"episodes (newest {len(found)}):" if found else "episodes: none")
    for e in found:
        if e.state == NEEDS_HUMAN:  # not closed: it waits for a human
            closed = f", waiting for a human since {when(e.closed_at or e.updated_at)}"
        else:
            closed = f", closed {when(e.closed_at)}" if e.closed_at else ""
        click.echo(
            f"  #{e.id} {e.state}  {e.fault_class} {e.target or ''}  rung {rung_name(e.rung)}"
            f" (first {rung_name(e.first_rung)})  opened {when(e.opened_at)}{closed}"
        )
        click.echo(f"     {clip(e.message, 100)}")
        for s in steps[e.id]:
            rc = "-" if s.returncode is None else str(s.returncode)
            click.echo(
                f"     step {s.id}: {rung_name(s.rung)} {s.action} attempt {s.attempt}"
                f" {s.state} rc={rc} {when(s.started_at)}"
                + (f" -> {when(s.ended_at)}" if s.ended_at else "")
            )
    click.echo("")
    click.echo(f"RMA tickets ({len(tickets)}):" if tickets else "RMA tickets: none")
    if tickets:
        echo_table(
            ["  " + LIST_HEADERS[0], *(h for h in LIST_HEADERS[2:] if h != "BY")],
            (["  " + r[0], *r[2:8], r[9]] for r in list_rows(tickets, now)),
        )
    click.echo("")
    click.echo(f"recent events ({len(recent)}):" if recent else "recent events: none")
    if recent:
        headers = ["  " + EVENT_HEADERS[0], *EVENT_HEADERS[2:]]
        echo_table(headers, (["  " + r[0], *r[1:]] for r in event_rows(recent, with_node=False)))


reason_option = click.option("--reason", required=True, help="Why (kept in Slurm and the store).")
force_option = click.option("--force", is_flag=True, help="Override the safety refusal.")


def _check_reason(reason: str) -> str:
    """The reason as Slurm will store it (whitespace collapsed, scontrol's surrounding
    quotes dropped), refused when empty or when it would read as one of Medic's drains."""
    reason = " ".join(as_slurm_stores(" ".join(reason.split())).split())
    if not reason:
        raise AdminError("--reason is empty", "every manual action must say why",
                         "give --reason TEXT", EXIT_USAGE)  # fmt: skip
    if claims_medic_prefix(reason):
        raise AdminError(
            "a reason starting with 'medic:' is reserved (quotes around it do not count:"
            " Slurm drops them)",
            "that prefix marks Medic's own drains, which Medic resumes by itself",
            "write your own reason, e.g. --reason 'admin: reseat GPU 2 (ticket 1234)'",
            EXIT_USAGE,
        )
    _refuse_unfit(reason)
    return reason


def _refuse_unfit(reason: str) -> None:
    """An admin's reason too long for Slurm's accounting, or with characters that would not
    print as themselves in `sinfo -R`, a terminal or a log (NUL, BEL, ESC, RTL overrides)."""
    unfit = admin_reason_problem(reason)
    if unfit is not None:
        problem, fix = unfit
        raise AdminError(problem, "Slurm, its accounting and every `sinfo -R` keep it as typed",
                         fix, EXIT_USAGE)  # fmt: skip


def _record(config: Any, store_url: str | None, name: str, what: str, reason: str,
            evidence: dict[str, Any]) -> None:  # fmt: skip
    """An `admin` event for the node; a store that cannot be written only warns (Slurm has
    already done the work)."""
    try:
        with opened_store(config, store_url) as store:
            store.add_event(
                name, at=now_utc(), kind="admin", severity=Severity.WARN,
                source=f"cli:{actor()}", message=f"{what} by {actor()}: {reason}",
                evidence={"action": what, "actor": actor(), "reason": reason, **evidence},
            )  # fmt: skip
    except (AdminError, ValueError) as exc:
        warn(f"{name}: {what} done, but not recorded in the store", str(exc),
             "check the store; the action itself is in slurmctld's log")  # fmt: skip


def _slurm_action(what: str, name: str, action: Any) -> None:
    try:
        action()
    except SlurmError as exc:
        raise AdminError(f"Slurm refused to {what} {name}", str(exc), SLURM_PERMISSION_FIX) from exc


def _must_exist(config: Any, name: str) -> NodeInfo:
    info = _one_node(config, name)
    if info is None:
        raise AdminError(f"no node {name!r} in Slurm", "sinfo does not list it",
                         "check the name with `sinfo -N`")  # fmt: skip
    return info


@node.command("drain")
@click.argument("name", shell_complete=complete_node)
@reason_option
@force_option
@store_option
@config_option
def drain(name: str, reason: str, force: bool, store_url: str | None,
          config_path: Path | None) -> None:  # fmt: skip
    """Drain NAME with your reason (Medic never resumes a drain that is not its own)."""
    reason = _check_reason(reason)
    config = load(config_path)
    info = _must_exist(config, name)
    previous = info.reason if info.drained else ""
    if previous and not is_medic_reason(previous) and not force:
        raise AdminError(
            f"{name} is already drained by someone else: {previous!r}",
            "replacing it would lose their note",
            "talk to them, or --force to replace the reason",
        )
    _slurm_action("drain", name, lambda: slurm_client(config).drain(name, reason))
    _record(config, store_url, name, "drain", reason, {"previous_reason": previous})
    click.echo(f"{name} drained: {reason}")
    if is_medic_reason(previous):
        click.echo(f"(it was Medic's drain: {previous}; Medic no longer resumes it)")


@node.command("resume")
@click.argument("name", shell_complete=complete_node)
@reason_option
@force_option
@store_option
@config_option
def resume(name: str, reason: str, force: bool, store_url: str | None,
           config_path: Path | None) -> None:  # fmt: skip
    """Return NAME to service. Refuses a drain Medic did not record (whatever its text),
    or a node an open remediation episode is repairing or an open RMA ticket keeps out,
    unless --force. A drain kept for a human (a needs-human episode closed without
    --resume) is given back. Recorded with your login and uid."""
    from medic_core.drain_book import DrainBook, Holding, operator
    from remediation import tickets
    from remediation.give_back import give_back

    reason = " ".join(reason.split())
    if not reason:
        raise AdminError("--reason is empty", "every manual action must say why",
                         "give --reason TEXT", EXIT_USAGE)  # fmt: skip
    _refuse_unfit(reason)
    config = load(config_path)
    info = _must_exist(config, name)
    down = "DOWN" in (info.state, *info.flags)
    if not info.drained and not down:
        raise AdminError(f"{name} is not drained or down ({info.state})", "nothing to resume",
                         "see `medic node show " + name + "`")  # fmt: skip
    who = operator()
    with opened_store(config, store_url) as store:
        rails = tickets.read_rails(store, name)
        book = DrainBook.of(store)
        own = book.ownership(name, info)
        episode, ticket_ids = rails.episode, rails.open_tickets
        if own.holding is not Holding.RECORDED and not force:
            by = f" (set by {info.reason_user})" if info.reason_user else ""
            raise AdminError(
                f"{name} was not drained by Medic: {info.reason!r}{by}",
                f"Medic resumes only its own drains ({own.why}); the owner of this one may"
                " still be working",
                "ask them, or --force to resume anyway",
            )
        if ticket_ids and not force:
            raise AdminError(
                f"RMA ticket {ticket_ids[0]} is open for {name}",
                "a node with an open RMA ticket stays out (Medic drains it again at once)",
                f"close the ticket when the part is replaced (medic rma close {ticket_ids[0]}),"
                " or --force",
            )
        if episode is not None and not force:
            raise AdminError(
                f"remediation episode #{episode.id} ({episode.state}, rung "
                f"{rung_name(episode.rung)}) is repairing {name}",
                "resuming now would put jobs on a node in the middle of a repair",
                f"wait for it (medic node show), close it (medic episode close {episode.id}"
                " --reason TEXT), or --force",
            )
        try:
            done = give_back(
                slurm_client(config), book, name, actor=who, human=True, force=force,
                open_episode=episode.id if episode is not None else None,
                rma_open=ticket_ids, note=reason,
            )  # fmt: skip
        except SlurmError as exc:
            raise AdminError(f"Slurm refused to resume {name}", str(exc),
                             SLURM_PERMISSION_FIX) from exc  # fmt: skip
    if not done.resumed:
        raise AdminError(f"{name} not resumed: {done.outcome.value}", done.why,
                         f"see `medic node show {name}`")  # fmt: skip
    evidence = {"previous_reason": info.reason, "forced": force, "drain": own.holding.value}
    _record(config, store_url, name, "resume", reason, evidence)
    click.echo(f"{name} resumed (was {'+'.join([info.state, *sorted(info.flags)])}: "
               f"{info.reason or 'no reason'})")  # fmt: skip


@node.command("reboot")
@click.argument("name", shell_complete=complete_node)
@reason_option
@click.option(
    "--nextstate",
    type=click.Choice(["RESUME", "DOWN"], case_sensitive=False),
    default="RESUME",
    show_default=True,
    help="State after the reboot (DOWN: keep it out until someone resumes it).",
)
@store_option
@config_option
def reboot(name: str, reason: str, nextstate: str, store_url: str | None,
           config_path: Path | None) -> None:  # fmt: skip
    """Reboot NAME through Slurm as soon as its jobs are done (scontrol reboot ASAP)."""
    reason = _check_reason(reason)
    config = load(config_path)
    _must_exist(config, name)
    _slurm_action(
        "reboot", name, lambda: slurm_client(config).reboot(name, reason, nextstate.upper())
    )
    _record(config, store_url, name, "reboot", reason, {"nextstate": nextstate.upper()})
    click.echo(f"{name}: reboot requested (ASAP, then {nextstate.upper()}): {reason}")


__all__ = ["node"]

"""`medic episode list|show|close|retry`: a human's hand on the remediation ladder's episodes.

An episode that waits for a human (`needs_human`: past the drain cap, no rung for the fault,
a drain that is not Medic's, a dry run) never closes by itself. `close` ends it for good
(state `closed`, who and why in its message and evidence, an `admin` event). With
`--resume` it also gives the node back through the decision core (only a drain Medic
recorded; the resume recorded with your login and uid). Without it, Medic's drain record is
marked as kept for a human: nothing of Medic's resumes the node (not the HealthCheckProgram,
not the ladder) until `medic node resume`. `retry` hands it back to the ladder: waiting_idle
at the rung it was on, with that rung's attempts reset, after making sure the node is drained
(Medic's drain, recorded for this episode, so the ladder lifts it once repaired).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.admin import (
    EXIT_USAGE,
    AdminError,
    actor,
    age,
    clip,
    config_option,
    echo_json,
    echo_table,
    episode_json,
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
from medic_core.drain_book import DrainBook, operator
from medic_core.drain_reason import DrainOutcome, drain_if_allowed, format_reason
from medic_core.slurm import SlurmError
from medic_core.status import Severity
from remediation import episode_types

# The store (SQLAlchemy), the episodes and the tickets load inside the commands, not for
# `medic episode --help` (tests/test_cli_startup_imports.py).
if TYPE_CHECKING:
    from medic_core.store import Store
    from remediation import episodes as ep
    from remediation import tickets

# What `medic episode list` shows without --all: what still waits for the ladder or a human.
WAITING_STATES = (*episode_types.OPEN_STATES, episode_types.NEEDS_HUMAN, episode_types.RMA)
HEADERS = ("EPISODE", "NODE", "STATE", "RUNG", "FAULT", "TARGET", "OPENED", "UPDATED", "MESSAGE")


@click.group("episode")
def episode() -> None:
    """Remediation episodes: list and show them; close or retry one waiting for a human."""


def _reason(text: str, required: bool) -> str:
    text = " ".join(text.split())
    if required and not text:
        raise AdminError("--reason is empty", "closing an episode must say why",
                         "give --reason TEXT", EXIT_USAGE)  # fmt: skip
    return text


def _get(episodes: ep.EpisodeStore, episode_id: int) -> ep.Episode:
    found = episodes.get(episode_id)
    if found is None:
        raise AdminError(f"no episode {episode_id}", "the store has no episode with that id",
                         "list them with `medic episode list --all`")  # fmt: skip
    return found


def _open_ticket(store: Store, e: ep.Episode) -> tickets.Ticket | None:
    """The episode's RMA ticket, if it is not closed."""
    from remediation import tickets

    if e.ticket_id is None:
        return None
    ticket = tickets.get(store, int(e.ticket_id))
    return ticket if ticket is not None and ticket.state != tickets.TicketState.CLOSED else None


def _audit(store: Store, e: ep.Episode, what: str, reason: str, extra: dict[str, Any]) -> None:
    who = actor()
    store.add_event(
        e.node, at=now_utc(), kind="admin", severity=Severity.WARN, source=f"cli:{who}",
        message=f"episode {e.id} {what} by {who}: {reason or '(no reason given)'}",
        fault_class=e.fault_class, target=e.target,
        evidence={"action": f"episode_{what}", "episode_id": e.id, "actor": who,
                  "reason": reason, **extra},
    )  # fmt: skip


@episode.command("list")
@click.option("--node", help="Only this node's episodes.", shell_complete=complete_node)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Every episode (default: open ones and those waiting for a human or an RMA).",
)
@json_option
@store_option
@config_option
def list_episodes(
    node: str | None, show_all: bool, as_json: bool, store_url: str | None,
    config_path: Path | None,
) -> None:  # fmt: skip
    """Episodes, oldest first: by default those the ladder or a human still has to act on."""
    from remediation import episodes as ep

    now = now_utc()
    config = load(config_path)
    with opened_store(config, store_url) as store:
        found = ep.EpisodeStore(store).find(node=node, states=None if show_all else WAITING_STATES)
    if as_json:
        echo_json([episode_json(e) for e in found])
        return
    if not found:
        click.echo("no episodes" if show_all else "no episode open or waiting for a human")
        return
    echo_table(
        HEADERS,
        (
            [str(e.id), e.node, e.state, rung_name(e.rung), e.fault_class, e.target or "-",
             when(e.opened_at), f"{age(e.updated_at, now)} ago", clip(e.message, 70)]
            for e in found
        ),
    )  # fmt: skip


@episode.command("show")
@click.argument("episode_id", metavar="ID", type=int)
@json_option
@store_option
@config_option
def show_episode(
    episode_id: int, as_json: bool, store_url: str | None, config_path: Path | None
) -> None:
    """One episode: its state, rung, attempts, message, steps, and who closed or retried it."""
    from remediation import episodes as ep

    config = load(config_path)
    with opened_store(config, store_url) as store:
        episodes = ep.EpisodeStore(store)
        e = _get(episodes, episode_id)
        steps = episodes.steps(e.id)
    if as_json:
        echo_json({**episode_json(e, steps), "evidence": e.evidence})
        return
    if e.state == ep.NEEDS_HUMAN:  # not closed: it waits for a human
        closed = f"  waiting for a human since {when(e.closed_at or e.updated_at)}"
    else:
        closed = f"  closed {when(e.closed_at)}" if e.closed_at else ""
    click.echo(f"episode {e.id}  node {e.node}  state {e.state}{closed}")
    click.echo(
        f"fault {e.fault_class} {e.target or ''}  check {e.check}  recommendation "
        f"{e.recommendation}"
    )
    attempts = ", ".join(f"{rung_name(int(r))} {n}" for r, n in sorted(e.attempts.items()))
    click.echo(
        f"rung {rung_name(e.rung)} (first {rung_name(e.first_rung)})  attempts "
        f"{attempts or 'none'}  failed re-qualifications {e.failed_requalifications}"
        + (f"  RMA ticket {e.ticket_id}" if e.ticket_id is not None else "")
    )
    click.echo(f"opened {when(e.opened_at)}  updated {when(e.updated_at)}")
    click.echo(f"message: {e.message}")
    by = e.evidence.get("closed_by")
    if isinstance(by, dict):
        click.echo(f"closed by {by.get('actor')} at {by.get('at')}: {by.get('reason')}")
    for r in e.evidence.get("retries") or ():
        click.echo(f"retried by {r.get('actor')} at {r.get('at')} (was {r.get('from_state')}): "
                   f"{r.get('reason') or '(no reason given)'}")  # fmt: skip
    click.echo(f"steps ({len(steps)}):" if steps else "steps: none")
    for s in steps:
        rc = "-" if s.returncode is None else str(s.returncode)
        click.echo(
            f"  {s.id}: {rung_name(s.rung)} {s.action} attempt {s.attempt} {s.state} rc={rc}"
            f" {when(s.started_at)}" + (f" -> {when(s.ended_at)}" if s.ended_at else "")
        )


@episode.command("close")
@click.argument("episode_id", metavar="ID", type=int)
@click.option("--reason", required=True, help="Why (kept in the episode and an admin event).")
@click.option(
    "--resume",
    "resume_node",
    is_flag=True,
    help="Also return the node to service (only a drain Medic recorded; as `medic node resume`).",
)
@json_option
@store_option
@config_option
def close_episode(
    episode_id: int, reason: str, resume_node: bool, as_json: bool, store_url: str | None,
    config_path: Path | None,
) -> None:  # fmt: skip
    """Close an episode for good (state `closed`). With --resume, also return the node to
    service; without, the node stays drained until `medic node resume` (nothing of Medic's
    resumes it meanwhile)."""
    from remediation import episodes as ep

    reason = _reason(reason, required=True)
    config = load(config_path)
    with opened_store(config, store_url) as store:
        episodes = ep.EpisodeStore(store)
        e = _get(episodes, episode_id)
        ticket = _open_ticket(store, e)
        if ticket is not None:
            raise AdminError(
                f"episode {e.id} waits for RMA ticket {ticket.id} ({ticket.state})",
                "the ticket keeps the node out and its re-qualification closes the episode",
                f"close the ticket first (medic rma close {ticket.id} ...)",
            )
        try:
            done = episodes.close_by_human(e.id, actor(), reason)
        except ep.EpisodeRefused as exc:
            raise AdminError(f"cannot close episode {e.id}", str(exc),
                             f"see `medic episode show {e.id}`") from exc  # fmt: skip
        node = _after_close(config, store, done, reason, resume_node)
        _audit(store, done, "close", reason, {"from_state": e.state, "node": node})
    if as_json:
        echo_json({**episode_json(done), "node": node})
        return
    click.echo(f"episode {done.id} on {done.node} closed (was {e.state}): {reason}")
    click.echo(f"{done.node}: {node}")


def _after_close(config: Any, store: Store, e: ep.Episode, reason: str, resume: bool) -> str:
    """The node after its episode was closed, in one line: given back (`resume`) through the
    decision core, or its drain record kept for a human (never resumed silently)."""
    from remediation.give_back import give_back

    book = DrainBook.of(store)
    client = slurm_client(config)
    try:
        info = client.node(e.node)
        if info is None:
            return "Slurm does not know it"
        if not (info.drained or info.down):
            return f"in service ({info.state}): nothing to resume"
        if resume:
            done = give_back(
                client, book, e.node, actor=operator(), human=True, resolving=e.id,
                episode_id=e.id, note=f"episode {e.id} closed: {reason}",
            )  # fmt: skip
            if done.resumed:
                return "resumed"
            warn(f"{e.node} NOT resumed: {done.why}",
                 fix=f"`medic node resume {e.node} --reason TEXT` (--force if sure)")  # fmt: skip
            return f"NOT resumed: {done.why}"
    except SlurmError as exc:
        warn(f"cannot read or resume {e.node} in Slurm", str(exc),
             f"`medic node resume {e.node} --reason TEXT` once Slurm answers")  # fmt: skip
        return f"NOT resumed: Slurm: {exc}"
    own = book.ownership(e.node, info)
    if own.recorded and own.record is not None:
        note = f"episode {e.id} closed without --resume: only `medic node resume` gives it back"
        book.hold(e.node, own.record.reason, actor=operator(), note=note)
    return (
        "NOT resumed: it stays drained until `medic node resume "
        f"{e.node} --reason TEXT` (or close with --resume)"
    )


@episode.command("retry")
@click.argument("episode_id", metavar="ID", type=int)
@click.option("--reason", default="", help="Why (optional; kept in the episode).")
@json_option
@store_option
@config_option
def retry_episode(
    episode_id: int, reason: str, as_json: bool, store_url: str | None,
    config_path: Path | None,
) -> None:  # fmt: skip
    """Hand a needs_human, paused or closed episode back to the ladder: waiting_idle at its
    rung, that rung's attempts reset. Drains the node (Medic's drain) if it is in service."""
    from remediation import episodes as ep

    reason = _reason(reason, required=False)
    config = load(config_path)
    outcome: list[DrainOutcome] = []
    with opened_store(config, store_url) as store:
        episodes = ep.EpisodeStore(store)
        e = _get(episodes, episode_id)

        def prepare(current: ep.Episode) -> None:
            ticket = _open_ticket(store, current)
            if ticket is not None:
                raise ep.EpisodeRefused(
                    f"RMA ticket {ticket.id} ({ticket.state}) is open: the part goes back; "
                    f"its re-qualification decides (medic rma show {ticket.id})"
                )
            why = format_reason(
                current.fault_class, current.target, f"retry of episode {current.id}"
            )
            client, book, who = slurm_client(config), DrainBook.of(store), operator()
            try:
                outcome.append(
                    drain_if_allowed(
                        client, current.node, why, book, actor=who, episode_id=current.id
                    )
                )
                info = client.node(current.node)
                if outcome[-1] is DrainOutcome.ALREADY_MEDIC and info is not None:
                    # Medic's drain, maybe kept for a human or made for another episode:
                    # recorded again for this one, so its ladder gives it back.
                    book.record_drain(
                        current.node, info.reason, actor=who, episode_id=current.id,
                        note=f"episode {current.id} retried: handed to the ladder",
                    )  # fmt: skip
            except SlurmError as exc:
                raise ep.EpisodeRefused(
                    f"cannot make sure {current.node} is drained before the ladder acts: {exc}"
                ) from exc
            if outcome[-1] is DrainOutcome.UNKNOWN_NODE:
                raise ep.EpisodeRefused(f"Slurm does not know {current.node}")

        try:
            done = episodes.retry_by_human(e.id, actor(), reason, prepare)
        except ep.EpisodeRefused as exc:
            raise AdminError(f"cannot retry episode {e.id}", str(exc),
                             f"see `medic episode show {e.id}` and `medic node show {e.node}`"
                             ) from exc  # fmt: skip
        drained = outcome[-1].value if outcome else "-"
        _audit(store, done, "retry", reason, {"from_state": e.state, "drain": drained})
        paused = episodes.control()
    if as_json:
        echo_json({**episode_json(done), "drain": drained})
        return
    click.echo(
        f"episode {done.id} on {done.node}: {e.state} -> {done.state} at rung "
        f"{rung_name(done.rung)} (its attempts reset); {done.node}: {drained}"
    )
    if done.rung == 4:
        click.echo("rung rma: the ladder opens an RMA ticket as soon as the node is idle")
    if outcome and outcome[-1] is DrainOutcome.NOT_OURS_KEPT:
        warn(f"{done.node} is drained by someone else: the ladder repairs it but leaves that "
             "drain in place", fix=f"`medic node resume {done.node}` once repaired")  # fmt: skip
    if paused.paused:
        warn("remediation is paused: the ladder will not move the episode",
             paused.reason, "medic remediation resume")  # fmt: skip


__all__ = ["episode"]

"""`medic nodes`: which nodes are out, why, and what Medic is doing about them (one node's
story and the manual actions on it, `medic node ...`, are in cli/node_commands.py).

`fleet()` is the function behind `medic nodes`: Slurm's node list joined with the store in
four queries whatever the fleet's size (cli.node_view.gather; bench/cli_nodes.py times it
on 10,000 nodes). Each node's word (repairing, needs_human, rma, ...) comes from
cli.node_view.node_state, the one function `medic node show` and `medic remediation
status` use too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.common import (
    EXIT_PROBLEM,
    age,
    clip,
    config_option,
    echo_json,
    echo_table,
    iso,
    json_option,
    load,
    now_utc,
    read_store,
    rung_name,
    slurm_client,
    store_option,
    warn,
    when,
)
from cli.node_view import (
    NO_DATA,
    NOT_OK,
    Fault,
    NodeState,
    StoreFacts,
    control_of,
    gather,
    natural_key,
    node_state,
    out_of_service,
    summary_counts,
)
from medic_core.drain_reason import is_medic_reason, parse_reason
from medic_core.slurm import NodeInfo, SlurmError
from medic_core.store_reader import Reader
from remediation import episode_types as ep

if TYPE_CHECKING:
    from medic_core.store import Store

# `medic nodes` imports only what it needs (tests/test_cli_startup.py): the store proper
# (SQLAlchemy) and the Slurm client's settings load when a command uses them.


@dataclass
class NodeView:
    node: str
    slurm: NodeInfo | None  # None: the store knows the node, Slurm does not (or not asked)
    health: str = NO_DATA
    faults: list[Fault] = field(default_factory=list)
    last_report: dt.datetime | None = None  # the daemon's newest condition write
    silent: bool = False  # it has reported, but not for SILENT_AFTER
    facts: StoreFacts = field(default_factory=StoreFacts)
    state: NodeState = field(default_factory=lambda: NodeState("no_data", ""))

    @classmethod
    def of(cls, name: str, slurm: NodeInfo | None, facts: StoreFacts, now: dt.datetime) -> NodeView:
        """The view of one node: its store facts, Slurm's view, and its word."""
        return cls(
            name, slurm, facts.health, list(facts.faults), facts.last_report,
            facts.silent(now), facts, node_state(slurm, facts, now),
        )  # fmt: skip

    @property
    def episode(self) -> ep.Episode | None:
        """The episode the node's word is about (open, waiting for a human, or in RMA)."""
        return self.state.episode

    @property
    def slurm_state(self) -> str:
        if self.slurm is None:
            return "?"
        return "+".join([self.slurm.state, *sorted(self.slurm.flags)])

    @property
    def drain_reason(self) -> str:  # 24.11 keeps the reason after a resume: not a drain's
        s = self.slurm
        return s.reason if s is not None and (s.drained or s.down) else ""

    @property
    def drained_by(self) -> str | None:
        """Whose the drain Slurm shows is, from Medic's drain records where this store holds
        the node's (an admin's "medic: x" is not Medic's); from the reason's text only for a
        node this store knows nothing of (a node writing to a store of its own)."""
        if not self.drain_reason:
            return None
        if self.facts.known:
            from medic_core.drain_book import as_recorded

            record = self.facts.drain_record
            ours = record is not None and as_recorded(self.drain_reason, record)
            return "medic" if ours else "other"
        return "medic" if is_medic_reason(self.drain_reason) else "other"

    @property
    def out_of_service(self) -> bool:
        return out_of_service(self.slurm)

    @property
    def since(self) -> dt.datetime | None:
        """Since when the node is in trouble: its open episode, else its worst fault."""
        if self.episode is not None:
            return self.episode.opened_at
        worst = [f.since for f in self.faults if f.status == self.health]
        return min(worst) if worst else None

    @property
    def attention(self) -> bool:
        """Anything but ok and no_data: out of service, not healthy, unwatched (its daemon
        silent), being repaired, waiting for a human or in RMA."""
        return self.state.attention

    @property
    def health_cell(self) -> str:
        return f"{self.health} (silent)" if self.silent else self.health

    def fault_classes(self) -> set[str]:
        found = {f.reason or f.type for f in self.faults}
        if self.episode is not None:
            found.add(self.episode.fault_class)
        ours = parse_reason(self.drain_reason)
        if ours is not None:
            found.add(ours.fault_class)
        return found

    def to_json(self) -> dict[str, Any]:
        s, e = self.slurm, self.episode
        return {
            "node": self.node,
            "slurm_state": s.state if s else None,
            "slurm_flags": sorted(s.flags) if s else [],
            "partitions": list(s.partitions) if s else [],
            "health": self.health,
            "last_report": iso(self.last_report),
            "daemon_silent": self.silent,
            "faults": [
                {
                    "type": f.type,
                    "target": f.target,
                    "status": f.status,
                    "reason": f.reason,
                    "since": iso(f.since),
                }
                for f in self.faults
            ],
            "episode": None
            if e is None
            else {
                "id": e.id,
                "state": e.state,
                "rung": rung_name(e.rung),
                "fault_class": e.fault_class,
                "target": e.target,
                "opened_at": iso(e.opened_at),
                "updated_at": iso(e.updated_at),
            },
            "medic": self.state.word,
            "why": self.state.why,
            "rma_tickets": [t.id for t in self.facts.tickets],
            "drain_reason": self.drain_reason,
            "drained_by": self.drained_by,
            "out_of_service": self.out_of_service,
            "attention": self.attention,
            "since": iso(self.since),
        }


def fleet(
    store: Store | Reader, slurm_nodes: Sequence[NodeInfo] | None, now: dt.datetime | None = None
) -> list[NodeView]:
    """Every node Slurm or the store knows, with its health, faults, episode, whether its
    daemon has gone silent (as of `now`), and its word (cli.node_view.node_state)."""
    now = now or dt.datetime.now(dt.UTC)
    facts = gather(store)
    by_name = {info.name: info for info in slurm_nodes or ()}
    names = sorted(set(by_name) | set(facts), key=natural_key)
    return [NodeView.of(n, by_name.get(n), facts.get(n) or StoreFacts(), now) for n in names]


def select_views(
    views: Iterable[NodeView],
    *,
    show_all: bool = False,
    states: Sequence[str] = (),
    partitions: Sequence[str] = (),
    faults: Sequence[str] = (),
) -> list[NodeView]:
    """The nodes a listing shows: those needing attention (all with `show_all`), narrowed by
    Slurm state or flag, partition, and fault class prefix."""
    wanted_states = {_state_word(s) for s in states}
    out = []
    for v in views:
        if not show_all and not v.attention:
            continue
        if wanted_states:
            have = {v.slurm.state, *v.slurm.flags} if v.slurm else set()
            if not wanted_states & have:
                continue
        if partitions and not (v.slurm and set(partitions) & set(v.slurm.partitions)):
            continue
        if faults and not any(c.startswith(p) for c in v.fault_classes() for p in faults if c):
            continue
        out.append(v)
    return out


def _state_word(text: str) -> str:
    word = text.strip().upper()
    return {"DRAINED": "DRAIN", "DRAINING": "DRAIN", "ALLOC": "ALLOCATED", "MIX": "MIXED"}.get(
        word, word
    )


def _faults_cell(faults: Sequence[Fault]) -> str:
    if not faults:
        return "-"
    labels = [f.label for f in faults]
    shown = ",".join(labels[:2])
    return shown + (f" +{len(labels) - 2}" if len(labels) > 2 else "")


def _summary(views: Sequence[NodeView]) -> str:
    total = len(views)
    out = sum(1 for v in views if v.out_of_service)
    by_medic = sum(1 for v in views if v.out_of_service and v.drained_by == "medic")
    sick = sum(1 for v in views if v.health in NOT_OK)
    silent = sum(1 for v in views if v.silent)
    return (
        f"{total} nodes: {out} out of service ({by_medic} drained by Medic), "
        f"{sick} not healthy, {summary_counts(v.state for v in views)}"
    ) + (f", {silent} with a silent medic-healthd" if silent else "")


def report_json(
    views: Sequence[NodeView],
    shown: Sequence[NodeView],
    control: ep.Control,
    now: dt.datetime,
    slurm: str = "ok",
) -> dict[str, Any]:
    """What `medic nodes --json` prints."""
    return {
        "generated_at": iso(now),
        "remediation_paused": control.paused,
        "remediation_pause_reason": control.reason,
        "slurm": slurm,
        "total": len(views),
        "nodes": [v.to_json() for v in shown],
    }


def _slurm_nodes(config: Any, store_only: bool) -> list[NodeInfo] | None:
    if store_only:
        return None
    try:
        return slurm_client(config).nodes()
    except SlurmError as exc:
        warn(
            "Slurm did not answer: listing the store's view only (STATE ?)",
            str(exc),
            "check slurmctld (sinfo) and [slurm] conf, or pass --no-slurm",
        )
        return None


@click.command("nodes")
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Every node (default: only those out of service, unhealthy or in repair).",
)
@click.option(
    "--state",
    "states",
    multiple=True,
    help="Slurm state or flag: idle, alloc, mixed, down, drain, ... (repeatable).",
)
@click.option("--partition", "partitions", multiple=True, help="Slurm partition (repeatable).")
@click.option(
    "--fault",
    "faults",
    multiple=True,
    help="Fault class or its prefix: gpu.xid.79, gpu.xid, ib (repeatable).",
)
@click.option("--no-slurm", "store_only", is_flag=True, help="Do not ask Slurm; the store only.")
@json_option
@store_option
@config_option
def nodes(
    show_all: bool,
    states: tuple[str, ...],
    partitions: tuple[str, ...],
    faults: tuple[str, ...],
    store_only: bool,
    as_json: bool,
    store_url: str | None,
    config_path: Path | None,
) -> None:  # fmt: skip
    """Which nodes are out, why, and what Medic is doing about them."""
    now = now_utc()
    config = load(config_path)
    with read_store(config, store_url) as reader:
        slurm_nodes = _slurm_nodes(config, store_only)
        views = fleet(reader, slurm_nodes, now)
        control = control_of(reader)
    shown = select_views(
        views, show_all=show_all, states=states, partitions=partitions, faults=faults
    )
    slurm_failed = slurm_nodes is None and not store_only
    slurm = "unavailable" if slurm_failed else ("skipped" if store_only else "ok")
    if as_json:
        echo_json(report_json(views, shown, control, now, slurm))
    else:
        click.echo(_summary(views))
        if control.paused:
            click.echo(
                f"remediation PAUSED since {when(control.since)} by {control.actor}: "
                f"{control.reason}"
            )
        if shown:
            echo_table(
                ("NODE", "STATE", "HEALTH", "FAULTS", "EPISODE", "RUNG", "MEDIC", "SINCE",
                 "DRAIN REASON"),
                (
                    [
                        v.node, v.slurm_state, v.health_cell, _faults_cell(v.faults),
                        v.episode.state if v.episode else "-",
                        rung_name(v.episode.rung) if v.episode else "-", v.state.word,
                        age(v.since, now), clip(v.drain_reason, 60) or "-",
                    ]
                    for v in shown
                ),
            )  # fmt: skip
        filtered = bool(states or partitions or faults)
        if not show_all and len(shown) < len(views) and not filtered:
            click.echo(
                f"({len(views) - len(shown)} more nodes healthy and in service; --all lists them)"
            )
        elif not shown:
            click.echo("no node matches")
    if slurm_failed:
        raise SystemExit(EXIT_PROBLEM)


__all__ = ["NodeView", "fleet", "nodes", "report_json", "select_views"]

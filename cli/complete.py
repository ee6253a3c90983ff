"""Shell completion for node names and RMA ticket ids, read from the store.

click calls these while the shell waits for a Tab, with whatever the command line holds so
far (`--config`, `--store` when typed before the argument; else $MEDIC_CONFIG or the default
file). A completion must never print or fail: any problem (no config, no store, a store
that does not answer) yields no candidates. Enable completion with
`eval "$(_MEDIC_COMPLETE=bash_source medic)"` (docs/admin-guide.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.shell_completion import CompletionItem

if TYPE_CHECKING:  # imported where used: the commands that name these import this module
    from medic_core.store import Store

MAX_CANDIDATES = 200


@contextmanager
def _store_for(ctx: click.Context) -> Iterator[Store | None]:
    from medic_core.config import load_config
    from medic_core.store import open_store, store_settings
    from medic_core.store.engine import parse_url

    params = ctx.params
    url = params.get("store_url")
    try:
        if url is None:
            config_path = params.get("config_path")
            url = store_settings(load_config(Path(config_path) if config_path else None)).url
        parsed = parse_url(url)
        if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
            yield None  # never create a database from a Tab key
            return
        store = open_store(parsed)
    except Exception:  # a completion offers nothing rather than fail
        yield None
        return
    with store:
        yield store


def node_names(store: Store, prefix: str, limit: int = MAX_CANDIDATES) -> list[str]:
    """Nodes the store has conditions for, whose name starts with `prefix`."""
    from sqlalchemy import select

    from medic_core.store.models import ConditionRow

    conditions = ConditionRow.__table__
    query = (
        select(conditions.c.node)
        .where(conditions.c.node.startswith(prefix, autoescape=True))
        .distinct()
        .order_by(conditions.c.node)
        .limit(limit)
    )
    with store.engine.connect() as conn:
        return [str(n) for n in conn.execute(query).scalars()]


def ticket_ids(
    store: Store, prefix: str, open_only: bool, limit: int = MAX_CANDIDATES
) -> list[tuple[int, str]]:
    """(id, "node state fault_class") of tickets whose id starts with `prefix`, newest
    first; only those not closed with `open_only`."""
    from sqlalchemy import String, cast, select

    from medic_core.store.models import RmaTicketRow

    t = RmaTicketRow.__table__
    query = select(t.c.id, t.c.node, t.c.state, t.c.fault_class).order_by(t.c.id.desc())
    if prefix:
        query = query.where(cast(t.c.id, String).startswith(prefix, autoescape=True))
    if open_only:
        query = query.where(t.c.state != "closed")
    with store.engine.connect() as conn:
        rows = conn.execute(query.limit(limit)).all()
    return [(int(r.id), f"{r.node} {r.state} {r.fault_class}") for r in rows]


def complete_node(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    with _store_for(ctx) as store:
        if store is None:
            return []
        try:
            return [CompletionItem(n) for n in node_names(store, incomplete)]
        except Exception:  # see _store_for
            return []


def _complete_ticket(ctx: click.Context, incomplete: str, open_only: bool) -> list[Any]:
    with _store_for(ctx) as store:
        if store is None:
            return []
        try:
            found = ticket_ids(store, incomplete, open_only)
        except Exception:  # see _store_for
            return []
    return [CompletionItem(str(i), help=about) for i, about in found]


def complete_ticket(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Any ticket (for `show`)."""
    return _complete_ticket(ctx, incomplete, open_only=False)


def complete_open_ticket(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Tickets that are not closed (for `update` and `close`)."""
    return _complete_ticket(ctx, incomplete, open_only=True)


__all__ = ["complete_node", "complete_open_ticket", "complete_ticket", "node_names", "ticket_ids"]

"""`medic store status|migrate`: the store's schema version, which Medic it still serves, and
upgrading it from one admin host before the daemons (docs/store.md, "Upgrading a fleet").

Every Medic that opens the store also migrates it; `medic store migrate` makes that step
explicit and says what it did. `medic store status` changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.admin import (
    EXIT_OK,
    EXIT_PROBLEM,
    AdminError,
    config_option,
    echo_json,
    json_option,
    load,
    store_option,
)
from cli.common import named_store

# SQLAlchemy and the store load when a command runs, not for `medic store --help`.
if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import URL

    from medic_core.store.migrations import SchemaState


def _url(config_path: Path | None, url: str | None) -> URL:
    return named_store(load(config_path) if url is None else None, url)


@contextmanager
def _engine(url: URL) -> Iterator[Engine]:
    from sqlalchemy.exc import DBAPIError

    from medic_core.store import StoreError
    from medic_core.store.engine import describe, make_engine

    try:
        engine = make_engine(url)
    except StoreError as exc:
        raise AdminError("cannot open the store", str(exc), "check [store] url") from exc
    try:
        yield engine
    except DBAPIError as exc:
        detail = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc).splitlines()[0]
        raise AdminError(
            f"cannot use the store {describe(url)}",
            detail,
            "check [store] url and that the database is reachable and writable",
        ) from exc
    finally:
        engine.dispose()


def _serves(state: SchemaState) -> str:
    if state.min_compatible is None:
        return "no record (before version 5): only a Medic that knows its version"
    return f"Medic that knows version {state.min_compatible} or later"


def _verdict(state: SchemaState) -> str:
    if state.pending:
        return f"behind this Medic: `medic store migrate` applies {len(state.pending)} version(s)"
    if state.version == state.known:
        return "current"
    if state.admitted:
        return "newer than this Medic, which can still use it: upgrade Medic on this host"
    return "newer than this Medic, which it refuses: upgrade Medic on this host"


def _state_json(state: SchemaState) -> dict[str, Any]:
    return {
        "version": state.version,
        "known": state.known,
        "min_compatible": state.min_compatible,
        "admitted": state.admitted,
        "pending": [{"version": m.version, "description": m.description, "compat": m.compat.value}
                    for m in state.pending],
    }  # fmt: skip


@click.group("store")
def store_group() -> None:
    """The store's schema: its version, which Medic it serves, and upgrading it."""


@store_group.command("status")
@json_option
@store_option
@config_option
def status(config_path: Path | None, store_url: str | None, as_json: bool) -> None:
    """The store's schema version and which Medic can use it; changes nothing.

    Exit 0 when this Medic can use the store (after `medic store migrate` if it is behind),
    1 when the store is newer than this Medic and refuses it."""
    from medic_core.store.engine import describe
    from medic_core.store.migrations import schema_state

    url = _url(config_path, store_url)
    with _engine(url) as engine:
        state = schema_state(engine)
    if as_json:
        echo_json(_state_json(state))
    else:
        click.echo(f"store:           {describe(url)}")
        click.echo(f"schema version:  {state.version} (this Medic knows up to {state.known})")
        click.echo(f"serves:          {_serves(state)}")
        for migration in state.pending:
            click.echo(
                f"pending:         {migration.version} {migration.description} "
                f"({migration.compat.value})"
            )
        click.echo(f"this Medic:      {_verdict(state)}")
    raise SystemExit(EXIT_OK if state.admitted else EXIT_PROBLEM)


@store_group.command("migrate")
@store_option
@config_option
def migrate_command(config_path: Path | None, store_url: str | None) -> None:
    """Bring the store's schema to this Medic's version: step 1 of an upgrade.

    Run it with the new release on one admin host before upgrading the daemons. Safe to run
    twice, or beside daemons that open the store at the same time (one migrates, the others
    wait and find nothing to do)."""
    from medic_core.store import StoreError
    from medic_core.store.engine import describe
    from medic_core.store.migrations import migrate, schema_state

    url = _url(config_path, store_url)
    with _engine(url) as engine:
        try:
            result = migrate(engine)
        except StoreError as exc:
            raise AdminError("this Medic cannot migrate the store", str(exc)) from exc
        state = schema_state(engine)
    if result.applied:
        click.echo(f"store {describe(url)}: schema version {result.before} -> {result.after}")
    else:
        click.echo(f"store {describe(url)}: schema version {result.after}, nothing to do")
    click.echo(f"serves: {_serves(state)}")

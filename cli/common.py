"""What every `medic` command shares and that costs nothing to import: the error an
operator can act on, the --config/--store/--json options, reading the configuration, and the
table, JSON and time formats of the output.

Only click, the standard library and light parts of Medic: `medic nodes` and `medic rma list`
import this on their lean path (tests/test_cli_startup.py). cli.admin re-exports every name.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from medic_core.config import ConfigError, MedicConfig, load_config
from medic_core.store_reader import Reader, Unreachable, configured_url, open_reader, reader_of
from medic_core.text import sanitised

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from medic_core.slurm import CliSlurm
    from medic_core.store import Store

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

F = TypeVar("F", bound=Callable[..., Any])


class AdminError(click.ClickException):
    """An error an operator can act on: what went wrong, why, and what to do, one line each."""

    def __init__(self, what: str, why: str = "", fix: str = "", code: int = EXIT_PROBLEM) -> None:
        super().__init__(what)
        self.why = why
        self.fix = fix
        setattr(self, "exit_code", code)  # noqa: B010  (a ClassVar on ClickException)

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"medic: {self.message}", err=True)
        if self.why:
            click.echo(f"  why: {self.why}", err=True)
        if self.fix:
            click.echo(f"  fix: {self.fix}", err=True)


def warn(what: str, why: str = "", fix: str = "") -> None:
    click.echo(f"medic: warning: {what}", err=True)
    if why:
        click.echo(f"  why: {why}", err=True)
    if fix:
        click.echo(f"  fix: {fix}", err=True)


# --- shared options -------------------------------------------------------------------------


def config_option(f: F) -> F:
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="MEDIC_CONFIG",
        help="medic.toml (default: $MEDIC_CONFIG or /etc/medic/medic.toml).",
    )(f)


def store_option(f: F) -> F:
    return click.option(
        "--store",
        "store_url",
        metavar="URL",
        help="Store URL, instead of [store] url from the config.",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def load(config_path: Path | None) -> MedicConfig:
    try:
        return load_config(config_path)
    except ConfigError as exc:
        raise AdminError(
            "cannot read the configuration",
            str(exc),
            "fix the file, or name another with --config",
            EXIT_USAGE,
        ) from exc


def actor() -> str:
    """Who runs this command (the user behind sudo, when there is one)."""
    return os.environ.get("SUDO_USER") or getpass.getuser()


# --- output ---------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the last column is not padded. Every cell is
    untrusted text (a job's name, a reason, a message): sanitised, on one line."""
    cells = [list(headers), *([sanitised(str(c)) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for row in cells:
        parts = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        out.append("  ".join([*parts, row[-1]]).rstrip())
    return out


def echo_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    click.echo("\n".join(table(headers, rows)))  # one write: listings run to 10,000 lines


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return iso(value)
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def when(value: dt.datetime | None) -> str:
    """UTC, to the second, as a table shows times."""
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def age(value: dt.datetime | None, now: dt.datetime) -> str:
    """`45s`, `12m`, `3h20m`, `2d4h`: how long ago."""
    if value is None:
        return "-"
    seconds = max(0, int((now - value).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def rung_name(rung: int) -> str:
    from remediation.policy import Rung  # here: `medic config check` and the --help need none

    try:
        return Rung(rung).word
    except ValueError:
        return str(rung)


def clip(text: str, width: int) -> str:
    """`text` sanitised, on one line, cut to `width` characters."""
    text = " ".join(sanitised(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@contextmanager
def read_store(config: MedicConfig, url: str | None) -> Iterator[Reader]:
    """The store for a read-only listing (`medic nodes`, `medic rma list`), read through the
    database driver alone when it is plain (medic_core.store_reader: a store at this Medic's
    schema version); otherwise opened as every command opens it (opened_store below:
    the same refusals, the same one-line errors, a migration when the schema is older, a
    newer schema refused or run with its warning) and read through that connection."""
    if url is None:
        url = configured_url(config.table("store"), config.paths.state_dir)
    try:
        reader = open_reader(url) if url is not None else None
    except Unreachable as exc:  # said as the store proper says it (opened_store)
        from medic_core.store.engine import describe, parse_url

        raise AdminError(
            "cannot open the store",
            f"store {describe(parse_url(url or ''))}: {exc}; check [store] url and that the"
            " database is reachable and writable",
            "check [store] url and the database server",
        ) from exc
    if reader is None:
        with opened_store(config, url) as store, reader_of(store) as through:
            yield through
        return
    with reader:
        yield reader


def named_store(config: MedicConfig | None, url: str | None) -> URL:
    """The store `url` (else the config's [store]) names, parsed. A SQLite file that does not
    exist is refused rather than created: an empty new database would only show an empty
    fleet. `config` is read only when `url` is None."""
    from medic_core.store import BadStoreURL, store_settings
    from medic_core.store.engine import parse_url

    if url is None:
        assert config is not None
        try:
            url = store_settings(config).url
        except ConfigError as exc:
            raise AdminError(
                "the configuration has a bad [store] table", str(exc), "fix it or pass --store URL",
                EXIT_USAGE,
            ) from exc  # fmt: skip
    try:
        parsed = parse_url(url)
    except BadStoreURL as exc:
        raise AdminError(f"bad store URL {url!r}", exc.problem, exc.fix, EXIT_USAGE) from exc
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        raise AdminError(
            f"no store at {parsed.database}",
            "no Medic has written there (wrong config, or not this host's store)",
            "pass --config with the fleet's medic.toml, or --store URL",
        )
    return parsed


@contextmanager
def opened_store(config: MedicConfig, url: str | None) -> Iterator[Store]:
    """The store the config (or `url`) names (`named_store`), opened; imports the store
    (SQLAlchemy) only when called."""
    from medic_core.store import StoreError, open_store

    try:
        store = open_store(named_store(config, url))
    except StoreError as exc:
        raise AdminError(
            "cannot open the store", str(exc), "check [store] url and the database server"
        ) from exc
    with store:
        yield store


def slurm_client(config: MedicConfig) -> CliSlurm:
    """Slurm's commands with SLURM_CONF from the config's `[slurm] conf`."""
    from medic_core.settings import HookSettings
    from medic_core.slurm import CliSlurm, SlurmError
    from remediation.actions import slurm_env

    try:
        timeout = HookSettings.from_config(config).slurm_timeout
    except ConfigError as exc:
        raise AdminError("the configuration has a bad [hooks] table", str(exc), "fix it",
                         EXIT_USAGE) from exc  # fmt: skip
    env = slurm_env(config)
    conf = env.get("SLURM_CONF")
    if conf and not Path(conf).is_file():
        # Slurm's commands would retry for a minute before saying so.
        raise SlurmError(f"slurm.conf {conf} ([slurm] conf or $SLURM_CONF) does not exist")
    return CliSlurm(env=env, timeout=timeout)

"""Medic's configuration file and this node's identity.

One TOML file (default /etc/medic/medic.toml, or the file named by MEDIC_CONFIG). Paths in
the `[node]` table may contain `{node}`, replaced by this node's name: production never
uses it (one node per host), while the lab runs several slurmd on one host and gives each
its own scenario, fixture root, state dir and socket from a single file.

The node's name comes from MEDIC_NODE_NAME, else SLURMD_NODENAME (set by slurmd for the
Prolog, Epilog and HealthCheckProgram), else the short host name.
"""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medic_core.text import sanitised

DEFAULT_CONFIG_PATH = Path("/etc/medic/medic.toml")
CONFIG_ENV = "MEDIC_CONFIG"
NODE_NAME_ENVS = ("MEDIC_NODE_NAME", "SLURMD_NODENAME")

# Tables owned by other parts of Medic; each part validates its own table.
KNOWN_TABLES = frozenset(
    {"node", "slurm", "lab", "checks", "healthd", "hooks", "store", "remediation", "sweep",
     "fleet", "hygiene"}
)  # fmt: skip


# A file larger than this is no configuration (the shipped example is 20 KB), and no key of
# Medic's is deeper than `[checks.command.<name>] key = [...]`: tables and arrays nested
# deeper are refused (tomllib itself recursed into a RecursionError at ~1,000 levels).
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 8
_SHOWN_VALUE = 80  # characters of a bad value quoted in a message


class ConfigError(ValueError):
    """Bad configuration: the message names the file, the key and the fix, on one line
    (passed through the one sanitiser: a key or value holding a control or a line break
    stays one line). `others`: the further problems found with it, each a ConfigError;
    `lines()` is every problem, one line each (`medic config check`, the daemon)."""

    def __init__(self, path: Path | None, key: str, problem: str, fix: str) -> None:
        where = str(path) if path else "<defaults>"
        super().__init__(sanitised(f"{where}: {key}: {problem}; {fix}"))
        self.path = path
        self.key = key
        self.others: tuple[ConfigError, ...] = ()

    def lines(self) -> list[str]:
        return [str(self), *(str(other) for other in self.others)]

    @classmethod
    def of(cls, problems: Sequence[ConfigError]) -> ConfigError:
        """The first of `problems` (at least one), carrying the rest."""
        first = problems[0]
        first.others = tuple(problems[1:])
        return first


def shown(value: object) -> str:
    """A bad value quoted in a message: its repr, clipped (a 1 MB string is not a message)."""
    text = repr(value)
    return text if len(text) <= _SHOWN_VALUE else text[: _SHOWN_VALUE - 3] + "..."


@dataclass(frozen=True)
class NodePaths:
    """Where this node's readings and state live."""

    host_root: Path = Path("/")  # /sys, /proc and /dev are read below this root
    state_dir: Path = Path("/var/lib/medic")
    socket: Path = Path("/run/medic/healthd.sock")

    @property
    def sys(self) -> Path:
        return self.host_root / "sys"

    @property
    def proc(self) -> Path:
        return self.host_root / "proc"

    @property
    def dev(self) -> Path:
        return self.host_root / "dev"


@dataclass(frozen=True)
class MedicConfig:
    source: Path | None
    node_name: str
    paths: NodePaths = field(default_factory=NodePaths)
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def table(self, name: str) -> Mapping[str, Any]:
        return self.tables.get(name, {})


def node_name(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    for var in NODE_NAME_ENVS:
        if env.get(var):
            return env[var]
    return socket.gethostname().split(".")[0]


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else DEFAULT_CONFIG_PATH


# Characters a node path may not hold: a store URL is built from state_dir, and there "?"
# starts URL options and "#" a fragment (the SQLite file would land outside state_dir).
_PATH_FORBIDDEN = {"\0": "NUL", "?": "'?'", "#": "'#'"}


def _expand(path: Path | None, key: str, value: object, node: str) -> Path:
    """A `[node]` path with `{node}` replaced: absolute, no `..`, nothing that a URL or a
    file system would read as anything but this one path."""
    if not isinstance(value, str) or not value:
        raise ConfigError(path, key, f"expected a path string, got {shown(value)}", "give a path")
    if "{" in value.replace("{node}", "") or "}" in value.replace("{node}", ""):
        raise ConfigError(path, key, f"unknown placeholder in {value!r}", "only {node} exists")
    if "{node}" in value and (not node or "/" in node or node in (".", "..")):
        raise ConfigError(
            path, key, f"the node name {node!r} cannot stand in a path",
            "set MEDIC_NODE_NAME to the node's plain name",
        )  # fmt: skip
    expanded = value.replace("{node}", node)
    for char, name in _PATH_FORBIDDEN.items():
        if char in expanded:
            raise ConfigError(
                path, key, f"{expanded!r} holds {name}", "give a plain absolute path without it"
            )
    if not expanded.startswith("/"):
        raise ConfigError(path, key, f"{expanded!r} is not absolute", "give a path from /")
    if ".." in expanded.split("/"):
        raise ConfigError(
            path, key, f"{expanded!r} climbs out with '..'", "give the directory itself"
        )
    return Path(expanded)


def _deeper_than(data: Mapping[str, Any], limit: int) -> str | None:
    """The dotted key of the first value nested deeper than `limit` tables and arrays (the
    top-level tables are level 1), or None. Iterative: the depth it checks is any."""
    stack: list[tuple[str, Any, int]] = [(str(k), v, 1) for k, v in data.items()]
    while stack:
        key, value, depth = stack.pop()
        if isinstance(value, Mapping | list):
            if depth > limit:
                return key
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            stack += [(f"{key}.{k}" if isinstance(value, Mapping) else key, v, depth + 1)
                      for k, v in items]  # fmt: skip
    return None


def parse_config(data: Mapping[str, Any], source: Path | None, node: str) -> MedicConfig:
    """The file's tables, checked as far as this module knows them: known names, each a
    table, and the `[node]` paths, nothing nested deeper than MAX_DEPTH. Each part
    validates the keys of its own table."""
    too_deep = _deeper_than(data, MAX_DEPTH)
    if too_deep is not None:
        raise ConfigError(
            source, too_deep, f"nested deeper than {MAX_DEPTH} levels",
            f"write tables and arrays at most {MAX_DEPTH} levels deep",
        )  # fmt: skip
    for table, value in data.items():
        if table not in KNOWN_TABLES:
            known = ", ".join(sorted(KNOWN_TABLES))
            raise ConfigError(source, table, "unknown table", f"use one of: {known}")
        if not isinstance(value, Mapping):
            raise ConfigError(
                source, table, f"expected a table, got {shown(value)}", f"write it as [{table}]"
            )
    node_table = data.get("node", {})
    defaults = NodePaths()
    values: dict[str, Path] = {}
    for key, raw in node_table.items():
        if key not in ("host_root", "state_dir", "socket"):
            raise ConfigError(
                source, f"node.{key}", "unknown key", "use host_root, state_dir or socket"
            )
        values[key] = _expand(source, f"node.{key}", raw, node)
    paths = NodePaths(
        host_root=values.get("host_root", defaults.host_root),
        state_dir=values.get("state_dir", defaults.state_dir),
        socket=values.get("socket", defaults.socket),
    )
    return MedicConfig(source=source, node_name=node, paths=paths, tables=dict(data))


def load_config(path: Path | None = None, environ: Mapping[str, str] | None = None) -> MedicConfig:
    """Load the configuration; a missing default file means built-in defaults, a missing
    file that was asked for by name is an error."""
    explicit = path is not None or bool(
        (os.environ if environ is None else environ).get(CONFIG_ENV)
    )
    source = path or config_path(environ)
    node = node_name(environ)
    try:
        with source.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(
                source, "-", f"larger than {MAX_CONFIG_BYTES} bytes", "give Medic's medic.toml"
            )
        text = raw.decode("utf-8")
    except FileNotFoundError:
        if explicit:
            fix = f"create it or unset {CONFIG_ENV}"
            raise ConfigError(source, "-", "file not found", fix) from None
        return parse_config({}, None, node)
    except IsADirectoryError:
        raise ConfigError(source, "-", "is a directory", "point at the medic.toml file") from None
    except OSError as exc:
        raise ConfigError(
            source, "-", f"cannot read it ({exc.strerror or exc})", "make it readable by root"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, "-", f"not UTF-8 text (byte {exc.start})", "save it as UTF-8"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "-", f"not valid TOML ({exc})", "fix the syntax") from exc
    except RecursionError:  # tomllib recurses once per level of nesting
        raise ConfigError(
            source, "-", f"nested deeper than {MAX_DEPTH} levels",
            f"write tables and arrays at most {MAX_DEPTH} levels deep",
        ) from None  # fmt: skip
    except ValueError as exc:  # an integer of more than 4,300 digits (int's own limit)
        raise ConfigError(source, "-", f"not a usable value ({exc})", "fix the value") from None
    return parse_config(data, source, node)

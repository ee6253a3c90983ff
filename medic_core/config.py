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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = Path("/etc/medic/medic.toml")
CONFIG_ENV = "MEDIC_CONFIG"
NODE_NAME_ENVS = ("MEDIC_NODE_NAME", "SLURMD_NODENAME")

# Tables owned by other parts of Medic; each part validates its own table.
KNOWN_TABLES = frozenset(
    {"node", "slurm", "lab", "checks", "healthd", "hooks", "store", "remediation", "sweep"}
)


class ConfigError(ValueError):
    """Bad configuration: the message names the file, the key and the fix, on one line."""

    def __init__(self, path: Path | None, key: str, problem: str, fix: str) -> None:
        where = str(path) if path else "<defaults>"
        super().__init__(f"{where}: {key}: {problem}; {fix}")
        self.path = path
        self.key = key


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
        raise ConfigError(path, key, f"expected a path string, got {value!r}", "give a path")
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


def parse_config(data: Mapping[str, Any], source: Path | None, node: str) -> MedicConfig:
    """The file's tables, checked as far as this module knows them: known names, each a
    table, and the `[node]` paths. Each part validates the keys of its own table."""
    for table, value in data.items():
        if table not in KNOWN_TABLES:
            known = ", ".join(sorted(KNOWN_TABLES))
            raise ConfigError(source, table, "unknown table", f"use one of: {known}")
        if not isinstance(value, Mapping):
            raise ConfigError(
                source, table, f"expected a table, got {value!r}", f"write it as [{table}]"
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
        text = source.read_text(encoding="utf-8")
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
    return parse_config(data, source, node)

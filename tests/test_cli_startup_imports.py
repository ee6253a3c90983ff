"""What each `medic` subcommand imports before it has anything to read: every `--help`, the
completion of every group's subcommand names, and the commands that read no store
(`report what-if`, `ckpt`, `config check`) import neither SQLAlchemy nor the store proper
nor any other heavy module. Issue 27: `medic report --help` and `medic report what-if` took
0.43 s because cli.report imported cli.admin, which imported the store and SQLAlchemy.

Each case runs in a fresh interpreter, the way a shell runs `medic`, and lists the modules
imported after each command line; the time itself is bench/cli_startup.py's.
(tests/test_cli_startup.py covers `medic --help`, `--version` and the lean `medic nodes`.)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
import pytest

from cli.main import COMMANDS
from medic_core import proc

REPO = Path(__file__).resolve().parent.parent

# Packages no --help or store-free command needs, each a noticeable share of a start-up.
HEAVY_PACKAGES = {
    "sqlalchemy",
    "psycopg",
    "psycopg_binary",
    "pynvml",
    "jinja2",
    "yaml",
    "psutil",
    "prometheus_client",
    "rich",
}
# Medic's modules that import SQLAlchemy (or the NVML bindings) as they load.
HEAVY_MODULES = {
    "medic_core.store",
    "remediation.episodes",
    "remediation.tickets",
    "remediation.report_store",
    "remediation.sweep",
    "healthd.nvml_client",
    # Not heavy itself, but the decision core (~0.1 s with what it imports) has no business
    # in a --help: observe-only's report section once pulled it into `medic report --help`.
    "remediation.decide",
}

# Runs each command line of argv[1] (a JSON list of lists) in this one interpreter, in
# order, and prints after each which heavy modules are loaded and how it exited. A module
# loaded by one line stays loaded: the first line that loads it is the one to blame.
PROBE = """
import contextlib, io, json, os, sys
from cli.main import medic
heavy_packages, heavy_modules = set(json.loads(sys.argv[2])), json.loads(sys.argv[3])

def heavy():
    return sorted(
        m for m in sys.modules
        if m.split(".")[0] in heavy_packages
        or any(m == h or m.startswith(h + ".") for h in heavy_modules)
    )

out = []
for args, env in json.loads(sys.argv[1]):
    os.environ.update(env)
    printed = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # completion writes bytes
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            medic.main(args, prog_name="medic")
            code = 0
        except SystemExit as exc:
            code = exc.code
    for key in env:
        del os.environ[key]
    printed.flush()
    text = printed.buffer.getvalue().decode()
    loaded = sorted(m for m in sys.modules if m.startswith(("cli.", "healthd.", "remediation")))
    out.append({"args": args, "code": code, "heavy": heavy(), "printed": text, "loaded": loaded})
print(json.dumps(out))
"""


def run_fresh(lines: list[tuple[list[str], dict[str, str]]]) -> list[dict[str, object]]:
    """Each (args, extra environment) through `medic` in one new interpreter, in order."""
    done = proc.run(
        [
            sys.executable,
            "-c",
            PROBE,
            json.dumps(lines),
            json.dumps(sorted(HEAVY_PACKAGES)),
            json.dumps(sorted(HEAVY_MODULES)),
        ],
        timeout=120,
        cwd=REPO,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
    )
    assert done.returncode == 0, done.stderr
    results: list[dict[str, object]] = json.loads(done.stdout)
    return results


def command_paths(command: click.Command, path: list[str]) -> list[list[str]]:
    """`path` and the path of every subcommand below it."""
    out = [path]
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            out += command_paths(command.commands[name], [*path, name])
    return out


def completion(words: str) -> tuple[list[str], dict[str, str]]:
    """What bash runs at `WORDS<Tab>`."""
    env = {
        "_MEDIC_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split(" ")) - 1),
    }
    return [], env


def assert_light(results: list[dict[str, object]]) -> None:
    for result in results:
        assert result["heavy"] == [], f"medic {' '.join(result['args'])}: {result['heavy']}"  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_of_every_subcommand_imports_nothing_heavy(name: str) -> None:
    paths = command_paths(COMMANDS[name].load(), [name])
    results = run_fresh([([*path, "--help"], {}) for path in paths])
    assert_light(results)
    for path, result in zip(paths, results, strict=True):
        assert result["code"] == 0, result
        assert f"Usage: medic {' '.join(path)}" in str(result["printed"])


@pytest.mark.parametrize(
    "name", sorted(n for n, e in COMMANDS.items() if isinstance(e.load(), click.Group))
)
def test_completing_a_groups_subcommands_imports_nothing_heavy(name: str) -> None:
    group = COMMANDS[name].load()
    assert isinstance(group, click.Group)
    results = run_fresh([completion(f"medic {name} ")])
    assert_light(results)
    offered = {line.split(",")[1] for line in str(results[0]["printed"]).split()}
    assert offered == {n for n, c in group.commands.items() if not c.hidden}


def test_report_what_if_imports_nothing_heavy() -> None:
    what_if = ["report", "what-if", "--nodes", "512", "--failure-rate", "0.0005", "--mttr", "40m"]
    results = run_fresh(
        [
            ([*what_if, "--mttr", "4h", "--days", "30"], {}),
            ([*what_if, "--gpu-hours", "1e6", "--checkpoint-every", "30m", "--json"], {}),
            ([*what_if, "--days", "30", "--price", "2.5"], {}),
        ]
    )
    assert_light(results)
    assert [r["code"] for r in results] == [0, 0, 0]
    assert "ETTR" in str(results[0]["printed"])
    assert json.loads(str(results[1]["printed"]))


def test_a_bad_what_if_is_refused_without_the_store() -> None:
    """A usage error is found before anything heavy is imported, too."""
    results = run_fresh([(["report", "what-if", "--nodes", "0", "--failure-rate", "x"], {})])
    assert_light(results)
    assert results[0]["code"] == 2


def test_what_if_measured_pays_for_the_store_it_reads(tmp_path: Path) -> None:
    """--failure-rate measured reads the store: then, and only then, the store is imported."""
    from medic_core.store import open_store

    url = f"sqlite:///{tmp_path / 'medic.db'}"
    with open_store(url):
        pass
    args = ["report", "--store", url, "what-if", "--nodes", "8", "--failure-rate", "measured"]
    results = run_fresh([([*args, "--mttr", "40m", "--days", "1"], {})])
    assert "sqlalchemy" in results[0]["heavy"]  # type: ignore[operator]


def test_ckpt_commands_import_nothing_heavy(tmp_path: Path) -> None:
    source = tmp_path / "step"
    source.mkdir()
    (source / "weights").write_bytes(b"w" * 100)
    where = ["--dir", str(tmp_path / "ckpt")]
    results = run_fresh(
        [
            (["ckpt", "latest", *where], {}),  # none yet: exit 1
            (["ckpt", "commit", *where, "--step", "7", str(source)], {}),
            (["ckpt", "latest", *where, "--json", "--verify"], {}),
            (["ckpt", "prune", *where, "--keep", "1"], {}),
        ]
    )
    assert_light(results)
    assert [r["code"] for r in results] == [1, 0, 0, 0]
    assert json.loads(str(results[2]["printed"]))["step"] == 7


@pytest.mark.parametrize(
    "url",
    ["sqlite:///{tmp}/m.db", "postgresql://medic:secret@db.example:5432/medic", None],
)
def test_config_check_imports_nothing_heavy(tmp_path: Path, url: str | None) -> None:
    """A plain [store] url is judged without SQLAlchemy; no check has a table, so no check
    module is imported (healthd.checks.check_tables: they are at their defaults)."""
    config = tmp_path / "medic.toml"
    store = f'[store]\nurl = "{url.format(tmp=tmp_path)}"\n' if url else ""
    config.write_text(f'[node]\nstate_dir = "{tmp_path}"\n\n{store}')
    results = run_fresh([(["config", "check", "--config", str(config)], {})])
    assert results[0]["code"] == 0, results
    assert_light(results)
    assert "medic:***@db.example:5432/medic" in str(results[0]["printed"]) or url != (
        "postgresql://medic:secret@db.example:5432/medic"
    )


# What `medic config check` may load beyond click and the config's own modules: the
# settings, the check vocabulary and the checks named by a table. Not the other admin
# commands' module (cli.admin, its node views and Slurm's client), not the remediation.
NOT_FOR_CONFIG_CHECK = ("cli.admin", "cli.node_view", "remediation")


@pytest.mark.parametrize(
    "tables",
    [
        "",
        "[checks.ib]\nexpected_ports = 8\n\n[checks.filesystems]\n"
        'required_mounts = ["/"]\n\n[checks.memory]\nexpected_gib = 512\n',
        # The operator guide's example names gpu_count: NVML's vocabulary loads, no client.
        "[checks.gpu_count]\nexpected_count = 8\n\n[checks.gpu_xid]\nignore_xids = [43]\n",
    ],
)
def test_config_check_with_tables_imports_only_their_checks(tmp_path: Path, tables: str) -> None:
    config = tmp_path / "medic.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path}"\n\n{tables}')
    result = run_fresh([(["config", "check", "--config", str(config)], {})])[0]
    assert result["code"] == 0, result
    assert result["heavy"] == [], result["heavy"]
    named = {f"healthd.checks.{line[8:-1]}" for line in tables.split("\n") if "[checks." in line}
    shared = {"healthd.checks.base", "healthd.checks.command", "healthd.checks.site"}
    loaded: list[str] = result["loaded"]  # type: ignore[assignment]
    checks = {m for m in loaded if m.startswith("healthd.checks.")}
    assert checks - shared - {"healthd.checks.gpu_common"} == named
    stray = [m for m in loaded if m.startswith(NOT_FOR_CONFIG_CHECK)]
    assert stray == [], stray


def test_config_check_reads_an_unplain_store_url_through_sqlalchemy(tmp_path: Path) -> None:
    """A URL the light check is not sure of (a query string) goes to the store's parser."""
    config = tmp_path / "medic.toml"
    config.write_text('[store]\nurl = "postgresql://h/db?sslmode=require"\n')
    results = run_fresh([(["config", "check", "--config", str(config)], {})])
    assert results[0]["code"] == 0, results
    assert "sqlalchemy" in results[0]["heavy"]  # type: ignore[operator]

"""`medic`'s start-up path: `medic --help`, `--version` and the completion of a command name
import click and cli.main only (the commands load lazily), and laziness loses no command and
no help text. Timing lives in bench/ and docs/benchmarks.md; this checks what is imported."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli.main import COMMANDS, medic
from medic_core import proc

REPO = Path(__file__).resolve().parent.parent

# Everything outside the standard library that `medic --help` may import (medic_core.text:
# the terminal guard, stdlib only, installed before any output).
ALLOWED = {"click", "cli", "cli.main", "medic_core", "medic_core.text"}

PROBE = """
import json, sys
from cli.main import main
sys.argv[0] = "medic"
try:
    main()
except SystemExit:
    pass
stdlib = sys.stdlib_module_names
loaded = sorted(m for m in sys.modules if m.split(".")[0] not in stdlib and m != "__main__")
print(json.dumps(loaded), file=sys.stderr)
"""


def modules_loaded(args: list[str], env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """(stdout, the non-stdlib modules imported) of `medic ARGS` run as a process."""
    done = proc.run(
        [sys.executable, "-c", PROBE, *args],
        timeout=60,
        cwd=REPO,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return done.stdout, loaded


def unexpected(loaded: list[str]) -> list[str]:
    # click's own submodules, and the hook setuptools installs in every interpreter (site)
    return [
        m
        for m in loaded
        if m not in ALLOWED and m.split(".")[0] not in {"click", "_distutils_hack"}
    ]


def test_help_imports_no_command_module() -> None:
    out, loaded = modules_loaded(["--help"])
    assert unexpected(loaded) == []
    for name in COMMANDS:
        assert f"\n  {name} " in out


def test_version_imports_no_command_module() -> None:
    out, loaded = modules_loaded(["--version"])
    assert "version" in out
    assert unexpected(loaded) == []


@pytest.mark.parametrize("words", ["medic ", "medic no", "medic --"])
def test_completing_a_command_name_imports_no_command_module(words: str) -> None:
    env = {
        "_MEDIC_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split(" ")) - 1),
    }
    out, loaded = modules_loaded([], env)
    assert unexpected(loaded) == []
    if words == "medic no":
        assert out.split() == ["plain,node", "plain,nodes"]
    if words == "medic ":
        assert {line.split(",")[1] for line in out.split()} == set(COMMANDS)


def test_every_command_loads_under_its_name() -> None:
    for name, entry in COMMANDS.items():
        command = entry.load()
        assert command.name == name
        assert not command.hidden


@pytest.mark.parametrize("limit", [20, 45, 58, 80, 200])
def test_the_listing_shows_each_commands_own_help(limit: int) -> None:
    for name, entry in COMMANDS.items():
        real = entry.load().get_short_help_str(limit)
        assert entry.stand_in(name).get_short_help_str(limit) == real, name


def test_help_is_the_same_as_an_eager_group() -> None:
    eager = click.Group(
        "medic",
        help=medic.help,
        params=list(medic.params),
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    for entry in COMMANDS.values():
        eager.add_command(entry.load())
    fresh = type(medic)(
        "medic",
        lazy=COMMANDS,
        help=medic.help,
        params=list(medic.params),
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    runner = CliRunner()
    lazy_help = runner.invoke(fresh, ["--help"], prog_name="medic", terminal_width=100)
    eager_help = runner.invoke(eager, ["--help"], prog_name="medic", terminal_width=100)
    assert lazy_help.exit_code == 0, lazy_help.output
    assert lazy_help.output == eager_help.output


def test_a_lazy_command_runs_and_shows_its_own_help() -> None:
    result = CliRunner().invoke(medic, ["nodes", "--help"], prog_name="medic")
    assert result.exit_code == 0, result.output
    assert "Usage: medic nodes" in result.output
    assert "--no-slurm" in result.output


# What `medic nodes` and `medic rma list` must not import on a store at this Medic's schema:
# they read it through the driver alone (medic_core.store_reader, cli.common.read_store).
HEAVY_PACKAGES = {"sqlalchemy", "psycopg", "psycopg_binary"}
HEAVY_MODULES = {
    "medic_core.store",  # the store proper: SQLAlchemy, the models, the migrations
    "remediation.episodes",
    "remediation.tickets",
    "cli.admin",
}


def heavy(loaded: list[str]) -> list[str]:
    return [
        m
        for m in loaded
        if m.split(".")[0] in HEAVY_PACKAGES
        or any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES)
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["nodes", "--no-slurm"],
        ["nodes", "--no-slurm", "--json", "--all"],
        ["nodes"],  # Slurm asked (here it fails: the store's view, with a warning)
        ["rma", "list"],
        ["rma", "list", "--all", "--json"],
    ],
)
def test_listings_import_neither_sqlalchemy_nor_the_store_proper(
    args: list[str], tmp_path: Path
) -> None:
    from medic_core.store import ConditionUpdate, Status, open_store

    url = f"sqlite:///{tmp_path / 'medic.db'}"
    with open_store(url) as store:
        store.set_condition("gpu1", ConditionUpdate("cpus", Status.CRITICAL), now())
    out, loaded = modules_loaded([*args, "--store", url])
    assert out
    assert heavy(loaded) == []


@pytest.mark.parametrize(
    "args",
    [
        ["report", "--help"],
        ["report", "what-if", "--help"],
        ["report", "what-if", "--nodes", "64", "--failure-rate", "0.0005", "--mttr", "40m",
         "--days", "10"],
    ],
)  # fmt: skip
def test_report_help_and_what_if_import_neither_the_store_nor_the_reports_model(
    args: list[str],
) -> None:
    """Pure arithmetic and help text (issue 27): no SQLAlchemy, no cli.admin, and of the
    report's model only what-if's durations, not its builder (remediation.report loads its
    names on first use)."""
    out, loaded = modules_loaded(args)
    assert out
    assert heavy(loaded) == []
    assert not [m for m in loaded if m.startswith("remediation.report.") and m != (
        "remediation.report.durations")], loaded  # fmt: skip


def now() -> datetime:
    return datetime.now(UTC)


def test_an_unknown_command_is_refused() -> None:
    result = CliRunner().invoke(medic, ["nosuch"], prog_name="medic")
    assert result.exit_code == 2
    assert "No such command 'nosuch'" in result.output

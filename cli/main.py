"""`medic`: the admin CLI.

The commands are loaded lazily: `medic --help`, `medic --version` and the completion of a
command name import click and this module only, and `medic nodes` imports what `medic nodes`
needs (the store, SQLAlchemy), not what every other command needs. A new command is one
line in COMMANDS: its module, its attribute and the summary `medic --help` shows
(tests/test_cli_startup.py checks that the summary is the command's own and that nothing
heavy is imported on the way to a command).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click
from click.shell_completion import CompletionItem


@dataclass(frozen=True)
class LazyCommand:
    module: str
    attr: str
    summary: str  # the command's help, as far as `medic --help` shows it (first sentence)

    def load(self) -> click.Command:
        command = getattr(importlib.import_module(self.module), self.attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.module}.{self.attr} is not a click command")
        return command

    def stand_in(self, name: str) -> click.Command:
        """A command carrying only the name and help, for listings."""
        return click.Command(name, help=self.summary)


COMMANDS: dict[str, LazyCommand] = {
    "lab": LazyCommand(
        "cli.lab.commands", "lab", "A real Slurm cluster with simulated GPUs on this machine."
    ),
    "ckpt": LazyCommand(
        "cli.ckpt",
        "ckpt",
        "Atomic job checkpoints: resume from the last complete one, never a torn one.",
    ),
    "checks": LazyCommand(
        "cli.checks", "checks", "The health checks: what runs, when, and what each can report."
    ),
    "nodes": LazyCommand(
        "cli.nodes", "nodes", "Which nodes are out, why, and what Medic is doing about them."
    ),
    "node": LazyCommand(
        "cli.node_commands",
        "node",
        "One node: show it, or drain, resume or reboot it through Slurm.",
    ),
    "events": LazyCommand(
        "cli.admin", "events", "What happened: events from the store, newest first."
    ),
    "jobs": LazyCommand(
        "cli.admin",
        "jobs",
        "Resilient jobs (the medic:resilient=N tag): restarts charged, state, Medic's actions.",
    ),
    "remediation": LazyCommand(
        "cli.admin",
        "remediation",
        "The remediation ladder: what it is doing, and its fleet-wide pause switch.",
    ),
    "episode": LazyCommand(
        "cli.episode",
        "episode",
        "Remediation episodes: list and show them; close or retry one waiting for a human.",
    ),
    "config": LazyCommand("cli.config_cmd", "config", "Medic's configuration file."),
    "rma": LazyCommand(
        "cli.rma",
        "rma_command",
        "RMA tickets: hardware going back to the vendor, from open to closed.",
    ),
    "check": LazyCommand(
        "cli.check",
        "check",
        "Run health checks on this node now, in this process; exit 0 healthy, 1 CRITICAL,"
        " 3 UNKNOWN, 4 WARN (2: usage).",
    ),
    "sbatch": LazyCommand(
        "cli.sbatch",
        "sbatch",
        "Run sbatch; a leading --resilient[=N] makes the job requeueable and tags it"
        " medic:resilient=N (N automatic restarts, default 3).",
    ),
    "report": LazyCommand(
        "cli.report",
        "report",
        "Where resilient jobs' time went (MTTR by component, ETTR) and the fleet's reliability.",
    ),
    "store": LazyCommand(
        "cli.store",
        "store_group",
        "The store's schema: its version, which Medic it serves, and upgrading it.",
    ),
    "fleet": LazyCommand(
        "cli.fleet",
        "fleet",
        "The fleet as a whole: nodes that run other versions than their peers.",
    ),
    "maintenance": LazyCommand(
        "cli.maintenance",
        "maintenance",
        "A maintenance window: Slurm's maintenance reservation on the nodes, resilient jobs"
        " requeued from their checkpoint before it starts.",
    ),
    "sweep": LazyCommand(
        "cli.sweep",
        "sweep",
        "Offline sweeps: the deep tier on idle nodes, a few at a time (docs/sweeps.md).",
    ),
}


class LazyGroup(click.Group):
    """A group that imports a command's module only when the command runs (or its own help
    or completion is asked for). Commands added with add_command are kept as click keeps
    them."""

    def __init__(self, *args: object, lazy: dict[str, LazyCommand], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in self.lazy:
            command = self.commands[cmd_name] = self.lazy[cmd_name].load()
        return command

    def listed(self, ctx: click.Context) -> list[tuple[str, click.Command]]:
        """Every visible command, a stand-in for those not loaded yet."""
        out = []
        for name in self.list_commands(ctx):
            command = self.commands.get(name) or self.lazy[name].stand_in(name)
            if not command.hidden:
                out.append((name, command))
        return out

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        commands = self.listed(ctx)
        if not commands:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in commands)
        rows = [(name, command.get_short_help_str(limit)) for name, command in commands]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        results = [
            CompletionItem(name, help=command.get_short_help_str())
            for name, command in self.listed(ctx)
            if name.startswith(incomplete)
        ]
        results.extend(click.Command.shell_complete(self, ctx, incomplete))
        return results


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-medic")
def medic() -> None:
    """Medic: node health and auto-remediation for Slurm GPU clusters."""


def main() -> None:
    from medic_core.text import guard_terminal

    guard_terminal()  # no escape sequence from a job's text reaches the terminal
    medic()

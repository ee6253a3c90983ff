"""`medic`: the admin CLI."""

from __future__ import annotations

import click

from cli.admin import config, events, jobs, remediation
from cli.check import check
from cli.checks import checks
from cli.ckpt import ckpt
from cli.episode import episode
from cli.lab.commands import lab
from cli.nodes import node, nodes
from cli.rma import rma_command
from cli.sbatch import sbatch


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-medic")
def medic() -> None:
    """Medic: node health and auto-remediation for Slurm GPU clusters."""


medic.add_command(lab)
medic.add_command(ckpt)
medic.add_command(checks)
for command in (nodes, node, events, jobs, remediation, episode, config, rma_command, check):
    medic.add_command(command)
medic.add_command(sbatch)
medic.add_command(__import__("cli.sweep", fromlist=["sweep"]).sweep)


def main() -> None:
    medic()

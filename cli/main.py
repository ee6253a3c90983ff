"""`medic`: the admin CLI."""

from __future__ import annotations

import click

from cli.lab.commands import lab


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-medic")
def medic() -> None:
    """Medic: node health and auto-remediation for Slurm GPU clusters."""


medic.add_command(lab)


def main() -> None:
    medic()

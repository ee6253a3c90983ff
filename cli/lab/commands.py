"""`medic lab up|status|down|inject|exec|reboot|env`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import click

from cli.lab.cluster import Lab, LabError
from cli.lab.debian_root import HOST_RELEASE, SUITES
from cli.lab.slurm_conf import LabSpec

DEFAULT_DIR = Path(os.environ.get("MEDIC_LAB_DIR", "/var/tmp/medic-lab"))

dir_option = click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    envvar="MEDIC_LAB_DIR",
    help="Directory holding the lab (config, logs, state).",
)


def _fail(exc: Exception) -> None:
    raise click.ClickException(str(exc)) from exc


@click.group()
def lab() -> None:
    """A real Slurm cluster with simulated GPUs on this machine."""


@lab.command()
@dir_option
@click.option("--nodes", default=5, show_default=True, type=click.IntRange(1, 64))
@click.option(
    "--gpus", default=8, show_default=True, type=click.IntRange(0, 16), help="GPUs per node."
)
@click.option(
    "--healthd/--no-healthd",
    default=True,
    show_default=True,
    help="Also start medic-healthd on every node, as systemd would on a real cluster.",
)
@click.option(
    "--production",
    is_flag=True,
    help="Run what an operator installs: the built wheel in a venv of its own, each"
    " medic-healthd in the shipped unit's sandbox, a store per node (docs/lab.md).",
)
@click.option(
    "--venv",
    "wheel_venv",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="With --production: a venv the wheel is installed in already (skips the build).",
)
@click.option(
    "--slurm",
    "release",
    type=click.Choice([HOST_RELEASE, *SUITES]),
    default=HOST_RELEASE,
    show_default=True,
    help="Slurm release: the host's, or a newer one run in a Debian root built once and"
    " cached (MEDIC_LAB_CACHE, default /var/cache/medic-lab).",
)
def up(
    root: Path,
    nodes: int,
    gpus: int,
    healthd: bool,
    production: bool,
    wheel_venv: Path | None,
    release: str,
) -> None:
    """Start munged, slurmctld and one slurmd per node; wait until all are IDLE."""
    lab_ = Lab(root)
    try:
        unit = None
        if production and release != HOST_RELEASE:
            raise LabError(f"--production runs on the host's Slurm only: drop --slurm {release}")
        if production:
            from cli.lab.production import UNIT, ProductionError, can_sandbox, install_wheel

            if can_sandbox():
                raise LabError(f"--production {can_sandbox()}")
            try:
                venv_bin = wheel_venv / "bin" if wheel_venv else install_wheel(lab_.root)
                lab_ = Lab(root, venv_bin=venv_bin)
            except ProductionError as exc:
                raise LabError(str(exc)) from exc
            unit = UNIT
        spec = LabSpec(nodes=nodes, gpus_per_node=gpus, slurm=release)
        state = lab_.up(spec, sandbox_unit=unit)
        if healthd:
            for name in state.spec.node_names():
                lab_.start_healthd(name)
    except LabError as exc:
        _fail(exc)
    daemons = f", medic-healthd on {nodes} nodes" if healthd else ""
    if production:
        daemons += f" (from the wheel in {lab_.venv_bin.parent}, in the unit's sandbox)"
    click.echo(
        f"lab up at {lab_.root}: Slurm {release}, {nodes} nodes x {gpus} GPUs, all IDLE in"
        f" {state.up_seconds:.1f}s{daemons}"
    )
    click.echo(f"to use it:  source {lab_.layout.env_file}   (or paste:)")
    for line in lab_.export_lines():
        click.echo(f"  {line}")


@lab.command()
@dir_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(root: Path, as_json: bool) -> None:
    """Show the lab's nodes: Slurm state, slurmd PID, simulated GPUs."""
    try:
        st = Lab(root).status()
    except LabError as exc:
        _fail(exc)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "root": str(st.root),
                    "running": st.running,
                    "nodes": [asdict(n) for n in st.nodes],
                }
            )
        )
        return
    if not st.running:
        click.echo(f"no lab running at {st.root}")
        raise SystemExit(1)
    click.echo(f"{'NODE':<6} {'STATE':<10} {'FLAGS':<22} {'GPUS':>4} {'SLURMD':>7}  REASON")
    for n in st.nodes:
        flags = ",".join(n.flags) or "-"
        click.echo(
            f"{n.name:<6} {n.state:<10} {flags:<22} {n.gpus:>4} "
            f"{n.slurmd_pid or '-':>7}  {n.reason}"
        )


@lab.command()
@dir_option
def down(root: Path) -> None:
    """Cancel jobs and stop every lab daemon by PID."""
    lab_ = Lab(root)
    try:
        lab_.down()
    except LabError as exc:
        _fail(exc)
    left = lab_.tagged_pids()
    if left:
        _fail(LabError(f"processes still running after teardown: {left}"))
    click.echo(f"lab at {lab_.root} is down")


@lab.command()
@dir_option
@click.argument("node")
@click.argument("specs", nargs=-1, required=True)
@click.option("--gpu", type=int, default=None, help="GPU index (omit for node-wide specs).")
def inject(root: Path, node: str, specs: tuple[str, ...], gpu: int | None) -> None:
    """Inject faults into a node's simulated GPUs, e.g. `inject n3 --gpu 2 xid=79`."""
    try:
        Lab(root).inject(node, gpu, list(specs))
    except (LabError, ValueError) as exc:
        _fail(exc)
    where = f"{node} gpu {gpu}" if gpu is not None else node
    click.echo(f"injected {' '.join(specs)} on {where}")


@lab.command(name="exec", context_settings={"ignore_unknown_options": True})
@dir_option
@click.argument("node")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(root: Path, node: str, argv: tuple[str, ...]) -> None:
    """Run a command as if on NODE (its NVML scenario, host tree, config)."""
    lab_ = Lab(root)
    try:
        lab_.node(node)
    except LabError as exc:
        _fail(exc)
    os.execvpe(argv[0], list(argv), lab_.process_env(node))


@lab.command()
@dir_option
@click.argument("node")
def reboot(root: Path, node: str) -> None:
    """Simulate a reboot of NODE: slurmd restarts with -b, GPUs lose transient faults."""
    try:
        pid = Lab(root).reboot_node(node)
    except LabError as exc:
        _fail(exc)
    click.echo(f"{node} rebooted (slurmd pid {pid})")


@lab.command()
@dir_option
def env(root: Path) -> None:
    """Print the exports that point a shell at the lab."""
    for line in Lab(root).export_lines():
        click.echo(line)

"""`medic ckpt`: a job's checkpoints from the shell (see slurm_hooks/checkpoint/)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from slurm_hooks.checkpoint import DIR_ENV, STALE_AFTER, CheckpointDir, CheckpointError, Progress

_dir_option = click.option(
    "--dir",
    "root",
    envvar=DIR_ENV,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Checkpoint directory (default: ${DIR_ENV}).",
)


def _open(root: Path | None) -> CheckpointDir:
    try:
        return CheckpointDir(root)
    except CheckpointError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def ckpt() -> None:
    """Atomic job checkpoints: resume from the last complete one, never a torn one."""


@ckpt.command()
@_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the checkpoint as JSON.")
@click.option("--verify", is_flag=True, help="Check every file's sha256, not only its size.")
def latest(root: Path | None, as_json: bool, verify: bool) -> None:
    """Print the newest complete checkpoint's path; exit 1 when there is none."""
    checkpoints = _open(root)
    found = checkpoints.latest(verify_hashes=verify)
    if found is None:
        click.echo(f"no complete checkpoint in {checkpoints.root}", err=True)
        raise SystemExit(1)
    click.echo(json.dumps(found.to_json()) if as_json else str(found.path))


@ckpt.command()
@_dir_option
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--step", required=True, type=click.IntRange(min=0), help="Step number.")
@click.option("--move", is_flag=True, help="Move SRC's contents instead of copying them.")
def commit(root: Path | None, src: Path, step: int, move: bool) -> None:
    """Make directory SRC checkpoint --step, atomically; print its path."""
    try:
        made = _open(root).commit(src, step, move=move)
    except CheckpointError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(made.path))


@ckpt.command()
@_dir_option
@click.option("--keep", required=True, type=click.IntRange(min=1), help="Complete ones to keep.")
@click.option(
    "--stale-after",
    type=click.FloatRange(min=0),
    default=STALE_AFTER,
    show_default=True,
    help="Seconds after which an unfinished temporary directory is abandoned.",
)
def prune(root: Path | None, keep: int, stale_after: float) -> None:
    """Remove old and torn checkpoints; the newest --keep complete ones stay. Prints each
    path removed, and each kept with why (a symlink, a file another user owns: never
    removed, also by root)."""
    try:
        done = _open(root).prune_report(keep, stale_after=stale_after)
    except CheckpointError as exc:
        raise click.ClickException(str(exc)) from None
    why: dict[Path, str | None] = {path: None for path in done.removed} | dict(done.kept)
    for path in sorted(why):
        click.echo(f"removed {path}" if why[path] is None else f"kept {path}: {why[path]}")


@ckpt.command()
@click.argument("step", type=click.IntRange(min=0, max=(1 << 63) - 1))
def progress(step: int) -> None:
    """Report the job's step STEP to this node's medic-healthd (the progress heartbeat).

    For shell jobs: a process per call (milliseconds); Python jobs call
    slurm_hooks.checkpoint.progress(step) instead (well under a microsecond). Outside a
    Slurm job, or without the node's heartbeat directory, it says why and exits 0."""
    beat = Progress()
    if not beat.active:
        click.echo(f"medic ckpt progress: not reported ({beat.why})", err=True)
        return
    beat.step(step)
    beat.close()

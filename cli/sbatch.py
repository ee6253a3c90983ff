"""`medic sbatch --resilient[=N] SBATCH_ARGS...`: submit a resilient job without the SPANK
plugin. Runs the real sbatch with --requeue and the comment tag `medic:resilient=N`, which
is what the plugin and cli_filter.lua do (docs/resilient-jobs.md)."""

from __future__ import annotations

import shutil

import click

from medic_core import proc
from medic_core.resilient import DEFAULT_RESTARTS, MAX_RESTARTS, check_restarts, tag

SBATCH_TIMEOUT = 120.0


class UsageError(click.UsageError):
    pass


def _take_resilient(args: list[str]) -> tuple[int | None, list[str]]:
    """Leading `--resilient` / `--resilient=N` words (getopt style: a value only after `=`,
    so `--resilient job.sh` is a bare flag then the script), and the rest for sbatch."""
    restarts: int | None = None
    rest = list(args)
    while rest and (rest[0] == "--resilient" or rest[0].startswith("--resilient=")):
        word = rest.pop(0)
        value = word.partition("=")[2] if "=" in word else str(DEFAULT_RESTARTS)
        if not value.isdigit() or int(value) > MAX_RESTARTS:
            raise UsageError(f"{word}: expected a number of restarts from 0 to {MAX_RESTARTS}")
        restarts = check_restarts(int(value))
    return restarts, rest


def sbatch_argv(restarts: int | None, args: list[str], sbatch: str = "sbatch") -> list[str]:
    """The real sbatch's argv: the user's arguments with --requeue and the tag added; a
    `--comment` of the user's is kept with the tag appended."""
    if restarts is None:
        return [sbatch, *args]
    if "--no-requeue" in args:
        raise UsageError("--resilient needs a requeueable job: drop --no-requeue")
    out = list(args)
    for i, word in enumerate(out):
        if word.startswith("--comment="):
            out[i] = f"--comment={tag(word.partition('=')[2], restarts)}"
            return [sbatch, "--requeue", *out]
        if word == "--comment" and i + 1 < len(out):
            out[i + 1] = tag(out[i + 1], restarts)
            return [sbatch, "--requeue", *out]
    return [sbatch, "--requeue", f"--comment={tag(None, restarts)}", *out]


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sbatch(args: tuple[str, ...]) -> None:
    """Run sbatch; a leading --resilient[=N] makes the job requeueable and tags it
    medic:resilient=N (N automatic restarts, default 3). Everything else goes to sbatch."""
    if list(args[:1]) in (["-h"], ["--help"]):
        click.echo(click.get_current_context().get_help())
        return
    restarts, rest = _take_resilient(list(args))
    if any(w in ("--wait", "-W") or w.startswith("--wait=") for w in rest):
        raise UsageError("--wait is not supported here: poll `squeue -j JOBID` instead")
    binary = shutil.which("sbatch")
    if binary is None:
        raise click.ClickException("sbatch not found on PATH: install slurm-client")
    result = proc.run(sbatch_argv(restarts, rest, binary), timeout=SBATCH_TIMEOUT)
    click.echo(result.stdout, nl=False)
    click.echo(result.stderr, nl=False, err=True)
    if result.start_error or result.timed_out:
        raise click.ClickException(f"sbatch {result.describe_failure()}")
    raise SystemExit(result.returncode)

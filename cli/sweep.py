"""`medic sweep`: offline deep-tier sweeps of idle nodes (remediation.sweep, docs/sweeps.md).

`run` is what the shipped timer and cron.d file start; `status` shows the running or last
sweep; `probe` is what a sweep runs on each node under srun (not for people).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.admin import (
    EXIT_USAGE,
    AdminError,
    config_option,
    json_option,
    load,
    opened_store,
    slurm_client,
    store_option,
)
from medic_core.config import ConfigError, MedicConfig, load_config
from medic_core.settings import SweepSettings
from medic_core.slurm import SlurmError

# remediation.sweep and the store (SQLAlchemy) load inside the commands that use them: not
# for `medic sweep --help`, nor for `medic sweep probe` on every node of a sweep.
if TYPE_CHECKING:
    from remediation.sweep import Progress, SweepNode

EXIT_BUSY = 75  # EX_TEMPFAIL: another sweep runs; cron and the timer simply try next time


def _settings(config: MedicConfig) -> SweepSettings:
    try:
        return SweepSettings.from_config(config)
    except ConfigError as exc:
        raise AdminError(
            "the configuration has a bad [sweep] table", str(exc), "fix it", EXIT_USAGE
        ) from exc


@click.group("sweep")
def sweep() -> None:
    """Offline sweeps: the deep tier on idle nodes, a few at a time (docs/sweeps.md)."""


class _Reporter:
    """A progress bar on a terminal; one line per finished node otherwise (cron, journald)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty() and not quiet
        self.bar: Any = None

    def __call__(self, step: Progress) -> None:
        from remediation.sweep import FINAL

        if self.quiet:
            return
        if self.tty:
            if self.bar is None and step.total:
                self.bar = click.progressbar(
                    length=step.total, label="sweep", file=sys.stderr, show_pos=True
                )
                self.bar.__enter__()
            if self.bar is not None:
                self.bar.label = f"sweep {step.node}: {step.state}"
                if step.state in FINAL:
                    self.bar.update(1)
                else:
                    self.bar.render_progress()
            return
        if step.state in FINAL or step.state == "held":
            click.echo(f"medic sweep: {step.node}: {step.state}: {step.message}", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


@sweep.command("run")
@config_option
@click.option("--partition", "-p", metavar="P", help="Sweep only nodes of this partition.")
@click.option(
    "--share",
    type=click.FloatRange(0, 1),
    help="Most of each partition held at once (default: [sweep] share, 0.05).",
)
@click.option("--dry-run", is_flag=True, help="Show the plan (risk order, caps); take nothing.")
@click.option(
    "--pairs",
    is_flag=True,
    help="Pair tests: NCCL all-reduce and IB bandwidth per pair of nodes; name the bad node.",
)
@json_option
def run(
    config_path: Path | None,
    partition: str | None,
    share: float | None,
    dry_run: bool,
    pairs: bool,
    as_json: bool,
) -> None:
    """Deep-check idle nodes, riskiest first, holding at most --share of each partition;
    resumes a sweep that was interrupted. Exit 75 when another sweep is running."""
    if pairs:
        _run_pairs(config_path, partition, share, dry_run, as_json)
        return
    from medic_core.store import StoreError, open_configured_store
    from remediation.sweep import SweepBusy, Sweeper, SweepSlurm

    config = load(config_path)
    settings = _settings(config)
    try:
        slurm = slurm_client(config)
        store = open_configured_store(config)
    except (SlurmError, ConfigError, StoreError) as exc:
        raise AdminError("cannot start the sweep", str(exc), "check [slurm] and [store]") from exc
    client = SweepSlurm(env=slurm.env, timeout=settings.slurm_timeout, bin_dirs=slurm.bin_dirs)
    reporter = _Reporter(quiet=as_json)
    try:
        with store:
            report = Sweeper(config, store, client, settings, reporter).run(
                partition, share, dry_run
            )
    except SweepBusy as exc:
        raise AdminError("another sweep is running", str(exc), "", EXIT_BUSY) from exc
    except SlurmError as exc:
        raise AdminError(
            "the sweep stopped", str(exc), "fix Slurm and run again: it resumes"
        ) from exc
    finally:
        reporter.close()
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        return
    if dry_run:
        click.echo(f"plan: {report.message}; caps per partition: {dict(report.caps)}")
        for position, (candidate, risk) in enumerate(report.plan, 1):
            click.echo(
                f"{position:3d}  {candidate.node:<16} risk {risk.score:6.1f}  "
                f"{'; '.join(risk.reasons)}"
            )
        return
    verb = "resumed and finished" if report.resumed else "finished"
    click.echo(f"sweep {report.sweep_id} {verb} in {report.seconds:.1f}s: {report.message}")
    _table(report.nodes)


def _run_pairs(
    config_path: Path | None,
    partition: str | None,
    share: float | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    from medic_core.pair_settings import PairSettings
    from medic_core.store import StoreError, open_configured_store
    from remediation.sweep import SweepBusy
    from remediation.sweep.pair_jobs import PairSlurm
    from remediation.sweep.pair_runner import PairSweeper

    config = load(config_path)
    settings = _settings(config)
    try:
        pair_settings = PairSettings.from_config(config)
        slurm = slurm_client(config)
        store = open_configured_store(config)
    except (SlurmError, ConfigError, StoreError) as exc:
        raise AdminError(
            "cannot start the pair sweep", str(exc), "check [sweep.pairs], [slurm] and [store]"
        ) from exc
    client = PairSlurm(env=slurm.env, timeout=settings.slurm_timeout, bin_dirs=slurm.bin_dirs)
    reporter = _Reporter(quiet=as_json)
    try:
        with store:
            report = PairSweeper(config, store, client, settings, pair_settings, reporter).run(
                partition, share, dry_run
            )
    except SweepBusy as exc:
        raise AdminError("another sweep is running", str(exc), "", EXIT_BUSY) from exc
    except SlurmError as exc:
        raise AdminError("the pair sweep stopped", str(exc), "fix Slurm and run again") from exc
    finally:
        reporter.close()
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        return
    click.echo(
        f"pair sweep in {report.seconds:.1f}s over {len(report.nodes)} nodes: {report.message}"
    )
    for r in report.results:
        click.echo(f"  round {r.round}  {r.a}+{r.b:<12} {r.outcome:<12} {r.why}")
    for node, what in report.handed.items():
        click.echo(f"  {node}: named bad; {what}")


def _table(nodes: tuple[SweepNode, ...] | list[SweepNode]) -> None:
    for n in nodes:
        seconds = f"{n.seconds:.1f}s" if n.seconds is not None else "-"
        episode = f" episode {n.episode_id}" if n.episode_id else ""
        click.echo(
            f"  {n.node:<16} {n.state:<9} {n.status or '-':<12} {seconds:>8}  {n.message}{episode}"
        )


@sweep.command("status")
@config_option
@store_option
@json_option
def status(config_path: Path | None, store_url: str | None, as_json: bool) -> None:
    """The running sweep, else the last one: each node's state and verdict."""
    from remediation.sweep import SweepStore

    config = load(config_path)
    with opened_store(config, store_url) as store:
        rows = SweepStore(store)
        current = rows.active() or rows.latest()
        nodes = rows.nodes(current.id) if current else []
    if as_json:
        doc = None
        if current is not None:
            doc = {
                "sweep": current.id,
                "state": current.state,
                "partition": current.partition,
                "share": current.share,
                "host": current.host,
                "pid": current.pid,
                "started_at": current.started_at.isoformat(),
                "finished_at": current.finished_at.isoformat() if current.finished_at else None,
                "message": current.message,
                "nodes": [n.to_json() for n in nodes],
            }
        click.echo(json.dumps(doc, indent=2))
        return
    if current is None:
        click.echo("no sweep has run")
        return
    when = current.finished_at or current.started_at
    click.echo(
        f"sweep {current.id}: {current.state} (pid {current.pid} on {current.host}), "
        f"share {current.share:g}, {'finished' if current.finished_at else 'started'} "
        f"{when.isoformat(timespec='seconds')}"
        + (f": {current.message}" if current.message else "")
    )
    _table(nodes)


@sweep.command("probe", hidden=True)
@click.option("--check", "checks", multiple=True, help="A deep check to run (default: all).")
@click.option("--timeout", type=float, default=3600.0, show_default=True)
def probe_command(checks: tuple[str, ...], timeout: float) -> None:
    """Run the deep tier on this node and print one JSON report (run by `sweep run`)."""
    try:
        config = load_config()
    except ConfigError as exc:
        click.echo(f"medic sweep probe: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from exc
    from healthd.inline import deep_probe

    click.echo(json.dumps(deep_probe(config, checks, timeout)))


@sweep.command("pair-probe", hidden=True)
@click.option("--test", "tests", multiple=True, help="A pair test to run (default: all).")
@click.option("--nodes", required=True, help="The pair, first node first (the IB server).")
def pair_probe_command(tests: tuple[str, ...], nodes: str) -> None:
    """One node's side of a pair test; prints one JSON line (run by `sweep run --pairs`)."""
    try:
        config = load_config()
        from cli.sweep_pairs import pair_probe

        doc = pair_probe(config, tests, [n for n in nodes.split(",") if n])
    except ConfigError as exc:
        click.echo(f"medic sweep pair-probe: {exc}", err=True)
        raise SystemExit(EXIT_USAGE) from exc
    click.echo(json.dumps(doc))

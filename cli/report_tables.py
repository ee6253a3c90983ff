"""`medic report`'s tables: the interruptions of resilient jobs with their MTTR by component,
and the fleet's reliability (MTBF, per-node figures, RMA, false ejections), as text."""

from __future__ import annotations

import click

from cli.common import echo_table, when
from remediation import report as rp

duration = rp.format_duration  # one format for the tables and the HTML page


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def print_report(report: rp.Report, top: int) -> None:
    click.echo(f"medic report {when(report.since)} .. {when(report.until)}")
    click.echo("")
    if not report.jobs:
        click.echo("no resilient job was interrupted in this window")
    else:
        click.echo("Interruptions of resilient jobs")
        rows = []
        for job in report.jobs:
            for i in job.interruptions:
                rows.append(
                    [
                        job.job_id,
                        when(i.known_at),
                        i.node,
                        i.fault_class or "-",
                        "unknown" if i.detection_s is None else duration(i.detection_s),
                        duration(i.isolation_s),
                        duration(i.scheduling_s),
                        duration(i.restart_s),
                        "-" if i.reload_s is None else f"{duration(i.reload_s)} {i.resumed_tier}",
                        duration(i.wall_s) + ("*" if i.clock_skew else ""),
                        duration(i.lost_work_s),
                        _outcome(i),
                    ]
                )
        echo_table(
            (
                "JOB",
                "KNOWN",
                "NODE",
                "FAULT",
                "DETECT",
                "ISOLATE",
                "SCHEDULE",
                "RESTART",
                "RELOAD",
                "WALL",
                "LOST",
                "OUTCOME",
            ),
            rows,
        )
        if any(i.clock_skew for j in report.jobs for i in j.interruptions):
            click.echo("* a later record was earlier than the one before it (clock skew)")
        every = [i for j in report.jobs for i in j.interruptions]
        undated = sum(1 for i in every if i.detection_s is None)
        if undated:
            click.echo(
                f"detection unknown for {undated} of {len(every)} interruptions (no sensor"
                " time for the fault): their WALL starts when Medic knew"
            )
        click.echo("")
        click.echo("Jobs")
        echo_table(
            ("JOB", "WALL", "DOWN", "LOST", "CHECKPOINTS", "INTERRUPTIONS", "ETTR"),
            [
                [
                    j.job_id,
                    duration(j.wall_s),
                    duration(j.down_s),
                    duration(j.lost_work_s),
                    f"{j.checkpoints} ({duration(j.checkpoint_s)})" if j.checkpoints else "-",
                    str(len(j.interruptions)),
                    ("<=" if j.ettr_is_upper_bound and j.ettr is not None else "") + pct(j.ettr),
                ]
                for j in report.jobs
            ],
        )
        click.echo("")
        click.echo(f"MTTR (recovered interruptions): {duration(report.mttr_s)}")
        echo_table(
            ("COMPONENT", "COUNT", "TOTAL", "MEAN", "P50", "P90"),
            [
                [
                    name,
                    str(s.count),
                    duration(s.total_s),
                    duration(s.mean_s),
                    duration(s.p50_s),
                    duration(s.p90_s),
                ]
                for name, s in report.components.items()
            ],
        )
    click.echo("")
    _print_fleet(report.fleet, top)
    click.echo("")
    click.echo("What this report cannot know yet:")
    for line in report.cannot_know:
        click.echo(f"  - {line}")


def _outcome(i: rp.Interruption) -> str:
    text = (
        "running again"
        if i.recovered
        else ("not running again" if i.outcome == rp.REQUEUED else f"not requeued: {i.outcome}")
    )
    if i.also:
        text += f" (also {', '.join(i.also)})"
    return text


def _print_fleet(fleet: rp.FleetReport, top: int) -> None:
    click.echo(
        f"Fleet: {fleet.nodes} nodes, {fleet.gpus} GPUs, {fleet.node_hours:,.0f} node-hours;"
        f" {fleet.episodes} episodes, {fleet.interruptions} job interruptions"
    )
    click.echo(
        f"MTBF: {_hours(fleet.mtbf_node_hours)} node-hours, {_hours(fleet.mtbf_gpu_hours)}"
        f" GPU-hours per episode ({fleet.failure_rate_per_node_hour * 100:.4f}% per node-hour)"
    )
    click.echo(
        f"Out of service: {duration(fleet.out_of_service_s)} node-time in all,"
        f" {duration(fleet.rma_s)} of it in RMA; {len(fleet.false_ejections)} false ejections"
    )
    if fleet.by_class:
        click.echo("")
        echo_table(
            ("FAULT", "EPISODES", "INTERRUPTIONS", "NODES"),
            [
                [c.fault_class or "-", str(c.episodes), str(c.interruptions), str(c.nodes)]
                for c in fleet.by_class
            ],
        )
    if fleet.by_node:
        click.echo("")
        shown = fleet.by_node[:top]
        echo_table(
            ("NODE", "EPISODES", "INTERRUPTIONS", "JOBS", "OUT", "RMA", "LEMON"),
            [
                [
                    n.node,
                    str(n.episodes),
                    str(n.interruptions),
                    str(n.jobs_touched),
                    duration(n.out_of_service_s),
                    duration(n.rma_s),
                    "yes" if n.lemon else "",
                ]
                for n in shown
            ],
        )
        if len(fleet.by_node) > top:
            click.echo(f"({top} of {len(fleet.by_node)} nodes; --top for more)")
    if fleet.lemons:
        jobs = sum(n.jobs_touched for n in fleet.lemons)
        click.echo(f"Lemons: {len(fleet.lemons)} nodes, {jobs} jobs touched")
    if fleet.rungs:
        click.echo("")
        echo_table(
            ("RUNG", "ACTION", "ATTEMPTS", "WORKED", "NOT REPAIRED", "FAILED", "OPEN", "P50",
             "P90"),
            [
                [
                    str(r.rung),
                    r.action,
                    str(r.attempts),
                    str(r.worked),
                    str(r.not_repaired),
                    str(r.failed),
                    str(r.pending),
                    duration(r.p50_s),
                    duration(r.p90_s),
                ]
                for r in fleet.rungs
            ],
        )  # fmt: skip
        click.echo(
            "WORKED: re-qualification passed after it; NOT REPAIRED: done, but the ladder went"
            " on; FAILED: the step itself failed; OPEN: not verified yet. P50/P90: from the"
            " intent to the step's end (a reboot's: to its new boot being seen)"
        )
    if fleet.waiting_for_human:
        click.echo("")
        echo_table(
            ("EPISODE", "NODE", "FAULT", "OPENED", "STATE"),
            [
                [
                    str(w.episode_id),
                    w.node,
                    w.fault_class or "-",
                    when(w.opened_at),
                    f"waiting for a human since {when(w.waiting_since)}",
                ]
                for w in fleet.waiting_for_human[:top]
            ],
        )
    if fleet.false_ejections:
        click.echo("")
        echo_table(
            ("FALSE EJECTION", "NODE", "FAULT", "OPENED", "OUT"),
            [
                [
                    f"episode {f.episode_id}",
                    f.node,
                    f.fault_class,
                    when(f.opened_at),
                    duration(f.out_s),
                ]
                for f in fleet.false_ejections[:top]
            ],
        )


def every(hours: float | None) -> str:
    return "never" if hours is None else duration(hours * 3600)


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"

"""`medic report`: where the time of resilient jobs went, and the fleet's reliability, over a
window; `medic report what-if`: the expected cost of failures for a training run.

The arithmetic is remediation/report.py (pure) and remediation/whatif.py; the rows come from
remediation/report_store.py. Docs: docs/operator-guide.md, "medic report".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from cli.admin import (
    EXIT_USAGE,
    AdminError,
    config_option,
    echo_json,
    echo_table,
    load,
    now_utc,
    opened_store,
    parse_since,
    store_option,
    when,
)
from cli.report_whatif import (
    MEASURED,
    measured_mttr,
    measured_rate,
    parse_hours,
    parse_rate,
    parse_reloads,
)
from remediation import report as rp
from remediation import whatif as wi

REPORT_FORMAT = 1


def _time(option: str, text: str, now: dt.datetime) -> dt.datetime:
    try:
        return parse_since(text, now)
    except click.BadParameter as exc:
        raise AdminError(f"{option} {exc.message}", code=EXIT_USAGE) from None


duration = rp.format_duration  # one format for the tables and the HTML page


def _plain(value: Any) -> Any:
    """Dataclasses, datetimes and tuples as JSON values (the common cases first: a fleet's
    report is 200,000 values)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):  # milliseconds for durations; rates keep 6 digits
        return round(value, 3) if abs(value) >= 1 else float(f"{value:.6g}")
    if isinstance(value, dt.datetime):
        precision = "microseconds" if value.microsecond else "seconds"
        return value.astimezone(dt.UTC).isoformat(timespec=precision).replace("+00:00", "Z")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _plain(v) for name, v in vars(value).items()}
    raise TypeError(f"{type(value).__name__} is not a report value")


def report_json(report: rp.Report, top: int | None) -> dict[str, Any]:
    body = _plain(report)
    assert isinstance(body, dict)
    fleet = body["fleet"]
    if top is not None:
        fleet["by_node_total"] = len(fleet["by_node"])
        fleet["by_node"] = fleet["by_node"][:top]
    return {"format": REPORT_FORMAT, **body}


def report_text(report: rp.Report, top: int | None, would: Sequence[Any] = ()) -> str:
    """The JSON on one line: json's C encoder writes no indentation, and a fleet's report
    runs to megabytes (4 MB for 6,000 interruptions: 0.4 s, against 1.9 s indented)."""
    body = {**report_json(report, top), "would_have_done": _plain(list(would))}
    return json.dumps(body, separators=(",", ":"))


# -- the table -----------------------------------------------------------------------------


def _pct(value: float | None) -> str:
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
                    ("<=" if j.ettr_is_upper_bound and j.ettr is not None else "") + _pct(j.ettr),
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


def _every(hours: float | None) -> str:
    return "never" if hours is None else duration(hours * 3600)


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


# -- reading -------------------------------------------------------------------------------


def gather(
    store: Any,
    since: dt.datetime,
    until: dt.datetime,
    *,
    fleet_nodes: int | None,
    gpus_per_node: int,
    lemon: rp.LemonRule,
    checkpoints: Sequence[rp.CheckpointMark] = (),
    job_ids: Sequence[str] = (),
) -> rp.ReportInput:
    from remediation import report_store as rs

    scan = rs.scan_whole_table(store, since, until)
    actions = rs.job_actions(store, since, until, scan=scan)
    if job_ids:
        actions = [a for a in actions if a.job_id in job_ids]
    interrupted = rs.interrupted_job_ids(actions)
    starts, ends = rs.job_records(store, interrupted, since, until, scan=scan)
    wanted = set(interrupted)
    nodes = {a.node for a in actions if a.job_id in wanted}
    episodes, steps = rs.episodes_and_steps(store, since, until)
    return rp.ReportInput(
        since=since,
        until=until,
        fleet_nodes=rs.fleet_nodes(store) if fleet_nodes is None else fleet_nodes,
        gpus_per_node=gpus_per_node,
        faults=rs.faults(store, nodes, since, until),
        actions=actions,
        starts=starts,
        ends=ends,
        checkpoints=checkpoints,
        episodes=episodes,
        steps=steps,
        tickets=rs.tickets(store, since, until),
        lemon=lemon,
    )


def checkpoint_marks(pairs: Sequence[str]) -> list[rp.CheckpointMark]:
    """JOB=DIR: the job's checkpoint directory, read for its commits and resume marks: its
    ledger (which `prune` never deletes), plus what manifests and mark files it lacks."""
    from slurm_hooks.checkpoint import CheckpointDir, CheckpointError

    marks: list[rp.CheckpointMark] = []
    for pair in pairs:
        job_id, sep, root = pair.partition("=")
        if not sep or not job_id or not root:
            raise AdminError(f"--checkpoints {pair!r}: expected JOB=DIR", code=EXIT_USAGE)
        try:
            directory = CheckpointDir(Path(root))
        except CheckpointError as exc:
            raise AdminError(f"--checkpoints {pair!r}: {exc}", code=EXIT_USAGE) from None
        commits, resumes = directory.history()
        for c in commits:
            at = dt.datetime.fromtimestamp(c.time, dt.UTC)
            marks.append(
                rp.CheckpointMark(job_id, at, "commit", c.step, c.restart_count, c.duration)
            )
        for r in resumes:
            at = dt.datetime.fromtimestamp(r.time, dt.UTC)
            mark = rp.CheckpointMark(job_id, at, "resume", r.step, r.restart_count, None, r.tier)
            marks.append(dataclasses.replace(mark, reload_s=r.reload_s))
    return marks


def measured(params: Mapping[str, Any]) -> rp.Report:
    """The report over the window and store the `medic report` options name."""
    now = now_utc()
    since = _time("--since", params["since_text"], now)
    until = _time("--until", params["until_text"], now) if params["until_text"] else now
    if until <= since:
        raise AdminError(
            f"--since {when(since)} is not before --until {when(until)}", code=EXIT_USAGE
        )
    for job in params["job_ids"]:
        if not _JOB.match(job):
            raise AdminError(
                f"--job {job!r}: expected a Slurm job id (1234 or 1234_5)", code=EXIT_USAGE
            )
    marks = checkpoint_marks(params["checkpoint_dirs"])
    config = load(params["config_path"])
    from medic_core.config import ConfigError
    from medic_core.settings import RemediationSettings

    try:
        settings = RemediationSettings.from_config(config)
    except ConfigError as exc:
        raise AdminError(
            "the configuration has a bad [remediation] table", str(exc), "fix it", EXIT_USAGE
        ) from exc
    lemon = rp.LemonRule(
        settings.lemon_episodes, settings.lemon_days, settings.lemon_failed_requalifications
    )
    with opened_store(config, params["store_url"]) as store:
        data = gather(
            store,
            since,
            until,
            fleet_nodes=params["fleet_nodes"],
            gpus_per_node=params["gpus_per_node"],
            lemon=lemon,
            checkpoints=marks,
            job_ids=params["job_ids"],
        )
    return rp.build_report(data)


_JOB = re.compile(r"^\d+(_\d+)?$")


@click.group("report", invoke_without_command=True)
@click.option(
    "--since",
    "since_text",
    default="7d",
    show_default=True,
    help="Start of the window: a duration back from now (30m, 12h, 7d, 2w) or an ISO time.",
)
@click.option("--until", "until_text", default=None, help="End of the window (default: now).")
@click.option("--job", "job_ids", multiple=True, help="Only this job (repeatable).")
@click.option(
    "--checkpoints",
    "checkpoint_dirs",
    multiple=True,
    metavar="JOB=DIR",
    help="A job's checkpoint directory, for restart and lost work (repeatable).",
)
@click.option(
    "--nodes",
    "fleet_nodes",
    type=click.IntRange(min=1),
    default=None,
    help="Fleet size for MTBF (default: the nodes the store knows).",
)
@click.option("--gpus-per-node", type=click.IntRange(min=0), default=8, show_default=True)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Nodes in the per-node table and in the JSON's by_node (by_node_total: how many).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the report as one self-contained HTML page with plots.",
)
@store_option
@config_option
@click.pass_context
def report(
    ctx: click.Context,
    since_text: str,
    until_text: str | None,
    job_ids: tuple[str, ...],
    checkpoint_dirs: tuple[str, ...],
    fleet_nodes: int | None,
    gpus_per_node: int,
    top: int,
    as_json: bool,
    html_path: Path | None,
    store_url: str | None,
    config_path: Path | None,
) -> None:
    """Where resilient jobs' time went (MTTR by component, ETTR) and the fleet's reliability."""
    if ctx.invoked_subcommand is not None:
        return
    from cli.report_observed import print_sections, would_in  # (not for --help: ~0.1 s)

    result = measured(ctx.params)
    would = would_in(ctx.params, result.since, result.until)  # observe-only mode's decisions
    if html_path is not None:
        from cli.report_html import page

        try:
            html_path.write_text(page(result), encoding="utf-8")
        except OSError as exc:
            raise AdminError(f"--html {html_path}: {exc.strerror or exc}") from None
    if as_json:
        click.echo(report_text(result, top, would))
    else:
        print_report(result, top)
        print_sections(ctx.params, result, would, top)  # observe-only's, post-job hygiene


# -- what-if -------------------------------------------------------------------------------


@report.command("what-if")
@click.option("--nodes", type=click.IntRange(min=1), required=True, help="Nodes the job uses.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--failure-rate",
    "rate_text",
    required=True,
    help="Interruptions per node-hour: 0.0005, 0.05%, or 'measured' (from the store over"
    " medic report's --since/--until).",
)
@click.option(
    "--mttr",
    "mttr_texts",
    multiple=True,
    required=True,
    help="Downtime per interruption (40m, 4.5h, or 'measured': medic report's MTTR plus"
    " its mean lost work); repeat to compare.",
)
@click.option(
    "--gpu-hours",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Work of the run in GPU-hours (or --days).",
)
@click.option(
    "--days",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Failure-free length of the run in days (or --gpu-hours).",
)
@click.option(
    "--checkpoint-every",
    "interval_text",
    default=None,
    help="Checkpoint interval (30m); adds the work lost since the last checkpoint.",
)
@click.option(
    "--checkpoint-cost",
    "cost_text",
    default="0s",
    show_default=True,
    help="Time one checkpoint stalls training (20s).",
)
@click.option(
    "--price",
    type=click.FloatRange(min=0),
    default=None,
    help="Cost of one GPU-hour, for the cost columns.",
)
@click.option(
    "--reload",
    "reload_texts",
    multiple=True,
    help="Checkpoint reload time per tier, TIER=DURATION (durable=25m, local=20s): --mttr"
    " is then the downtime before the reload.",
)
@click.option(
    "--local-share",
    type=float,
    default=None,
    help="With --reload local=...: share (0-1) of interruptions that reload locally.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def what_if(
    nodes: int,
    gpus_per_node: int,
    rate_text: str,
    mttr_texts: tuple[str, ...],
    gpu_hours: float | None,
    days: float | None,
    interval_text: str | None,
    cost_text: str,
    price: float | None,
    reload_texts: tuple[str, ...],
    local_share: float | None,
    as_json: bool,
) -> None:
    """Expected interruptions, lost days and cost of a training run, for each --mttr (and
    each reload tier mix, with --reload)."""
    reloads = parse_reloads(reload_texts, local_share)
    if (gpu_hours is None) == (days is None):
        raise AdminError(
            "give the run's length: --gpu-hours or --days (one of them)", code=EXIT_USAGE
        )
    found = None
    if rate_text == MEASURED or MEASURED in mttr_texts:
        parent = click.get_current_context().parent
        assert parent is not None
        found = measured(parent.params)
    rate = measured_rate(found) if rate_text == MEASURED and found else parse_rate(rate_text)
    work_hours = days * 24 if days is not None else (gpu_hours or 0.0) / (nodes * gpus_per_node)
    interval = parse_hours("--checkpoint-every", interval_text) if interval_text else None
    stall = parse_hours("--checkpoint-cost", cost_text, "s")
    outcomes, labels = [], []
    for text in mttr_texts:
        mttr = measured_mttr(found) if text == MEASURED and found else parse_hours("--mttr", text)
        for label, hours in reloads.rows(mttr) if reloads else [("", mttr)]:
            labels.append(label)
            scenario = wi.Scenario(
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                failure_rate=rate,
                work_hours=work_hours,
                mttr_hours=hours,
                checkpoint_interval_hours=interval,
                checkpoint_cost_hours=stall,
                price_per_gpu_hour=price,
            )
            try:
                outcomes.append(wi.expect(scenario))
            except ValueError as exc:
                raise AdminError(str(exc), code=EXIT_USAGE) from None
    savings = [wi.saving(outcomes[0], o) for o in outcomes[1:]]
    if as_json:
        echo_json(
            {
                "format": REPORT_FORMAT,
                "what_if": [
                    _plain(o) | {"reload": label or None}
                    for o, label in zip(outcomes, labels, strict=True)
                ],
                "savings": [
                    {k: _plain(v) for k, v in vars(s).items() if k not in ("base", "better")}
                    | {
                        "from_mttr_hours": s.base.scenario.mttr_hours,
                        "to_mttr_hours": s.better.scenario.mttr_hours,
                    }
                    for s in savings
                ],
            }
        )
        return
    first = outcomes[0].scenario
    click.echo(
        f"{first.nodes} nodes x {first.gpus_per_node} GPUs, {first.failure_rate * 100:.4g}%"
        f" interruptions per node-hour: one every {_every(outcomes[0].mtbf_hours)} of running;"
        f" {first.work_hours / 24:,.1f} days of failure-free work"
    )
    rows = []
    for o, label in zip(outcomes, labels, strict=True):
        row = [label] * bool(reloads) + [
            duration(o.scenario.mttr_hours * 3600),
            f"{o.interruptions:,.1f}",
            f"{o.wall_hours / 24:,.1f}",
            f"{o.lost_hours / 24:,.1f}",
            _pct(o.ettr),
        ]
        if o.cost is not None and o.lost_cost is not None:
            row += [f"{o.cost:,.0f}", f"{o.lost_cost:,.0f}"]
        rows.append(row)
    headers = ["RELOAD"] * bool(reloads) + ["MTTR", "INTERRUPTIONS", "WALL DAYS", "LOST DAYS"]
    headers += ["ETTR"]
    if price is not None:
        headers += ["COST", "LOST COST"]
    echo_table(headers, rows)
    for s in savings:
        lost = "" if s.lost_share is None else f", {_pct(abs(s.lost_share))} of its lost time"
        cost = "" if s.cost is None else f", {s.cost:,.0f} in GPU cost"
        click.echo(
            f"MTTR {duration(s.base.scenario.mttr_hours * 3600)} ->"
            f" {duration(s.better.scenario.mttr_hours * 3600)}:"
            f" {'saves' if s.wall_hours >= 0 else 'costs'} {abs(s.wall_hours) / 24:,.2f} wall"
            f" days ({_pct(abs(s.wall_share))} of the run's wall time{lost}),"
            f" {abs(s.gpu_hours):,.0f} GPU-hours{cost}"
        )
    if outcomes[0].optimal_interval_hours is not None:
        click.echo(
            "Young's optimal checkpoint interval for this cost:"
            f" {duration(outcomes[0].optimal_interval_hours * 3600)}"
        )

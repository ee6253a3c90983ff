"""`medic report`: where the time of resilient jobs went, and the fleet's reliability, over a
window; `medic report what-if`: the expected cost of failures for a training run. The click
commands: the report is gathered in cli/report_gather.py, printed by cli/report_tables.py
or cli/report_json.py.

The arithmetic is remediation/report (pure) and remediation/whatif.py; the rows come from
remediation/report_store.py. Docs: docs/operator-guide.md, "medic report".
"""

from __future__ import annotations

from pathlib import Path

import click

from cli.common import (
    EXIT_USAGE,
    AdminError,
    config_option,
    echo_json,
    echo_table,
    store_option,
)


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
    # Imported here, not for `--help` or `what-if` (the store, the report's model: ~0.15 s).
    from cli.report_gather import measured
    from cli.report_json import report_text
    from cli.report_observed import print_sections, would_in
    from cli.report_tables import print_report

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
    from cli.report_json import REPORT_FORMAT, plain
    from cli.report_tables import duration, every, pct
    from cli.report_whatif import (
        MEASURED,
        measured_mttr,
        measured_rate,
        parse_hours,
        parse_rate,
        parse_reloads,
    )
    from remediation import whatif as wi

    reloads = parse_reloads(reload_texts, local_share)
    if (gpu_hours is None) == (days is None):
        raise AdminError(
            "give the run's length: --gpu-hours or --days (one of them)", code=EXIT_USAGE
        )
    found = None
    if rate_text == MEASURED or MEASURED in mttr_texts:
        from cli.report_gather import measured  # the store: only for 'measured'

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
                    plain(o) | {"reload": label or None}
                    for o, label in zip(outcomes, labels, strict=True)
                ],
                "savings": [
                    {k: plain(v) for k, v in vars(s).items() if k not in ("base", "better")}
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
        f" interruptions per node-hour: one every {every(outcomes[0].mtbf_hours)} of running;"
        f" {first.work_hours / 24:,.1f} days of failure-free work"
    )
    rows = []
    for o, label in zip(outcomes, labels, strict=True):
        row = [label] * bool(reloads) + [
            duration(o.scenario.mttr_hours * 3600),
            f"{o.interruptions:,.1f}",
            f"{o.wall_hours / 24:,.1f}",
            f"{o.lost_hours / 24:,.1f}",
            pct(o.ettr),
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
        lost = "" if s.lost_share is None else f", {pct(abs(s.lost_share))} of its lost time"
        cost = "" if s.cost is None else f", {s.cost:,.0f} in GPU cost"
        click.echo(
            f"MTTR {duration(s.base.scenario.mttr_hours * 3600)} ->"
            f" {duration(s.better.scenario.mttr_hours * 3600)}:"
            f" {'saves' if s.wall_hours >= 0 else 'costs'} {abs(s.wall_hours) / 24:,.2f} wall"
            f" days ({pct(abs(s.wall_share))} of the run's wall time{lost}),"
            f" {abs(s.gpu_hours):,.0f} GPU-hours{cost}"
        )
    if outcomes[0].optimal_interval_hours is not None:
        click.echo(
            "Young's optimal checkpoint interval for this cost:"
            f" {duration(outcomes[0].optimal_interval_hours * 3600)}"
        )

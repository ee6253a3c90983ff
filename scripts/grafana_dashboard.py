"""Medic's Grafana dashboard, generated with grafanalib (the `dashboards` extra; never needed on
a compute node). Writes docs/grafana/medic.json; `--check` exits 1 when that file is not what
this script generates. tests/test_grafana_dashboard.py checks that every query parses
(promtool) and names only metrics a real medic-healthd exports.

    .venv/bin/pip install -e '.[dashboards]'
    .venv/bin/python scripts/grafana_dashboard.py [--check]

Queries assume each node's daemon is its own target (`instance`) in a scrape job named
medic-healthd, as docs/prometheus/medic-alerts.yml does; node names come from
medic_build_info{node}.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Dashboard,
    GridPos,
    RowPanel,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Threshold,
    TimeSeries,
)

OUT = Path(__file__).parents[1] / "docs" / "grafana" / "medic.json"
DATASOURCE = "${datasource}"
JOB = 'job="medic-healthd"'
NODE = "* on(instance) group_left(node) medic_build_info"  # names the node of a series
RATE = "$__rate_interval"
WIDTH = 24  # Grafana's grid


def target(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False) -> Target:
    return Target(
        expr=expr,
        legendFormat=legend,
        refId=ref,
        instant=instant,
        format="table" if instant else "time_series",
        datasource=DATASOURCE,
    )


def stat(title: str, expr: str, description: str, *, alarm: bool = True) -> Stat:
    """One number; red from 1 when `alarm`, else always blue."""
    steps = [Threshold("green", 0, 0.0), Threshold("red", 1, 1.0)]
    return Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[target(expr, instant=True)],
        reduceCalc="lastNotNull",
        graphMode="none",
        colorMode="background",
        thresholds=steps if alarm else [Threshold("blue", 0, 0.0)],
    )


def graph(title: str, description: str, *targets: Target, unit: str = "short") -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=list(targets),
        unit=unit,
        legendDisplayMode="table",
        legendPlacement="right",
    )


def table(title: str, description: str, expr: str) -> Table:
    return Table(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[target(expr, instant=True)],
        transformations=[
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True, "__name__": True, "job": True}},
            }
        ],
    )


def fleet() -> list[Any]:
    return [
        stat(
            "CRITICAL nodes Slurm still schedules",
            "count((medic_node_status_code == 3) and on(instance) "
            "medic_slurm_node_in_service == 1) or vector(0)",
            "CRITICAL, and in service at the daemon's last look at Slurm "
            "(alert MedicCriticalNodeInService).",
        ),
        stat(
            "CRITICAL nodes",
            "count(medic_node_status_code == 3) or vector(0)",
            "Nodes whose worst check is CRITICAL.",
        ),
        stat(
            "Remediation paused",
            "max(medic_remediation_paused) or vector(0)",
            "1 while remediation is paused fleet-wide (`medic remediation status`).",
        ),
        stat(
            "Episodes waiting on a human",
            'sum(medic_episodes{state="needs_human"}) or vector(0)',
            "needs_human episodes (`medic episode list`).",
        ),
        stat(
            "Open RMA tickets",
            "sum(medic_rma_tickets_open) or vector(0)",
            "Tickets not closed, over every node (`medic rma list`).",
            alarm=False,
        ),
        stat(
            "Daemons down",
            f"count(up{{{JOB}}} == 0) or vector(0)",
            "medic-healthd targets that did not answer the last scrape.",
        ),
        stat(
            "Stores unreachable",
            "count(medic_store_up == 0) or vector(0)",
            "Daemons whose last store read failed or timed out.",
        ),
    ]


def nodes() -> list[Any]:
    return [
        table(
            "Nodes not OK",
            "Worst status per node: 1 WARN, 2 UNKNOWN, 3 CRITICAL.",
            f"(medic_node_status_code > 0) {NODE}",
        ),
        graph(
            "Current faults by class",
            "Non-OK findings over the fleet (medic_node_faults).",
            target(
                "sum by (fault_class, status) (medic_node_faults)", "{{fault_class}} {{status}}"
            ),
        ),
        graph(
            "Episodes by state",
            "Episodes that wait on something: the ladder's open states and needs_human.",
            target("sum by (state) (medic_episodes)", "{{state}}"),
        ),
        graph(
            "Episodes by rung",
            "The same episodes by the ladder rung they are at.",
            target("sum by (rung) (medic_episodes)", "rung {{rung}}"),
        ),
        table(
            "Longest wait per node and episode state",
            "Seconds since the oldest episode in each state last changed (needs_human: since "
            "it was handed to a human).",
            f"(time() - medic_episode_changed_timestamp_seconds) {NODE}",
        ),
        table(
            "Nodes in RMA",
            "Days since the node's oldest open RMA ticket was opened.",
            f"((time() - medic_rma_oldest_open_ticket_timestamp_seconds) / 86400) {NODE}",
        ),
        table(
            "Slurm's view, as each daemon last saw it",
            "1 = in service; nodes whose daemon has not asked Slurm since it started are absent.",
            f"medic_slurm_node_in_service {NODE}",
        ),
    ]


def gpus() -> list[Any]:
    return [
        graph(
            "XIDs by code",
            "XIDs seen per hour over the fleet (NVML and kernel log, each once).",
            target("sum by (xid) (increase(medic_gpu_xids_total[1h]))", "XID {{xid}}"),
        ),
        table(
            "GPUs not OK",
            "Worst GPU-check status per GPU: 1 WARN, 2 UNKNOWN, 3 CRITICAL.",
            f"(medic_gpu_status_code > 0) {NODE}",
        ),
        graph(
            "NVML events",
            "Events the XID listeners received, by kind.",
            target(f"sum by (kind) (rate(medic_gpu_events_total[{RATE}]))", "{{kind}}"),
            unit="ops",
        ),
        graph(
            "GPUs per node (minimum)",
            "Fewest GPUs NVML lists on any node: a drop is a GPU off the bus.",
            target("min(medic_gpu_devices)", "min"),
        ),
    ]


def daemons() -> list[Any]:
    return [
        graph(
            "Seconds since the last check results",
            "Per node; MedicChecksStalled fires past 900 s.",
            target(f"(time() - medic_healthd_last_round_timestamp_seconds) {NODE}", "{{node}}"),
            unit="s",
        ),
        graph(
            "Mean check run time",
            "By check, over the fleet.",
            target(
                f"sum by (check) (rate(medic_check_duration_seconds_sum[{RATE}])) / "
                f"sum by (check) (rate(medic_check_duration_seconds_count[{RATE}]))",
                "{{check}}",
            ),
            unit="s",
        ),
        graph(
            "Check runs over 1 s",
            "Share of each check's runs that took longer than 1 s.",
            target(
                f"1 - sum by (check) "
                f'(rate(medic_check_duration_seconds_bucket{{le="1.0"}}[{RATE}])) / '
                f"sum by (check) (rate(medic_check_duration_seconds_count[{RATE}]))",
                "{{check}}",
            ),
            unit="percentunit",
        ),
        graph(
            "Check runs that did not finish",
            "Runs by outcome other than done (error, timeout, hung, unavailable).",
            target(
                "sum by (check, outcome) "
                f'(rate(medic_check_runs_total{{outcome!="done"}}[{RATE}]))',
                "{{check}} {{outcome}}",
            ),
            unit="ops",
        ),
        graph(
            "Daemon memory",
            "Resident memory of each medic-healthd.",
            target(f"process_resident_memory_bytes{{{JOB}}} {NODE}", "{{node}}"),
            unit="bytes",
        ),
        graph(
            "Daemon CPU",
            "CPU seconds per second of each medic-healthd.",
            target(f"rate(process_cpu_seconds_total{{{JOB}}}[{RATE}]) {NODE}", "{{node}}"),
            unit="percentunit",
        ),
        graph(
            "Medic versions",
            "Daemons per version.",
            target("count by (version) (medic_build_info)", "{{version}}"),
        ),
    ]


def laid_out(rows: Iterable[tuple[str, list[Any], int, int]]) -> Iterator[Any]:
    """Rows of panels, each row's panels `per_line` to a line, `height` high."""
    y = 0
    for title, panels, per_line, height in rows:
        yield RowPanel(title=title, gridPos=GridPos(h=1, w=WIDTH, x=0, y=y))
        y += 1
        width = WIDTH // per_line
        for i, panel in enumerate(panels):
            panel.gridPos = GridPos(h=height, w=width, x=(i % per_line) * width, y=y)
            if i % per_line == per_line - 1 or i == len(panels) - 1:
                y += height
        yield from panels


def dashboard() -> Dashboard:
    panels = list(
        laid_out(
            [
                ("Fleet", fleet(), 7, 4),
                ("Nodes and episodes", nodes(), 2, 8),
                ("GPUs", gpus(), 2, 8),
                ("Daemons and checks", daemons(), 2, 8),
            ]
        )
    )
    return Dashboard(
        title="Medic",
        uid="slurm-medic",
        description="GPU node health and remediation by Medic (slurm-medic).",
        tags=["medic", "slurm", "gpu"],
        timezone="utc",
        refresh="1m",
        templating=Templating(
            list=[
                Template(
                    name="datasource", label="Prometheus", query="prometheus", type="datasource"
                )
            ]
        ),
        panels=panels,
    ).auto_panel_ids()


def render() -> str:
    data = dashboard().to_json_data()
    return json.dumps(data, cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run {Path(__file__).name} without --check", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

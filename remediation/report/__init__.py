"""`medic report`'s arithmetic: rows the store already holds in, typed figures out.

Pure: no store, no clock, no Slurm. `remediation.report_store` reads the rows; `cli.report`
prints the result. Docs: docs/operator-guide.md, "medic report".

One module per concern, imported one way (durations <- rows, figures <- jobs, fleet <- build):

- `durations`: seconds, percentiles, a `Spread`, `format_duration`;
- `rows`: the records in (`FaultSeen`, `JobAction`, `JobStart`, `JobEnd`, `CheckpointMark`,
  `EpisodeRow`, `StepRow`, `TicketRow`, `ReportInput`) and the names they carry;
- `figures`: the figures out (`Interruption`, `JobReport`, `FleetReport`, `Report`, ...);
- `jobs`: a resilient job's interruptions (the timeline, its components, lost work) and ETTR;
- `fleet`: the fleet's figures (MTBF, out of service, lemons, rung outcomes, false ejections);
- `build`: `build_report`, the window's rows in, the Report out (MTTR's components).

This package re-exports their public names: `from remediation import report as rp;
rp.build_report(rp.ReportInput(...))`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

# The names below load with their module on first use (PEP 562): `medic report what-if` and
# `--help` import a submodule such as `durations` without the whole model (~60 ms).
if TYPE_CHECKING:
    from remediation.report.build import build_report
    from remediation.report.durations import (
        Spread,
        format_duration,
        in_window,
        percentile,
        seconds,
        spread,
    )
    from remediation.report.figures import (
        COMPONENTS,
        ClassCount,
        FalseEjection,
        FleetReport,
        HumanWait,
        Interruption,
        JobReport,
        NodeFigures,
        Report,
        RungFigures,
    )
    from remediation.report.fleet import (
        FAILED,
        NOT_REPAIRED,
        PENDING,
        WORKED,
        fleet_report,
        is_false_ejection,
        step_outcome,
    )
    from remediation.report.jobs import (
        FAULT_LOOKBACK,
        RUN_BURST,
        SKEW_TOLERANCE,
        interruptions_of,
        job_report,
    )
    from remediation.report.rows import (
        INTERRUPTING,
        NOT_REQUEUED,
        REBOOT,
        REBOOT_SEEN,
        REQUEUED,
        RMA_RUNG,
        CheckpointMark,
        EpisodeRow,
        FaultSeen,
        JobAction,
        JobEnd,
        JobStart,
        LemonRule,
        ReportInput,
        StepRow,
        TicketRow,
    )

_HOME = {
    "build_report": "build",
    "Spread": "durations",
    "format_duration": "durations",
    "in_window": "durations",
    "percentile": "durations",
    "seconds": "durations",
    "spread": "durations",
    "COMPONENTS": "figures",
    "ClassCount": "figures",
    "FalseEjection": "figures",
    "FleetReport": "figures",
    "HumanWait": "figures",
    "Interruption": "figures",
    "JobReport": "figures",
    "NodeFigures": "figures",
    "Report": "figures",
    "RungFigures": "figures",
    "FAILED": "fleet",
    "NOT_REPAIRED": "fleet",
    "PENDING": "fleet",
    "WORKED": "fleet",
    "fleet_report": "fleet",
    "is_false_ejection": "fleet",
    "step_outcome": "fleet",
    "FAULT_LOOKBACK": "jobs",
    "RUN_BURST": "jobs",
    "SKEW_TOLERANCE": "jobs",
    "interruptions_of": "jobs",
    "job_report": "jobs",
    "INTERRUPTING": "rows",
    "NOT_REQUEUED": "rows",
    "REBOOT": "rows",
    "REBOOT_SEEN": "rows",
    "REQUEUED": "rows",
    "RMA_RUNG": "rows",
    "CheckpointMark": "rows",
    "EpisodeRow": "rows",
    "FaultSeen": "rows",
    "JobAction": "rows",
    "JobEnd": "rows",
    "JobStart": "rows",
    "LemonRule": "rows",
    "ReportInput": "rows",
    "StepRow": "rows",
    "TicketRow": "rows",
}

__all__ = [
    "COMPONENTS",
    "FAILED",
    "FAULT_LOOKBACK",
    "INTERRUPTING",
    "NOT_REPAIRED",
    "NOT_REQUEUED",
    "PENDING",
    "REBOOT",
    "REBOOT_SEEN",
    "REQUEUED",
    "RMA_RUNG",
    "RUN_BURST",
    "SKEW_TOLERANCE",
    "WORKED",
    "CheckpointMark",
    "ClassCount",
    "EpisodeRow",
    "FalseEjection",
    "FaultSeen",
    "FleetReport",
    "HumanWait",
    "Interruption",
    "JobAction",
    "JobEnd",
    "JobReport",
    "JobStart",
    "LemonRule",
    "NodeFigures",
    "Report",
    "ReportInput",
    "RungFigures",
    "Spread",
    "StepRow",
    "TicketRow",
    "build_report",
    "fleet_report",
    "format_duration",
    "in_window",
    "interruptions_of",
    "is_false_ejection",
    "job_report",
    "percentile",
    "seconds",
    "spread",
    "step_outcome",
]


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # once: later reads do not come here
    return value

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

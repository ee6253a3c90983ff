"""Offline sweeps (`medic sweep`): take idle nodes out of scheduling a few at a time, run the
deep tier on each as a Slurm job, give back the healthy ones and hand the failing ones to
the remediation ladder.

    planned --take--> taking --reservation made--> held --srun--> running --report--> checked
                        |                            |                                   |
                        +--> skipped (busy, drained) +--> (resume: job cancelled, again) |
                                                         returned <--- pass, inconclusive -+
                                                         handed   <--- fail: ladder admits,
                                                                       Medic's drain stays

A node is taken with a Slurm reservation named `medic-sweep-<sweep>-<node>` (created only
while the node is idle: Slurm refuses a reservation on a busy node, so no job is ever
pre-empted), the deep tier runs as `srun --reservation=... -w NODE medic sweep probe`, and
giving the node back is deleting that reservation: a sweep never resumes, drains or
undrains a node it did not take, and a reservation outlives a killed sweep by at most its
duration. Every step is written to the store before it is taken; `Sweeper.run` after a
crash resumes the unfinished sweep from those rows (schema version 4).

Three modules, imported one way only (an import-linter contract in pyproject.toml):

- `policy`: pure planning (`risk`, `rank`, `share_cap`, `next_batch`, `availability`,
  `judge`): no SQLAlchemy, no store, no Slurm command, no subprocess;
- `store`: the `sweeps` and `sweep_nodes` tables, `SweepStore` and the one-sweep lock;
- `runner`: `Sweeper`, which gathers from Slurm and the store and acts; `slurm`: `SweepSlurm`
  (the reservations and srun). The deep tier on the node itself (`medic sweep probe`) is
  `healthd.inline.deep_probe`, the daemon's side of the layers.

This package re-exports their public names: `from remediation.sweep import Sweeper`.
"""

from remediation.sweep.policy import (
    CHECKED,
    DONE,
    FAIL,
    FINAL,
    HANDED,
    HELD,
    HOLDING,
    INCONCLUSIVE,
    MAX_STALENESS,
    NEVER_CHECKED_STALENESS,
    NOT_TAKEN_FLAGS,
    PASS,
    PLANNED,
    PROBING,
    RESERVATION_PREFIX,
    RETURNED,
    RUNNING,
    SKIPPED,
    TAKING,
    TIMEOUT_FAULT,
    Candidate,
    NodeVerdict,
    Risk,
    availability,
    gres_request,
    judge,
    natural_key,
    next_batch,
    partition_caps,
    rank,
    reservation_name,
    risk,
    share_cap,
    summary,
)
from remediation.sweep.runner import (
    EVENT_KIND,
    RESERVATION_SLACK,
    Progress,
    Sweeper,
    SweepReport,
)
from remediation.sweep.slurm import SweepSlurm
from remediation.sweep.store import (
    METADATA,
    SWEEP_LOCK_KEY,
    SweepBusy,
    SweepNode,
    SweepRow,
    SweepStore,
    sweep_nodes,
    sweeps,
)

__all__ = [
    "CHECKED",
    "DONE",
    "EVENT_KIND",
    "FAIL",
    "FINAL",
    "HANDED",
    "HELD",
    "HOLDING",
    "INCONCLUSIVE",
    "MAX_STALENESS",
    "METADATA",
    "NEVER_CHECKED_STALENESS",
    "NOT_TAKEN_FLAGS",
    "PASS",
    "PLANNED",
    "PROBING",
    "RESERVATION_PREFIX",
    "RESERVATION_SLACK",
    "RETURNED",
    "RUNNING",
    "SKIPPED",
    "SWEEP_LOCK_KEY",
    "TAKING",
    "TIMEOUT_FAULT",
    "Candidate",
    "NodeVerdict",
    "Progress",
    "Risk",
    "SweepBusy",
    "SweepNode",
    "SweepReport",
    "SweepRow",
    "SweepSlurm",
    "SweepStore",
    "Sweeper",
    "availability",
    "gres_request",
    "judge",
    "natural_key",
    "next_batch",
    "partition_caps",
    "rank",
    "reservation_name",
    "risk",
    "share_cap",
    "summary",
    "sweep_nodes",
    "sweeps",
]

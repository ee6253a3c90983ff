"""Checkpoints a job can resume from after Medic requeues it, never torn.

Commit protocol (`CheckpointDir.writing`):

1. the job writes its files into a fresh temporary directory next to the checkpoints,
   `.tmp-step-NNNNNNNNN.<host>.<pid>.<random>`;
2. on success every file and directory in it is fsynced, and the manifest
   `medic-manifest.json` (step, time, job id, restart count, every file with size and sha256)
   is written and fsynced last: it is the completion marker;
3. the directory is renamed to `step-NNNNNNNNN` (atomic within one filesystem) and the parent
   directory fsynced, so the rename itself survives a crash.

A process killed anywhere in between leaves at most a temporary directory, which `latest()`
never looks at and `prune()` removes; a `step-*` directory whose manifest is missing or does
not match its files (a crash without fsync, a hand copy) is skipped too.

The ledger, `.medic-ledger.jsonl`: one line per commit (after its rename is durable) and per
restarted run's resume mark, appended (O_APPEND, then fsync) and never rewritten; `prune()`
leaves it alone. `medic report` reads the resume step, lost work and ETTR from it, so a job
that keeps only its last checkpoints is reported as it ran. A line torn by a crash is
skipped by the reader (`parse_ledger`), and the records after it still count.

Tiers (`LocalTier`, opt-in: `local=` or MEDIC_CHECKPOINT_LOCAL): `writing(step)` commits the
step, as above, in a node-local directory; a background thread then drains it into the
durable directory (copy into a temporary directory there, commit only when every file's size
and sha256 match the node-local manifest). `latest()` takes the newest complete step of
either tier, the node-local copy (hash-verified) on a tie. docs/resilient-jobs.md, "Tiers".

The modules, one concern each: `layout` (the names on disk, `Checkpoint`, `CheckpointError`),
`directory` (`CheckpointDir`, the job's API), `commit` (the commit protocol above),
`reading` (a step read back and verified), `ledger` (the ledger and resume marks),
`prune`, `node_local` (`LocalTier`) and `progress_heartbeat` (`Progress`, `progress`).
Jobs import from this package: `from slurm_hooks.checkpoint import CheckpointDir`.
"""

from __future__ import annotations

from slurm_hooks.checkpoint.directory import CheckpointDir
from slurm_hooks.checkpoint.layout import (
    DIR_ENV,
    DURABLE,
    FORMAT,
    JOB_ENV,
    LOCAL,
    MANIFEST,
    RESTART_ENV,
    STALE_AFTER,
    STEP_PREFIX,
    TIERS,
    TMP_PREFIX,
    TRASH_PREFIX,
    Checkpoint,
    CheckpointError,
    FileEntry,
    restart_count,
    step_name,
)
from slurm_hooks.checkpoint.ledger import (
    COMMIT,
    LEDGER,
    LEDGER_LIMIT,
    LEDGER_TAG,
    RESUME,
    RESUME_PREFIX,
    LedgerRecord,
    Resume,
    parse_ledger,
)
from slurm_hooks.checkpoint.node_local import LOCAL_CAP_ENV, LOCAL_ENV, LocalTier
from slurm_hooks.checkpoint.progress_heartbeat import Progress, progress
from slurm_hooks.checkpoint.prune import Pruned

__all__ = [
    "COMMIT",
    "DIR_ENV",
    "DURABLE",
    "FORMAT",
    "JOB_ENV",
    "LEDGER",
    "LEDGER_LIMIT",
    "LEDGER_TAG",
    "LOCAL",
    "LOCAL_CAP_ENV",
    "LOCAL_ENV",
    "MANIFEST",
    "RESTART_ENV",
    "RESUME",
    "RESUME_PREFIX",
    "STALE_AFTER",
    "STEP_PREFIX",
    "TIERS",
    "TMP_PREFIX",
    "TRASH_PREFIX",
    "Checkpoint",
    "CheckpointDir",
    "CheckpointError",
    "FileEntry",
    "LedgerRecord",
    "LocalTier",
    "Progress",
    "Pruned",
    "Resume",
    "parse_ledger",
    "progress",
    "restart_count",
    "step_name",
]

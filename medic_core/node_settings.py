"""The node's tables: `[healthd]` (the daemon: intervals, NVML, metrics, hangs, stragglers)
and `[hooks]` (the prolog, epilog and HealthCheckProgram), with the one launch budget they
share and the deprecated keys `medic config check` names."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from medic_core.config import MedicConfig
from medic_core.per_config import per_config
from medic_core.typed_config import parse_table, setting

GPU_MODES = ("auto", "required", "none")
DEFAULT_LAUNCH_BUDGET = 10.0


@dataclass(frozen=True, kw_only=True)
class DaemonSettings:
    """The `[healthd]` table (docs/operator-guide.md lists every key)."""

    jitter: float = setting(
        0.1, minimum=0, maximum=0.5, doc="each interval is stretched or shrunk by up to this share"
    )
    launch_budget: float = setting(
        DEFAULT_LAUNCH_BUDGET,
        minimum=0.5,
        maximum=300,
        doc="deprecated alias of [hooks] launch_budget (read only when that is not set)",
    )
    launch_max_age: float = setting(
        60.0, minimum=0, maximum=3600, doc="launch-tier results younger than this are reused"
    )
    prune_every: float = setting(3600.0, minimum=60, maximum=86400, doc="seconds between prunes")
    gpus: str = setting("auto", choices=GPU_MODES, doc="GPU node? auto, required or none")
    nvml_call_timeout: float = setting(
        3.0, minimum=0.1, maximum=60, doc="seconds before one NVML call counts as hung"
    )
    metrics_port: int = setting(9847, minimum=0, maximum=65535, doc="Prometheus port; 0: off")
    metrics_address: str = setting(
        "127.0.0.1", doc="address the metrics endpoint binds (0.0.0.0: every interface)"
    )
    socket_group: str = setting(
        "slurm", doc="group allowed on the socket (SlurmUser's); '' for root only"
    )
    slurmd_spool_dir: str = setting(
        "/var/spool/slurmd", doc="slurmd's SlurmdSpoolDir (%n: node name), to see running jobs"
    )
    # Hangs (docs/operator-guide.md, "Hangs"): a job that reports its steps and stalls.
    hang_detection: bool = setting(True, doc="watch the progress heartbeats of jobs on the node")
    hang_factor: float = setting(
        10.0, minimum=1.5, maximum=1000, doc="a job stalled for this many median steps is hung"
    )
    hang_floor: float = setting(
        60.0, minimum=1, maximum=86400, doc="...and for at least this many seconds"
    )
    hang_window: int = setting(20, minimum=1, maximum=1000, doc="recent step times in the median")
    hang_min_steps: int = setting(
        3, minimum=1, maximum=1000, doc="step times seen before a job is judged at all"
    )
    hang_poll: float = setting(
        1.0, minimum=0.1, maximum=60, doc="seconds between looks at the heartbeats"
    )
    hang_py_spy_timeout: float = setting(
        5.0, minimum=0.5, maximum=60, doc="seconds py-spy (when installed) may take in all"
    )
    progress_dir: str = setting(
        "/run/medic/progress", doc="heartbeat directory (jobs: $MEDIC_PROGRESS_DIR if not this)"
    )
    # Stragglers (docs/operator-guide.md, "Stragglers"): off unless straggler_every is set.
    straggler_every: float = setting(
        0.0, minimum=0, maximum=86400, doc="seconds between pace comparisons per job; 0: off"
    )
    straggler_ratio: float = setting(
        1.25, minimum=1.01, maximum=100, doc="slower than the job's other nodes by this factor"
    )
    straggler_repeats: int = setting(
        3, minimum=1, maximum=1000, doc="...in this many comparisons in a row: reported"
    )
    straggler_drain_jobs: int = setting(
        2,
        minimum=0,
        maximum=1000,
        doc="a node reported a straggler in this many jobs (within straggler_drain_days)"
        " drains after its job and goes to the ladder; 0: report only",
    )
    straggler_drain_days: float = setting(
        7.0, minimum=0.01, maximum=365, doc="the window of straggler_drain_jobs, in days"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        return iter(())

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> DaemonSettings:
        table = dict(config.table("healthd"))
        table["launch_budget"] = launch_budget_value(config)  # the one key, [hooks]
        return parse_table(cls, table, prefix="healthd", source=config.source)


@dataclass(frozen=True, kw_only=True)
class HookSettings:
    on_unknown: str = setting(
        "open",
        choices=("open", "closed"),
        doc="launch verdict UNKNOWN (a check could not tell): open runs the job, closed drains",
    )
    launch_budget: float = setting(
        DEFAULT_LAUNCH_BUDGET,
        minimum=0.5,
        maximum=300,
        doc="seconds from the prolog's start to its verdict, end to end (front, daemon, inline)",
    )
    release_held: bool = setting(
        True,
        doc="release a job Slurm held after Medic's prolog refused a node, and make a job"
        " Medic requeued eligible at once instead of after cred_expire and a backfill cycle",
    )
    release_wait: float = setting(
        60.0, minimum=1, maximum=3600, doc="seconds to wait for that job to be held"
    )
    requeue_resilient: bool = setting(
        True, doc="requeue resilient jobs off a node with a fresh CRITICAL fault"
    )
    drain_on_epilog: bool = setting(True, doc="drain a node whose post-job checks are CRITICAL")
    resume: bool = setting(
        True, doc="HealthCheckProgram resumes nodes Medic drained once they check clean"
    )
    slurm_timeout: float = setting(
        15.0, minimum=1, maximum=300, doc="seconds one Slurm command may take"
    )
    skip_launch_partitions: tuple[str, ...] = setting(
        (),
        doc="partitions whose jobs start without the launch checks (slurmd's word, not the job's)",
    )
    skip_launch_accounts: tuple[str, ...] = setting(
        (), doc="accounts whose jobs start without the launch checks (slurmd's word, not the job's)"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for key in ("skip_launch_partitions", "skip_launch_accounts"):
            if any(not name or name != name.strip() for name in getattr(self, key)):
                yield key, "holds an empty or padded name", 'e.g. ["debug"]'

    def skips_launch_checks(self, partition: str, account: str) -> str:
        """Why a job in `partition` under `account` (as slurmd gives the prolog: the job
        cannot choose its own) starts without the launch checks, or "" when it does not."""
        if partition and partition in self.skip_launch_partitions:
            return f"partition {partition} is in [hooks] skip_launch_partitions"
        if account and account in self.skip_launch_accounts:
            return f"account {account} is in [hooks] skip_launch_accounts"
        return ""

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> HookSettings:
        table = dict(config.table("hooks"))
        table["launch_budget"] = launch_budget_value(config)
        return parse_table(cls, table, prefix="hooks", source=config.source)


def launch_budget_value(config: MedicConfig) -> Any:
    """The launch budget as written: `[hooks] launch_budget`, else the deprecated
    `[healthd] launch_budget` (see `deprecations`), else the default. Validated by the
    table that reads it."""
    for table in ("hooks", "healthd"):
        value = config.table(table).get("launch_budget")
        if value is not None:
            return value
    return DEFAULT_LAUNCH_BUDGET


def deprecations(config: MedicConfig) -> list[str]:
    """Keys that still work but should be changed: one line each, for `medic config check`."""
    found = []
    if "launch_budget" in config.table("healthd"):
        ignored = " (ignored: [hooks] launch_budget is set)"
        found.append(
            "[healthd] launch_budget is deprecated: move it to [hooks] launch_budget, the one"
            " launch budget" + (ignored if "launch_budget" in config.table("hooks") else "")
        )
    return found

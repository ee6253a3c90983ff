"""Every settings table of medic.toml, typed, and the one loader that validates them all.

`load_settings(config)` parses every table (a check's own `[checks.<name>]` tables are the
sensors' and are parsed by healthd.checks). It runs at start-up, in `medic config check` and
on SIGHUP: a file that fails any table raises ConfigError (file, key, fix) and changes
nothing. Each part of Medic takes its table from the bundle instead of parsing its own.
"""

from __future__ import annotations

import functools
import logging
import ssl
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from medic_core.argv_template import argv_problems
from medic_core.config import ConfigError, MedicConfig
from medic_core.typed_config import bounds, parse_table, setting

log = logging.getLogger("medic.settings")

GPU_MODES = ("auto", "required", "none")
PREFIX = "remediation.webhook"
DEFAULT_LAUNCH_BUDGET = 10.0

SettingsT = TypeVar("SettingsT")
ParsedT = TypeVar("ParsedT")


def per_config(
    parse: Callable[[type[SettingsT], MedicConfig], ParsedT],
) -> Callable[[type[SettingsT], MedicConfig], ParsedT]:
    """Parse a table once per configuration object. A MedicConfig is immutable and a reload
    makes a new one, so the result cannot go stale; the daemon's hang watch, ladder and
    every launch request asked for their settings again each time (5 % of the daemon's
    CPU went into get_type_hints)."""
    last: dict[type[SettingsT], tuple[MedicConfig, ParsedT]] = {}

    @functools.wraps(parse)
    def parsed(cls: type[SettingsT], config: MedicConfig) -> ParsedT:
        hit = last.get(cls)
        if hit is not None and hit[0] is config:
            return hit[1]
        value = parse(cls, config)
        last[cls] = (config, value)
        return value

    return parsed


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


RUNG_NAMES = ("gpu_reset", "driver_reload", "reboot", "rma")


@dataclass(frozen=True, kw_only=True)
class RemediationSettings:
    enabled: bool = setting(True, doc="run the ladder at all (false: drain and report only)")
    dry_run: bool = setting(False, doc="the ladder records the rung it would start; a human's")
    observe_only: bool = setting(
        False,
        doc="fleet-wide dry run: every drain, requeue, resume, reboot, repair, RMA ticket and"
        " launch refusal is recorded as what Medic would have done; nothing changes in Slurm",
    )
    max_drained_share: float = setting(
        0.10, minimum=0, maximum=1, doc="most of a partition Medic keeps drained at once"
    )
    min_drained: int = setting(1, minimum=0, doc="...but always allow this many nodes")
    fleet_signature_nodes: int = setting(
        3, minimum=2, doc="same fault class on this many nodes within the window pauses all"
    )
    fleet_signature_window: float = setting(900.0, minimum=60, doc="seconds")
    max_restarts: int = setting(
        20,
        minimum=0,
        maximum=1000,
        doc="most restarts a job's `medic:resilient=N` may ask (its owner can edit the comment)",
    )
    lemon_episodes: int = setting(
        3,
        minimum=2,
        doc="N: the Nth episode of one component and fault family within lemon_days (N-1"
        " earlier ones that needed a repair, and this one) goes straight to RMA",
    )
    lemon_days: float = setting(7.0, minimum=1, doc="days of episodes the lemon rule counts")
    lemon_failed_requalifications: int = setting(
        2,
        minimum=1,
        doc="...or once those episodes failed this many re-qualifications in all",
    )
    action_timeout: float = setting(300.0, minimum=1, doc="seconds one repair command may take")
    reboot_timeout: float = setting(1800.0, minimum=60, doc="seconds a reboot may take")
    recheck_window: float = setting(
        600.0, minimum=0, doc="seconds a link fault is re-checked before a human is asked"
    )
    idle_timeout: float = setting(
        3600.0, minimum=0, doc="seconds to wait for running jobs to leave before acting"
    )
    adopt: tuple[str, ...] = setting(
        ("kill_task_failed", "unexpected_reboot"),
        doc="Slurm's own drains Medic takes over, repairs and gives back: kill_task_failed"
        " (reboot), unexpected_reboot, not_responding (re-qualify)",
    )
    gpu_reset_in_service: bool = setting(
        True,
        doc="a GPU's reset waits only for the jobs holding that GPU, not for the jobs on the"
        " node's other GPUs (off where GPUs reset only together: NVSwitch A100 systems)",
    )
    attempts: dict[str, int] = field(
        default_factory=lambda: {"gpu_reset": 2, "driver_reload": 1, "reboot": 1},
        metadata=bounds(keys=RUNG_NAMES[:3], minimum=0, doc="tries per rung; 0 skips it"),
    )
    cooldown: dict[str, float] = field(
        default_factory=lambda: {"gpu_reset": 0.0, "driver_reload": 60.0, "reboot": 600.0},
        metadata=bounds(
            keys=RUNG_NAMES[:3], minimum=0, doc="seconds after a failed rung before the next step"
        ),
    )
    first_rung: dict[str, str] = field(
        default_factory=dict,
        metadata=bounds(
            choices=(*RUNG_NAMES, "none"),
            doc='override by fault class prefix, e.g. {"gpu.xid.79" = "reboot"}',
        ),
    )
    # Outside medic-healthd's sandbox: systemd runs medic-repair (remediation/repair.py) as
    # an instance of the shipped template medic-repair@.service.
    gpu_reset: tuple[str, ...] = setting(
        ("/usr/bin/systemctl", "start", "medic-repair@gpu-reset-{gpu}.service"),
        doc="argv of a GPU reset; {gpu} is the NVML index, {node} the node",
    )
    driver_reload: tuple[str, ...] = setting(
        ("/usr/bin/systemctl", "start", "medic-repair@driver-reload.service"),
        doc="argv that stops the driver's users, reloads the modules and starts them again",
    )
    requalify_checks: tuple[str, ...] = setting(
        (), doc="extra (deep) checks a node must pass before it returns"
    )
    webhook: dict[str, str] = field(
        default_factory=dict, metadata=bounds(doc="see remediation.webhook")
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        known = ("kill_task_failed", "unexpected_reboot", "not_responding")
        for name in self.adopt:
            if name not in known:
                yield ("adopt", f"{name!r} is not one of Slurm's drains Medic knows",
                       f"use any of {', '.join(known)}")  # fmt: skip
        yield from argv_problems("gpu_reset", self.gpu_reset, ("gpu", "node"))
        yield from argv_problems("driver_reload", self.driver_reload, ("node",))

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> RemediationSettings:
        table = {
            k: v
            for k, v in config.table("remediation").items()
            if k not in ("webhook", "isolation", "spares", "burn_in", "evidence")
        }
        return parse_table(cls, table, prefix="remediation", source=config.source)


ISOLATION_PLACEHOLDERS = ("node", "count", "keep", "isolated")


@dataclass(frozen=True, kw_only=True)
class IsolationSettings:
    """The `[remediation.isolation]` table: single-GPU isolation (remediation/isolation.py)."""

    enabled: bool = setting(False, doc="take one bad GPU out of the node's GRES, not the node")
    faults: tuple[str, ...] = setting(
        ("gpu.xid.48", "gpu.xid.63", "gpu.xid.64", "gpu.xid.94", "gpu.xid.95"),
        doc="fault classes (or their prefixes) on one GPU that allow isolation",
    )
    nvswitch: bool = setting(False, doc="the node's GPUs share an NVSwitch fabric (HGX)")
    nvswitch_refused: tuple[str, ...] = setting(
        ("gpu.xid.74", "gpu.xid.79"),
        doc="faults that drain the whole node when nvswitch = true",
    )
    max_gpus: int = setting(1, minimum=1, doc="GPUs isolated on one node before a full drain")
    apply: tuple[str, ...] = setting(
        (),
        doc="argv that sets the node's GPU count in slurm.conf and its File= list in gres.conf,"
        " restarts the node's slurmd and, as MEDIC_GRES_CHANGE says, restarts slurmctld (below"
        " 24.11) or runs scontrol reconfigure: {node} {count} {keep} {isolated}",
    )
    apply_timeout: float = setting(120.0, minimum=1, doc="seconds the apply command may take")
    settle_timeout: float = setting(
        60.0, minimum=1, doc="seconds for Slurm to show the node's new GPU count"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        if self.enabled or self.apply:
            yield from argv_problems("apply", self.apply, ISOLATION_PLACEHOLDERS)

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> IsolationSettings:
        table = config.table("remediation").get("isolation", {})
        if not isinstance(table, Mapping):
            raise ConfigError(
                config.source,
                "remediation.isolation",
                "is not a table",
                "write its keys under [remediation.isolation]",
            )
        return parse_table(cls, table, prefix="remediation.isolation", source=config.source)


@dataclass(frozen=True, kw_only=True)
class SpareSettings:
    """The `[remediation.spares]` table: hot spares (remediation/spares.py)."""

    size: int = setting(0, minimum=0, doc="spare nodes kept in the pool (0: no pool)")
    nodes: tuple[str, ...] = setting(
        (), doc="the only nodes that may be spares (empty: any node the ladder repaired)"
    )
    reservation: str = setting("medic-spares", doc="the Slurm reservation holding the pool")
    checks: tuple[str, ...] = setting(
        (), doc="deep checks a node passes before it joins (empty: every deep-tier check)"
    )
    purge_after: int = setting(
        60, minimum=1, doc="seconds a handed spare's reservation outlives its job (PURGE_COMP)"
    )
    hold_days: int = setting(
        30, minimum=1, doc="days the pool's and a hand-over's reservations last at most"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        if not self.reservation or any(c in self.reservation for c in " \t,=[]"):
            yield "reservation", f"{self.reservation!r} is not a name", 'e.g. "medic-spares"'
        if self.nodes and self.size > len(self.nodes):
            yield "size", f"{self.size} > {len(self.nodes)} nodes listed", "list more nodes"

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> SpareSettings:
        table = config.table("remediation").get("spares", {})
        if not isinstance(table, Mapping):
            raise ConfigError(
                config.source,
                "remediation.spares",
                "is not a table",
                "write its keys under [remediation.spares]",
            )
        return parse_table(cls, table, prefix="remediation.spares", source=config.source)


BURN_IN_RUNGS = ("gpu_reset", "reboot", "rma", "none")


@dataclass(frozen=True, kw_only=True)
class BurnInSettings:
    """The `[remediation.burn_in]` table: the deep checks a node passes before its first job
    (remediation/burn_in.py). An empty list switches that reason off."""

    new_node: tuple[str, ...] = setting(
        ("deep_dcgm",), doc="checks a node never burnt in runs before its first job"
    )
    after_rma: tuple[str, ...] = setting(
        ("deep_dcgm",), doc="checks a node back from RMA runs before it returns"
    )
    after_reboot: tuple[str, ...] = setting(
        ("deep_dcgm",), doc="checks a node runs after the ladder's reboot rung"
    )
    failure_rung: str = setting(
        "reboot",
        choices=BURN_IN_RUNGS,
        doc="where the ladder starts on a failed burn-in whose check names no rung",
    )
    max_attempts: int = setting(
        3, minimum=1, doc="burn-in runs a daemon crash may interrupt before it counts failed"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for key in ("new_node", "after_rma", "after_reboot"):
            if any(not name or name != name.strip() for name in getattr(self, key)):
                yield key, "holds an empty or padded check name", 'e.g. ["deep_dcgm"]'

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> BurnInSettings:
        table = config.table("remediation").get("burn_in", {})
        if not isinstance(table, Mapping):
            raise ConfigError(
                config.source,
                "remediation.burn_in",
                "is not a table",
                "write its keys under [remediation.burn_in]",
            )
        return parse_table(cls, table, prefix="remediation.burn_in", source=config.source)


@dataclass(frozen=True, kw_only=True)
class EvidenceSettings:
    """The `[remediation.evidence]` table: the bundle a node collects when an episode goes to
    RMA or needs a human (remediation/evidence.py)."""

    enabled: bool = setting(True, doc="collect an evidence bundle on RMA and needs-human")
    bug_report: tuple[str, ...] = setting(
        ("nvidia-bug-report.sh",),
        doc="argv of NVIDIA's report (found on PATH; --output-file is added); [] for none",
    )
    bug_report_timeout: float = setting(
        300.0, minimum=1, doc="seconds the report may take; then it is killed and left out"
    )
    part_timeout: float = setting(
        20.0, minimum=1, doc="seconds each other part (kernel log, NVML, HCA counters) may take"
    )
    max_bytes: int = setting(
        256 << 20, minimum=1 << 20, doc="bytes one bundle holds at most; a part past it is left out"
    )
    keep_days: float = setting(30.0, minimum=1, doc="days a bundle is kept")
    keep_bundles: int = setting(50, minimum=1, doc="bundles kept at most (the oldest go first)")

    def problems(self) -> Iterator[tuple[str, str, str]]:
        if self.bug_report and not self.bug_report[0].strip():
            yield "bug_report", "starts with an empty program name", "give the program first, or []"

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> EvidenceSettings:
        table = config.table("remediation").get("evidence", {})
        if not isinstance(table, Mapping):
            raise ConfigError(
                config.source,
                "remediation.evidence",
                "is not a table",
                "write its keys under [remediation.evidence]",
            )
        return parse_table(cls, table, prefix="remediation.evidence", source=config.source)


@dataclass(frozen=True, kw_only=True)
class SweepSettings:
    share: float = setting(
        0.05, minimum=0, maximum=1, doc="most of each partition a sweep holds at once"
    )
    min_nodes: int = setting(
        1, minimum=0, doc="...but always this many nodes per partition (share rounds down)"
    )
    timeout: float = setting(
        3600.0, minimum=10, doc="seconds one node's deep tier may take; then srun is killed"
    )
    checks: tuple[str, ...] = setting(
        (), doc="deep checks to run (empty: every enabled deep-tier check)"
    )
    min_interval_days: float = setting(
        7.0, minimum=0, doc="a node deep-checked more recently than this is not swept"
    )
    partitions: tuple[str, ...] = setting((), doc="partitions swept (empty: all)")
    max_nodes: int = setting(0, minimum=0, doc="nodes checked per sweep at most (0: no limit)")
    lemon_days: float = setting(30.0, minimum=1, doc="days of episodes the risk score counts")
    probe: tuple[str, ...] = setting(
        ("medic", "sweep", "probe"), doc="argv srun runs on the node (the deep tier, as JSON)"
    )
    srun_args: tuple[str, ...] = setting((), doc='extra srun options, e.g. ["--account=ops"]')
    reservation_user: str = setting("", doc="user the reservations are for (default: ours)")
    immediate: float = setting(
        60.0, minimum=1, doc="seconds srun may wait for the node before giving up"
    )
    slurm_timeout: float = setting(30.0, minimum=1, doc="seconds one Slurm command may take")

    def problems(self) -> Iterator[tuple[str, str, str]]:
        if not self.probe:
            yield "probe", "is empty", 'give the probe argv, e.g. ["medic", "sweep", "probe"]'
        elif not self.probe[0]:
            yield "probe", "starts with an empty program name", "give the program first"
        for arg in self.srun_args:
            if not arg.startswith("-"):
                yield "srun_args", f"{arg!r} is not an option", "write options as --name=value"

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> SweepSettings:
        table = {k: v for k, v in config.table("sweep").items() if k != "pairs"}  # its own
        return parse_table(cls, table, prefix="sweep", source=config.source)


@dataclass(frozen=True, kw_only=True)
class WebhookTable:
    """The `[remediation.webhook]` table as written (checked by parse_check_config)."""

    url: str = setting("", doc="https:// URL the events are POSTed to (required)")
    secret: str = setting("", doc="HMAC-SHA256 key; or secret_file")
    secret_file: str = setting("", doc="file holding the key (trailing newline dropped)")
    timeout: float = setting(
        10.0, minimum=0.1, maximum=300, doc="seconds per attempt in all: connect, TLS, answer"
    )
    max_attempts: int = setting(5, minimum=1, maximum=50, doc="attempts per delivery round")
    backoff_base: float = setting(1.0, minimum=0, doc="seconds before the first retry")
    backoff_cap: float = setting(60.0, minimum=0, doc="longest wait between two attempts")
    retry_after_max: float = setting(
        60.0, minimum=0, doc="longest Retry-After the delivery thread waits; longer: a later round"
    )
    ca_file: str = setting("", doc="PEM bundle of the CA(s) to trust instead of the system's")
    verify: bool = setting(True, doc="verify the server's TLS certificate (leave it on)")
    allow_http: bool = setting(
        False, doc="accept a plain http:// url (unencrypted; a trusted network only)"
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        try:
            parts = urllib.parse.urlsplit(self.url)
            hostname, _ = parts.hostname, parts.port  # a bad port raises here
        except ValueError as exc:
            yield "url", f"not a URL: {self.url!r} ({exc})", "use https://host[:port]/path"
            return
        if not self.url:
            yield "url", "missing", "give the receiver's URL, e.g. https://tickets.example/medic"
        elif parts.scheme not in ("http", "https") or not hostname:
            yield "url", f"not an https URL: {self.url!r}", "use https://host[:port]/path"
        elif parts.scheme == "http" and not self.allow_http:
            yield (
                "url",
                f"{self.url!r} is plain http: the events and their evidence would cross the"
                " network unencrypted",
                "use https://, or set allow_http = true for a receiver on a trusted network",
            )
        if bool(self.secret) == bool(self.secret_file):
            yield (
                "secret",
                "give exactly one of secret and secret_file",
                "put the key in a root-only file and set secret_file",
            )
        if self.backoff_cap < self.backoff_base:
            yield "backoff_cap", "is below backoff_base", "raise backoff_cap"
        if self.ca_file and not self.verify:
            yield "ca_file", "set while verify = false", "remove one of them"


@dataclass(frozen=True)
class WebhookSettings:
    url: str
    secret: bytes = field(repr=False)
    timeout: float = 10.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    retry_after_max: float = 60.0
    ca_file: Path | None = None
    verify: bool = True
    allow_http: bool = False

    @classmethod
    @per_config
    def from_config(cls, config: MedicConfig) -> WebhookSettings | None:
        """The `[remediation.webhook]` table, or None when there is none (no webhook).
        Raises ConfigError naming the file, the key and the fix."""
        table = config.table("remediation").get("webhook")
        if table is None:
            return None
        return cls.from_table(table, config.source)

    @classmethod
    def from_table(cls, table: Any, source: Path | None = None) -> WebhookSettings:
        if not isinstance(table, Mapping):
            raise ConfigError(source, PREFIX, f"expected a table, got {table!r}", "write [...]")
        raw = parse_table(WebhookTable, table, prefix=PREFIX, source=source)
        secret = raw.secret.encode()
        if raw.secret_file:
            path = Path(raw.secret_file)
            try:
                secret = path.read_bytes().rstrip(b"\r\n")
            except OSError as exc:
                raise ConfigError(
                    source,
                    f"{PREFIX}.secret_file",
                    f"cannot read {path}: {exc.strerror}",
                    "create it (root-only) or fix the path",
                ) from None
            if not secret:
                raise ConfigError(
                    source, f"{PREFIX}.secret_file", f"{path} is empty", "write the key into it"
                )
        ca_file = Path(raw.ca_file) if raw.ca_file else None
        if ca_file is not None:
            try:
                ssl.create_default_context(cafile=str(ca_file))
            except (OSError, ssl.SSLError) as exc:
                problem = getattr(exc, "strerror", None) or str(exc)
                raise ConfigError(
                    source,
                    f"{PREFIX}.ca_file",
                    f"cannot load {ca_file}: {problem}",
                    "give a readable PEM file of CA certificates",
                ) from None
        settings = cls(
            url=raw.url,
            secret=secret,
            timeout=raw.timeout,
            max_attempts=raw.max_attempts,
            backoff_base=raw.backoff_base,
            backoff_cap=raw.backoff_cap,
            retry_after_max=raw.retry_after_max,
            ca_file=ca_file,
            verify=raw.verify,
            allow_http=raw.allow_http,
        )
        if urllib.parse.urlsplit(raw.url).scheme == "http":
            log.warning(
                "%s: %s.url is plain http (allow_http = true): events, evidence and signatures"
                " cross the network unencrypted; use https:// outside a trusted network",
                source or "<defaults>",
                PREFIX,
            )
        return settings

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file is not None else None
        )
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


@dataclass(frozen=True)
class Settings:
    """Every table, validated together."""

    healthd: DaemonSettings
    hooks: HookSettings
    remediation: RemediationSettings
    sweep: SweepSettings
    webhook: WebhookSettings | None


def load_settings(config: MedicConfig) -> Settings:
    """Parse and validate every table; the first problem raises ConfigError."""
    SpareSettings.from_config(config)  # validated here, read by the ladder thread
    from medic_core.store import store_settings  # the store's own table; imports SQLAlchemy

    store_settings(config)
    IsolationSettings.from_config(config)  # validated here, read by remediation.isolator
    BurnInSettings.from_config(config)  # validated here, read by remediation.burn_in
    EvidenceSettings.from_config(config)  # validated here, read by remediation.evidence
    return Settings(
        healthd=DaemonSettings.from_config(config),
        hooks=HookSettings.from_config(config),
        remediation=RemediationSettings.from_config(config),
        sweep=SweepSettings.from_config(config),
        webhook=WebhookSettings.from_config(config),
    )

"""The ladder's tables: `[remediation]` (rungs, caps, lemons, repair commands) and its
sub-tables `[remediation.isolation]`, `[remediation.spares]`, `[remediation.burn_in]` and
`[remediation.evidence]` (the webhook's is medic_core.webhook_settings')."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from medic_core.argv_template import argv_problems
from medic_core.config import ConfigError, MedicConfig
from medic_core.per_config import per_config
from medic_core.typed_config import bounds, parse_table, setting

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

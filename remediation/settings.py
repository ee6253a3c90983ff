"""The `[remediation]` table (its `webhook` sub-table belongs to remediation.webhook)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from healthd.checks.base import bounds, parse_check_config, setting
from medic_core.config import MedicConfig

RUNG_NAMES = ("gpu_reset", "driver_reload", "reboot", "rma")


@dataclass(frozen=True, kw_only=True)
class RemediationSettings:
    enabled: bool = setting(True, doc="run the ladder at all (false: drain and report only)")
    dry_run: bool = setting(False, doc="log and record what would be done, do nothing")
    max_drained_share: float = setting(
        0.10, minimum=0, maximum=1, doc="most of a partition Medic keeps drained at once"
    )
    min_drained: int = setting(1, minimum=0, doc="...but always allow this many nodes")
    fleet_signature_nodes: int = setting(
        3, minimum=2, doc="same fault class on this many nodes within the window pauses all"
    )
    fleet_signature_window: float = setting(900.0, minimum=60, doc="seconds")
    lemon_episodes: int = setting(3, minimum=2, doc="episodes within lemon_days make a lemon")
    lemon_days: float = setting(7.0, minimum=1, doc="days")
    lemon_failed_requalifications: int = setting(2, minimum=1, doc="...or this many failed")
    action_timeout: float = setting(300.0, minimum=1, doc="seconds one repair command may take")
    reboot_timeout: float = setting(1800.0, minimum=60, doc="seconds a reboot may take")
    idle_timeout: float = setting(
        3600.0, minimum=0, doc="seconds to wait for running jobs to leave before acting"
    )
    attempts: dict[str, int] = field(
        default_factory=lambda: {"gpu_reset": 2, "driver_reload": 1, "reboot": 1},
        metadata=bounds(keys=RUNG_NAMES[:3], minimum=0, doc="attempts per rung before the next"),
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
    gpu_reset: tuple[str, ...] = setting(
        ("/usr/bin/nvidia-smi", "--gpu-reset", "-i", "{gpu}"),
        doc="argv of a GPU reset; {gpu} is the NVML index, {node} the node",
    )
    driver_reload: tuple[str, ...] = setting(
        ("/usr/local/sbin/medic-driver-reload",),
        doc="argv that stops the driver's users, reloads the modules and starts them again",
    )
    requalify_checks: tuple[str, ...] = setting(
        (), doc="extra (deep) checks a node must pass before it returns"
    )
    webhook: dict[str, str] = field(
        default_factory=dict, metadata=bounds(doc="see remediation.webhook")
    )

    def problems(self) -> Iterator[tuple[str, str, str]]:
        return iter(())

    @classmethod
    def from_config(cls, config: MedicConfig) -> RemediationSettings:
        table = {k: v for k, v in config.table("remediation").items() if k != "webhook"}
        return parse_check_config(  # type: ignore[type-var]
            cls, table, prefix="remediation", source=config.source
        )

"""Every settings table of medic.toml, typed, and the one loader that validates them all.

`load_settings(config)` parses every table (a check's own `[checks.<name>]` tables are the
sensors' and are parsed by healthd.checks). It runs at start-up, in `medic config check` and
on SIGHUP: a file that fails any table raises ConfigError (file, key, fix) and changes
nothing. Each part of Medic takes its table from the bundle instead of parsing its own.

The tables live with the part of Medic they configure: medic_core.node_settings ([healthd],
[hooks]), medic_core.remediation_settings ([remediation] and its isolation, spares, burn_in and
evidence), medic_core.sweep_settings ([sweep]), medic_core.webhook_settings
([remediation.webhook]); medic_core.hygiene_settings and pair_settings likewise. This module
re-exports the names Medic imports from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from medic_core.config import MedicConfig
from medic_core.node_settings import (
    DEFAULT_LAUNCH_BUDGET,
    GPU_MODES,
    DaemonSettings,
    HookSettings,
    deprecations,
    launch_budget_value,
)
from medic_core.remediation_settings import (
    BURN_IN_RUNGS,
    ISOLATION_PLACEHOLDERS,
    RUNG_NAMES,
    BurnInSettings,
    EvidenceSettings,
    IsolationSettings,
    RemediationSettings,
    SpareSettings,
)
from medic_core.sweep_settings import SweepSettings
from medic_core.webhook_settings import PREFIX, WebhookSettings, WebhookTable

__all__ = [
    "BURN_IN_RUNGS",
    "DEFAULT_LAUNCH_BUDGET",
    "GPU_MODES",
    "ISOLATION_PLACEHOLDERS",
    "PREFIX",
    "RUNG_NAMES",
    "BurnInSettings",
    "DaemonSettings",
    "EvidenceSettings",
    "HookSettings",
    "IsolationSettings",
    "RemediationSettings",
    "Settings",
    "SpareSettings",
    "SweepSettings",
    "WebhookSettings",
    "WebhookTable",
    "deprecations",
    "launch_budget_value",
    "load_settings",
]


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

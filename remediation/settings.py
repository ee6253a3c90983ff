"""The `[remediation]` table lives with every other table in medic_core.settings."""

from medic_core.settings import RUNG_NAMES as RUNG_NAMES
from medic_core.settings import RemediationSettings as RemediationSettings

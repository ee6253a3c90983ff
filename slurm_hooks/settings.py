"""The `[hooks]` table lives with every other table in medic_core.settings."""

from medic_core.settings import HookSettings as HookSettings

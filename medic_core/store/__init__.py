"""Medic's persistence: conditions and events in SQLite (a node) or PostgreSQL (a fleet).

    from medic_core.store import open_store, ConditionUpdate, Status

    with open_store("sqlite:////var/lib/medic/medic.db") as store:
        change = store.set_condition("gpu01", ConditionUpdate("gpu.xid", Status.CRITICAL,
                                     target="3", reason="gpu.xid.79"), now)

See docs/store.md.
"""

from medic_core.store.drain_records import DRAIN_HELD, DRAIN_KINDS, DRAIN_RECORDED, DRAIN_RESUMED
from medic_core.store.engine import BadStoreURL, StoreError
from medic_core.store.migrations import MIGRATIONS, Compat, Migration, MigrationResult, migrate
from medic_core.store.models import (
    Condition,
    ConditionChange,
    ConditionUpdate,
    DrainRecord,
    Event,
    Severity,
    Status,
    StoredInventory,
)
from medic_core.store.store import Store, open_configured_store, open_store
from medic_core.store.store_table import (
    DEFAULT_EVENT_RETENTION_DAYS,
    StoreSettings,
    default_url,
    store_settings,
)

__all__ = [
    "DEFAULT_EVENT_RETENTION_DAYS",
    "DRAIN_HELD",
    "DRAIN_KINDS",
    "DRAIN_RECORDED",
    "DRAIN_RESUMED",
    "MIGRATIONS",
    "BadStoreURL",
    "Compat",
    "Condition",
    "ConditionChange",
    "ConditionUpdate",
    "DrainRecord",
    "Event",
    "Migration",
    "MigrationResult",
    "Severity",
    "Status",
    "Store",
    "StoreError",
    "StoreSettings",
    "StoredInventory",
    "default_url",
    "migrate",
    "open_configured_store",
    "open_store",
    "store_settings",
]

"""The `[store]` table of medic.toml: the database's URL, the events' retention and the
PostgreSQL connection pool, read and checked (ConfigError naming the key and the fix)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from medic_core.config import ConfigError, MedicConfig, shown
from medic_core.store.engine import DEFAULT_POOL, DEFAULT_POOL_SIZE, POOLS, BadStoreURL, parse_url

DEFAULT_EVENT_RETENTION_DAYS = 90
STORE_KEYS = ("url", "event_retention_days", "pool", "pool_size")
MAX_POOL_SIZE = 50
MAX_RETENTION_DAYS = 36500  # a century: a number past it is a typo, not a policy


@dataclass(frozen=True)
class StoreSettings:
    """The `[store]` table of medic.toml."""

    url: str
    event_retention_days: int = DEFAULT_EVENT_RETENTION_DAYS
    pool: str = DEFAULT_POOL  # PostgreSQL: "queue" (idle connections kept) or "null"
    pool_size: int = DEFAULT_POOL_SIZE  # idle connections a "queue" pool keeps


def default_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'medic.db'}"


def store_settings(config: MedicConfig) -> StoreSettings:
    """Read and check `[store]`; raises ConfigError naming the key and the fix."""
    table = config.table("store")
    for key in table:
        if key not in STORE_KEYS:
            raise ConfigError(
                config.source, f"store.{key}", "unknown key", f"use one of: {', '.join(STORE_KEYS)}"
            )
    raw_url = table.get("url", default_url(config.paths.state_dir))
    if not isinstance(raw_url, str):
        raise ConfigError(
            config.source, "store.url", f"expected a string, got {shown(raw_url)}", "quote the URL"
        )
    try:
        parse_url(raw_url)
    except BadStoreURL as exc:
        raise ConfigError(config.source, "store.url", exc.problem, exc.fix) from None
    days = table.get("event_retention_days", DEFAULT_EVENT_RETENTION_DAYS)
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_RETENTION_DAYS:
        raise ConfigError(
            config.source,
            "store.event_retention_days",
            f"expected a whole number of days from 1 to {MAX_RETENTION_DAYS}, got {shown(days)}",
            f"give a number such as {DEFAULT_EVENT_RETENTION_DAYS}",
        )
    pool = table.get("pool", DEFAULT_POOL)
    if pool not in POOLS:
        raise ConfigError(
            config.source,
            "store.pool",
            f"expected one of {', '.join(POOLS)}, got {shown(pool)}",
            'use "queue" (connections kept, the default) or "null" (behind pgbouncer in'
            " transaction mode)",
        )
    size = table.get("pool_size", DEFAULT_POOL_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_POOL_SIZE:
        raise ConfigError(
            config.source,
            "store.pool_size",
            f"expected a whole number from 1 to {MAX_POOL_SIZE}, got {shown(size)}",
            f"give a number such as {DEFAULT_POOL_SIZE}",
        )
    return StoreSettings(url=raw_url, event_retention_days=days, pool=pool, pool_size=size)

"""The five settings a store-only command needs (`list`, `show`, `cancel`, `approve`,
`export`, `diff`, `ui`), from the same layers as `settings.load_settings`, without building
the whole settings model: those commands answer in about the time it takes to import
SQLAlchemy (scripts/bench.py measures the ratio)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from msgspec import Struct

from durable_agent.config.layers import default_config_path, merge_layers
from durable_agent.store.reads import Reads


class StoreOptions(Struct, frozen=True):
    """The settings of the same names in `Settings` (their defaults too: a test holds them equal)."""

    db: str
    durability: str = "full"
    store_retry_attempts: int = 12
    store_retry_seconds: float = 60.0
    lease_seconds: float = 30.0


def store_options(flags: Mapping[str, Any], env: Mapping[str, str]) -> StoreOptions:
    """The store settings from the same layers as `load_settings`. Plain valid values are
    taken as they are; anything else (a string for a number, a bad value) goes to the
    settings model, so the coercions and the refusals are its own, in its words."""
    merged = merge_layers(flags, env, path=default_config_path(env), kinds=_kinds)
    db, durability = merged["db"], merged.get("durability", "full")
    attempts, seconds = (
        merged.get("store_retry_attempts", 12),
        merged.get("store_retry_seconds", 60.0),
    )
    lease = merged.get("lease_seconds", 30.0)
    if (
        isinstance(db, str)
        and durability in ("full", "fast")
        and type(attempts) is int
        and attempts >= 1
        and _positive(seconds)
        and _positive(lease)
        and 1 <= lease <= 1e9
    ):
        return StoreOptions(db, durability, attempts, float(seconds), float(lease))
    from durable_agent.config.settings import load_settings  # (pydantic: only for such values)

    full = load_settings(flags, env)
    assert full.db is not None
    return StoreOptions(
        full.db,
        full.durability,
        full.store_retry_attempts,
        full.store_retry_seconds,
        full.lease_seconds,
    )


def _kinds() -> Mapping[str, str]:
    """The settings' names and kinds: only when a DURABLE_AGENT_* variable is set."""
    from durable_agent.config.settings import setting_kinds

    return setting_kinds()


def _positive(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value > 0


def open_store(db: str | None, env: Mapping[str, str]) -> Any:
    """The store for `--db` (or the layers' default), for the store-only commands."""
    from durable_agent.store.runs import open_store as open_

    return open_(store_options({"db": db}, env))


def run_reads(db: str | None, env: Mapping[str, str]) -> Reads:
    """`list` and `show` for `--db` (store/reads.py): the whole store is opened only when
    the standard library's way does not answer."""
    return Reads(store_options({"db": db}, env).db, lambda: open_store(db, env))

"""How PostgreSQL spells what the shared SQL (engine.backends.sql) leaves open."""

from __future__ import annotations

from typing import Any

from engine.backends.sql import Dialect
from engine.ports.read_model import RECENT_OUTCOMES


def tenants_clause(column: str, tenants: frozenset[str] | None) -> tuple[str | None, list[Any]]:
    """The SQL condition keeping only rows of `tenants` (None: every tenant, no condition)."""
    if tenants is None:
        return None, []
    if not tenants:
        return "false", []  # a scope with no tenant sees nothing
    return f"{column} = ANY(%s)", [sorted(tenants)]


def _starts_with(column: str, prefix: str) -> tuple[str, list[Any]]:
    return f"starts_with({column}, %s)", [prefix]


# The newest runs of each schedule row, newest first (see Dialect.recent). string_agg is given
# the order itself: SQL does not promise an aggregate sees a subquery's rows in its ORDER BY.
_RECENT = (
    "(SELECT string_agg(x, ' ' ORDER BY slot_at DESC, id DESC) FROM ("
    "SELECT r.state || ':' || coalesce((r.finished_at - r.started_at)::text, '') AS x, "
    "r.slot_at, r.id FROM runs r WHERE r.schedule_id = schedules.id "
    f"ORDER BY r.slot_at DESC, r.id DESC LIMIT {RECENT_OUTCOMES}) AS recent)"
)
# The distinct chains by hopping along the primary key (one seek per chain), not by reading
# every entry: a chain holds an entry per fire.
_CHAINS = (
    "WITH RECURSIVE c(chain) AS (SELECT min(chain) FROM audit_entries UNION ALL "
    "SELECT (SELECT min(e.chain) FROM audit_entries e WHERE e.chain > c.chain) FROM c "
    "WHERE c.chain IS NOT NULL) SELECT chain FROM (SELECT chain FROM c WHERE chain IS NOT NULL "
    'UNION SELECT chain FROM audit_verified) AS chains ORDER BY chain COLLATE "C"'
)

DIALECT = Dialect(
    mark="%s",
    named="%({})s",
    in_list="{column} = ANY({mark}::{type}[])",
    bind_list=list,
    tenants=tenants_clause,
    starts_with=_starts_with,
    byte_order=' COLLATE "C"',  # whatever the database's collation
    recent=_RECENT,
    # Ties are broken by id, so pages read in separate snapshots agree on the order.
    due_order="next_fire_at, id",
    # Byte order, as SQLite sorts them (whatever the database's collation), through the index
    # `schedules_idle_by_name`, which is partial on NOT (DUE).
    idle_order='tenant COLLATE "C", name COLLATE "C"',
    chains=_CHAINS,
)

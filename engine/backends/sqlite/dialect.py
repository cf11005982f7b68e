"""How SQLite spells what the shared SQL (engine.backends.sql) leaves open."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.backends.sql import Dialect
from engine.ports.read_model import RECENT_OUTCOMES


def tenants_clause(column: str, tenants: frozenset[str] | None) -> tuple[str | None, list[str]]:
    """The SQL condition keeping only rows of `tenants` (None: every tenant, no condition)."""
    if tenants is None:
        return None, []
    if not tenants:
        return "0", []  # a scope with no tenant sees nothing
    return f"{column} IN ({', '.join('?' * len(tenants))})", sorted(tenants)


def _starts_with(column: str, prefix: str) -> tuple[str, list[Any]]:
    return f"substr({column}, 1, ?) = ?", [len(prefix), prefix]


def _json_list(values: Sequence[Any]) -> str:
    return json.dumps(list(values))


# The distinct chains by hopping along the primary key (one seek per chain), not by reading
# every entry: a chain holds an entry per fire.
CHAINS = (
    "WITH RECURSIVE c(chain) AS (SELECT min(chain) FROM audit_entries UNION ALL "
    "SELECT (SELECT min(chain) FROM audit_entries WHERE chain > c.chain) FROM c "
    "WHERE c.chain IS NOT NULL) SELECT chain FROM c WHERE chain IS NOT NULL "
    "UNION SELECT chain FROM audit_verified UNION SELECT chain FROM audit_chains ORDER BY 1"
)

# The newest runs of each schedule row, newest first (see Dialect.recent).
_RECENT = (
    "(SELECT group_concat(x, ' ') FROM (SELECT r.state || ':' || "
    "coalesce(r.finished_at - r.started_at, '') AS x FROM runs r "
    f"WHERE r.schedule_id = schedules.id ORDER BY r.slot_at DESC LIMIT {RECENT_OUTCOMES}))"
)

# SQLite has no arrays: a list is bound as JSON text and read back with json_each.
DIALECT = Dialect(
    mark="?",
    named=":{}",
    in_list="{column} IN (SELECT value FROM json_each({mark}))",
    bind_list=_json_list,
    tenants=tenants_clause,
    starts_with=_starts_with,
    byte_order="",  # SQLite compares text byte by byte already
    recent=_RECENT,
    due_order="next_fire_at",
    # Byte order (SQLite's BINARY collation), along the UNIQUE (tenant, name) index.
    idle_order="tenant, name",
    chains=CHAINS,
)

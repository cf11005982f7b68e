"""The audit log in PostgreSQL: appends inside the caller's transaction, or their own.

Writers on many hosts append to the same chains, so each append first takes a
transaction-scoped advisory lock per chain it touches (in chain order, so two appends touching
the same chains cannot deadlock), and only then reads the chains' heads: the next writer of a
chain waits for this transaction to end and then reads the head it wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from engine.backends.audit import (
    CHECKPOINT_COLUMNS,
    COLUMNS,
    KeySource,
    SqlAuditLog,
    entry_values,
    seal_events,
)
from engine.backends.postgres.connection import (
    PgPool,
    advisory_key,
    rows,
    storage_errors,
    write_tx,
)
from engine.domain.audit import GENESIS, AuditEntry, AuditEvent, ChainPoint, KeyRing

if TYPE_CHECKING:
    import psycopg

    from engine.backends.postgres.connection import Row

__all__ = ["KeySource", "PostgresAuditLog", "append_in"]

# Locks in the order of the array (a function scan yields its rows in order).
_LOCK = "SELECT pg_advisory_xact_lock(k) FROM unnest(%b::bigint[]) AS l(k)"
# Each chain's head through the primary key, one seek per chain.
_HEADS = (
    "SELECT c.chain, h.seq, h.hash FROM unnest(%b::text[]) AS c(chain) "
    "LEFT JOIN LATERAL (SELECT seq, hash FROM audit_entries WHERE chain = c.chain "
    "ORDER BY seq DESC LIMIT 1) AS h ON true"
)
# Entries and the checkpoints they complete, in one statement whatever their number; arrays
# in binary (%b), which psycopg writes several times faster than text.
_INSERT = (
    f"WITH checkpoints AS (INSERT INTO audit_checkpoints ({CHECKPOINT_COLUMNS}) "
    "SELECT * FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::text[], %b::text[])) "
    f"INSERT INTO audit_entries ({COLUMNS}) SELECT * FROM unnest(%b::text[], %b::bigint[], "
    "%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::bigint[], %b::text[], "
    "%b::text[], %b::text[], %b::text[], %b::text[])"
)
# The distinct chains by hopping along the primary key (one seek per chain), not by reading
# every entry (a chain holds an entry per fire); in byte order, as SQLite sorts them.
_CHAINS = (
    "WITH RECURSIVE c(chain) AS (SELECT min(chain) FROM audit_entries UNION ALL "
    "SELECT (SELECT min(chain) FROM audit_entries WHERE chain > c.chain) FROM c "
    "WHERE c.chain IS NOT NULL) "
    "SELECT chain FROM (SELECT chain FROM c WHERE chain IS NOT NULL "
    'UNION SELECT chain FROM audit_verified) AS u ORDER BY chain COLLATE "C"'
)


def _columns(records: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows as one list per column (for unnest)."""
    return [list(column) for column in zip(*records, strict=True)] or [[] for _ in range(width)]


def append_in(
    conn: psycopg.Connection[Row], events: Sequence[AuditEvent], now_ms: int, keys: KeyRing
) -> list[AuditEntry]:
    """Append inside the transaction `conn` holds (or a transaction of its own when it holds
    none): the entries land or fail with it. Three round trips whatever the number of events
    and chains."""
    if not events:
        return []
    # The locks last until the transaction ends: without one of the caller's, take our own.
    idle = conn.info.transaction_status.name == "IDLE"
    with write_tx(conn) if idle else nullcontext(conn):
        chains = sorted({event.chain for event in events})
        conn.execute(_LOCK, ([advisory_key(f"audit:{chain}") for chain in chains],))
        # Read only now: under READ COMMITTED this statement sees every append committed
        # before the locks were granted.
        heads = {
            chain: ChainPoint(0, GENESIS) if seq is None else ChainPoint(seq, head)
            for chain, seq, head in rows(conn, _HEADS, (chains,))
        }
        sealed, checkpoints = seal_events(events, heads.__getitem__, now_ms, keys)
        conn.execute(
            _INSERT, (*_columns(checkpoints, 5), *_columns([entry_values(e) for e in sealed], 13))
        )
    return sealed


class PostgresAuditLog(SqlAuditLog[PgPool]):
    CHAINS = _CHAINS

    def append(self, events: Sequence[AuditEvent]) -> list[AuditEntry]:
        if not events:
            return []
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            return append_in(conn, events, self._clock.now_ms(), self.keys())

    def append_in(
        self, conn: psycopg.Connection[Row], events: Sequence[AuditEvent], now_ms: int
    ) -> list[AuditEntry]:
        """`append` inside the transaction `conn` holds, at `now_ms` (dispatch appends each
        fire's entry in the transaction that writes the fire)."""
        return append_in(conn, events, now_ms, self.keys())

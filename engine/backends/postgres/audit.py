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

from engine.backends.postgres.connection import (
    PgPool,
    advisory_key,
    rows,
    storage_errors,
    write_tx,
)
from engine.backends.sql.audit import (
    CHECKPOINT_COLUMNS,
    COLUMNS,
    KeySource,
    SqlAuditLog,
    entry_values,
    seal_events,
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
    "%b::text[], %b::text[], %b::text[], %b::text[], %b::text[])"
)
# The distinct chains by hopping along the primary key (one seek per chain), not by reading
# every entry (a chain holds an entry per fire); in byte order, as SQLite sorts them.
_CHAINS = (
    "WITH RECURSIVE c(chain) AS (SELECT min(chain) FROM audit_entries UNION ALL "
    "SELECT (SELECT min(chain) FROM audit_entries WHERE chain > c.chain) FROM c "
    "WHERE c.chain IS NOT NULL) "
    "SELECT chain FROM (SELECT chain FROM c WHERE chain IS NOT NULL "
    "UNION SELECT chain FROM audit_verified UNION SELECT chain FROM audit_chains) AS u "
    'ORDER BY chain COLLATE "C"'
)


def _columns(records: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows as one list per column (for unnest)."""
    return [list(column) for column in zip(*records, strict=True)] or [[] for _ in range(width)]


def append_in(
    conn: psycopg.Connection[Row],
    events: Sequence[AuditEvent],
    now_ms: int,
    log: PostgresAuditLog,
    *,
    keys: KeyRing | None = None,
) -> list[AuditEntry]:
    """Append inside the transaction `conn` holds (or a transaction of its own when it holds
    none): the entries land or fail with it. A few round trips whatever the number of events
    and chains."""
    if not events:
        return []
    # The locks last until the transaction ends: without one of the caller's, take our own.
    idle = conn.info.transaction_status.name == "IDLE"
    with write_tx(conn) if idle else nullcontext(conn):
        chains = sorted({event.chain for event in events})
        conn.execute(_LOCK, ([advisory_key(f"audit:{chain}") for chain in chains],))
        # Read only now: under READ COMMITTED these statements see every append, epoch seal
        # and rotation committed before the locks were granted (a seal holds every chain's).
        keys = keys or log.signing_keys(conn, now_ms)
        heads = {
            chain: ChainPoint(0, GENESIS) if seq is None else ChainPoint(seq, head)
            for chain, seq, head in rows(conn, _HEADS, (chains,))
        }
        opening = log.chain_openings(conn, chains)
        sealed, checkpoints = seal_events(events, heads.__getitem__, now_ms, keys, opening=opening)
        conn.execute(
            _INSERT, (*_columns(checkpoints, 5), *_columns([entry_values(e) for e in sealed], 14))
        )
        if opening:
            log.opened(conn, sealed)
    return sealed


class PostgresAuditLog(SqlAuditLog[PgPool]):
    CHAINS = _CHAINS

    def _append_in(
        self,
        conn: psycopg.Connection[Row],
        events: Sequence[AuditEvent],
        now_ms: int,
        keys: KeyRing,
    ) -> list[AuditEntry]:
        return append_in(conn, events, now_ms, self, keys=keys)

    def _lock_chains(self, conn: psycopg.Connection[Row], chains: Sequence[str]) -> None:
        # The same locks, in the same (sorted) order, as every append takes: no deadlock.
        conn.execute(_LOCK, ([advisory_key(f"audit:{c}") for c in sorted(chains)],))

    def append(self, events: Sequence[AuditEvent]) -> list[AuditEntry]:
        if not events:
            return []
        conn = self._pool.get()
        with storage_errors(self._pool.where):
            return append_in(conn, events, self._clock.now_ms(), self)

    def append_in(
        self, conn: psycopg.Connection[Row], events: Sequence[AuditEvent], now_ms: int
    ) -> list[AuditEntry]:
        """`append` inside the transaction `conn` holds, at `now_ms` (dispatch appends each
        batch's entry in the transaction that writes its fires)."""
        return append_in(conn, events, now_ms, self)

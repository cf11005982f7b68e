"""The audit log in PostgreSQL: appends inside the caller's transaction, or their own.

Writers on many hosts append to the same chains, so each append first takes a
transaction-scoped advisory lock per chain it touches (in chain order, so two appends touching
the same chains cannot deadlock), and only then reads the chains' heads: the next writer of a
chain waits for this transaction to end and then reads the head it wrote.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from engine.backends.postgres.connection import (
    PgPool,
    advisory_key,
    first,
    rows,
    storage_errors,
    write_tx,
)
from engine.backends.sqlite.audit import (
    COLUMNS,
    KeySource,
    _values,
    entry_from_row,
)
from engine.domain.audit import (
    CHECKPOINT_EVERY,
    GENESIS,
    AuditEntry,
    AuditEvent,
    ChainPoint,
    Checkpoint,
    KeyRing,
    checkpoint_message,
    seal,
)
from engine.domain.clock import Clock
from engine.domain.errors import AuditKeyMissing

if TYPE_CHECKING:
    import psycopg

    from engine.backends.postgres.connection import Row

__all__ = ["KeySource", "PostgresAuditLog", "append_in"]

_HEAD = "SELECT seq, hash FROM audit_entries WHERE chain = %s ORDER BY seq DESC LIMIT 1"
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
    "WITH checkpoints AS (INSERT INTO audit_checkpoints (chain, seq, hash, key_id, signature) "
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
        sealed: list[AuditEntry] = []
        checkpoints: list[tuple[str, int, str, str, str]] = []
        for event in events:
            head = heads[event.chain]
            entry = seal(event, seq=head.seq + 1, at=now_ms, prev_hash=head.hash, keys=keys)
            sealed.append(entry)
            heads[entry.chain] = ChainPoint(entry.seq, entry.hash)
            if entry.seq % CHECKPOINT_EVERY == 0:
                key_id, signature = keys.sign(
                    checkpoint_message(entry.chain, entry.seq, entry.hash)
                )
                checkpoints.append((entry.chain, entry.seq, entry.hash, key_id, signature))
        conn.execute(
            _INSERT, (*_columns(checkpoints, 5), *_columns([_values(e) for e in sealed], 13))
        )
    return sealed


class PostgresAuditLog:
    def __init__(self, pool: PgPool, clock: Clock, keys: KeySource | None) -> None:
        self._pool = pool
        self._clock = clock
        self._key_source = keys
        self._keys: KeyRing | None = None
        self._lock = threading.Lock()

    def keys(self) -> KeyRing:
        """The key ring, loaded on first need (a database that is only read never needs it)."""
        with self._lock:
            if self._keys is None:
                if self._key_source is None:
                    raise AuditKeyMissing(
                        "this engine was opened without an audit key: open it for writing"
                    )
                self._keys = self._key_source()
            return self._keys

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

    def is_empty(self) -> bool:
        with storage_errors(self._pool.where):
            return first(self._pool.get(), "SELECT 1 FROM audit_entries LIMIT 1") is None

    def head(self, chain: str) -> ChainPoint:
        with storage_errors(self._pool.where):
            found = first(self._pool.get(), _HEAD, (chain,))
        return ChainPoint(found[0], found[1]) if found else ChainPoint(0, GENESIS)

    def chains(self) -> list[str]:
        with storage_errors(self._pool.where):
            found = rows(self._pool.get(), _CHAINS)
        return [r[0] for r in found]

    def entries(self, chain: str, *, after_seq: int = 0, limit: int = 10_000) -> list[AuditEntry]:
        with storage_errors(self._pool.where):
            found = rows(
                self._pool.get(),
                f"SELECT {COLUMNS} FROM audit_entries WHERE chain = %s AND seq > %s "
                "ORDER BY seq LIMIT %s",
                (chain, after_seq, limit),
            )
        return [entry_from_row(r) for r in found]

    def latest(self, chain: str | None = None, *, limit: int = 20) -> list[AuditEntry]:
        sql = f"SELECT {COLUMNS} FROM audit_entries WHERE chain = %s ORDER BY seq DESC LIMIT %s"
        wanted = [chain] if chain is not None else self.chains()
        found: list[AuditEntry] = []
        with storage_errors(self._pool.where):
            conn = self._pool.get()
            for one in wanted:  # each chain's newest through its key, then merged by time
                found += [entry_from_row(r) for r in rows(conn, sql, (one, limit))]
        found.sort(key=lambda e: (e.at, e.chain, e.seq), reverse=True)
        return found[:limit]

    def checkpoints(self, chain: str, *, after_seq: int = 0) -> list[Checkpoint]:
        with storage_errors(self._pool.where):
            found = rows(
                self._pool.get(),
                "SELECT chain, seq, hash, key_id, signature FROM audit_checkpoints "
                "WHERE chain = %s AND seq > %s ORDER BY seq",
                (chain, after_seq),
            )
        return [Checkpoint(*r) for r in found]

    def verified(self, chain: str) -> Checkpoint | None:
        with storage_errors(self._pool.where):
            found = first(
                self._pool.get(),
                "SELECT chain, seq, hash, key_id, signature FROM audit_verified WHERE chain = %s",
                (chain,),
            )
        return None if found is None else Checkpoint(*found)

    def mark_verified(self, chain: str, point: ChainPoint) -> None:
        key_id, signature = self.keys().sign(checkpoint_message(chain, point.seq, point.hash))
        with storage_errors(self._pool.where):
            self._pool.get().execute(
                "INSERT INTO audit_verified (chain, seq, hash, verified_at, key_id, signature) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (chain) DO UPDATE SET "
                "seq = excluded.seq, hash = excluded.hash, verified_at = excluded.verified_at, "
                "key_id = excluded.key_id, signature = excluded.signature",
                (chain, point.seq, point.hash, self._clock.now_ms(), key_id, signature),
            )

"""The audit log in SQLite: appends inside the caller's write transaction, or their own."""

from __future__ import annotations

from collections.abc import Sequence

import apsw

from engine.backends.sql.audit import (
    CHECKPOINT_COLUMNS,
    COLUMNS,
    KeySource,
    SqlAuditLog,
    entry_from_row,
    entry_values,
    head_sql,
    seal_events,
)
from engine.backends.sqlite.connection import ConnectionPool
from engine.backends.sqlite.dialect import CHAINS
from engine.domain.audit import GENESIS, AuditEntry, AuditEvent, ChainPoint, KeyRing

# The codec stays importable from here (the read model reads entries through it).
__all__ = ["CHAINS", "COLUMNS", "KeySource", "SqliteAuditLog", "append_in", "entry_from_row"]

_INSERT = f"INSERT INTO audit_entries ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_CHECKPOINT = f"INSERT INTO audit_checkpoints ({CHECKPOINT_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
_HEAD = head_sql("?")


def append_in(
    conn: apsw.Connection,
    events: Sequence[AuditEvent],
    now_ms: int,
    log: SqliteAuditLog,
    *,
    keys: KeyRing | None = None,
) -> list[AuditEntry]:
    """Append inside the transaction `conn` holds (the caller's BEGIN IMMEDIATE serialises
    every writer of the file, so reading a chain's head here is race-free), signed with the
    database's current key (`keys`: that ring, already checked in this transaction)."""
    if not events:
        return []
    keys = keys or log.signing_keys(conn, now_ms)

    def head(chain: str) -> ChainPoint:
        found = conn.execute(_HEAD, (chain,)).fetchone()
        return ChainPoint(found[0], found[1]) if found else ChainPoint(0, GENESIS)

    opening = log.chain_openings(conn, list(dict.fromkeys(e.chain for e in events)))
    sealed, checkpoints = seal_events(events, head, now_ms, keys, opening=opening)
    conn.executemany(_INSERT, [entry_values(e) for e in sealed])
    if checkpoints:
        conn.executemany(_INSERT_CHECKPOINT, checkpoints)
    if opening:
        log.opened(conn, sealed)
    return sealed


class SqliteAuditLog(SqlAuditLog[ConnectionPool]):
    CHAINS = CHAINS

    def _append_in(
        self, conn: apsw.Connection, events: Sequence[AuditEvent], now_ms: int, keys: KeyRing
    ) -> list[AuditEntry]:
        return append_in(conn, events, now_ms, self, keys=keys)

    def append(self, events: Sequence[AuditEvent]) -> list[AuditEntry]:
        if not events:
            return []
        with self._pool.transaction() as conn:
            # Only once the write lock is ours: a database that cannot be written must not
            # leave a new key file behind.
            return append_in(conn, events, self._clock.now_ms(), self)

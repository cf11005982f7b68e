"""The audit log in SQLite: appends inside the caller's write transaction, or their own."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import apsw

from engine.backends.sqlite.connection import ConnectionPool, Row, rows, storage_errors, write_tx
from engine.domain.audit import (
    CHECKPOINT_EVERY,
    GENESIS,
    AuditEntry,
    AuditEvent,
    ChainPoint,
    Checkpoint,
    KeyRing,
    canonical,
    checkpoint_message,
    seal,
    with_data_json,
)
from engine.domain.clock import Clock
from engine.domain.errors import AuditKeyMissing

COLUMNS = (
    "chain, seq, event, actor, tenant, schedule_id, slot_key, at, data, prev_hash, hash, "
    "key_id, signature"
)
_INSERT = f"INSERT INTO audit_entries ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_HEAD = "SELECT seq, hash FROM audit_entries WHERE chain = ? ORDER BY seq DESC LIMIT 1"
# The distinct chains by hopping along the primary key (one seek per chain), not by reading
# every entry: a chain holds an entry per fire.
CHAINS = (
    "WITH RECURSIVE c(chain) AS (SELECT min(chain) FROM audit_entries UNION ALL "
    "SELECT (SELECT min(chain) FROM audit_entries WHERE chain > c.chain) FROM c "
    "WHERE c.chain IS NOT NULL) SELECT chain FROM c WHERE chain IS NOT NULL "
    "UNION SELECT chain FROM audit_verified ORDER BY 1"
)

KeySource = Callable[[], KeyRing]


def entry_from_row(row: Row) -> AuditEntry:
    data_json = row[8]
    entry = AuditEntry(
        chain=row[0],
        seq=row[1],
        event=row[2],
        actor=row[3],
        tenant=row[4],
        schedule_id=row[5],
        slot_key=row[6],
        at=row[7],
        data=json.loads(data_json),
        prev_hash=row[9],
        hash=row[10],
        key_id=row[11],
        signature=row[12],
    )
    # Stored as sealed, the text is what the hash covers: the walk hashes it as it is.
    return with_data_json(entry, data_json)


def _values(entry: AuditEntry) -> tuple[Any, ...]:
    return (
        entry.chain,
        entry.seq,
        entry.event,
        entry.actor,
        entry.tenant,
        entry.schedule_id,
        entry.slot_key,
        entry.at,
        # The text sealed (and hashed), not encoded a second time.
        canonical(dict(entry.data)) if entry.data_json is None else entry.data_json,
        entry.prev_hash,
        entry.hash,
        entry.key_id,
        entry.signature,
    )


def append_in(
    conn: apsw.Connection, events: Sequence[AuditEvent], now_ms: int, keys: KeyRing
) -> list[AuditEntry]:
    """Append inside the transaction `conn` holds (the caller's BEGIN IMMEDIATE serialises
    every writer of the file, so reading a chain's head here is race-free)."""
    heads: dict[str, ChainPoint] = {}
    sealed: list[AuditEntry] = []
    checkpoints: list[tuple[Any, ...]] = []
    for event in events:
        chain = event.chain
        head = heads.get(chain)
        if head is None:
            found = conn.execute(_HEAD, (chain,)).fetchone()
            head = ChainPoint(found[0], found[1]) if found else ChainPoint(0, GENESIS)
        entry = seal(event, seq=head.seq + 1, at=now_ms, prev_hash=head.hash, keys=keys)
        sealed.append(entry)
        heads[chain] = ChainPoint(entry.seq, entry.hash)
        if entry.seq % CHECKPOINT_EVERY == 0:
            key_id, signature = keys.sign(checkpoint_message(chain, entry.seq, entry.hash))
            checkpoints.append((chain, entry.seq, entry.hash, key_id, signature))
    conn.executemany(_INSERT, [_values(e) for e in sealed])
    if checkpoints:
        conn.executemany(
            "INSERT INTO audit_checkpoints (chain, seq, hash, key_id, signature) "
            "VALUES (?, ?, ?, ?, ?)",
            checkpoints,
        )
    return sealed


class SqliteAuditLog:
    def __init__(self, pool: ConnectionPool, clock: Clock, keys: KeySource | None) -> None:
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
        with storage_errors(self._pool.path), write_tx(conn):
            # Only once the write lock is ours: a database that cannot be written must not
            # leave a new key file behind.
            return append_in(conn, events, self._clock.now_ms(), self.keys())

    def is_empty(self) -> bool:
        with storage_errors(self._pool.path):
            return (
                self._pool.get().execute("SELECT 1 FROM audit_entries LIMIT 1").fetchone() is None
            )

    def head(self, chain: str) -> ChainPoint:
        with storage_errors(self._pool.path):
            found = self._pool.get().execute(_HEAD, (chain,)).fetchone()
        return ChainPoint(found[0], found[1]) if found else ChainPoint(0, GENESIS)

    def chains(self) -> list[str]:
        with storage_errors(self._pool.path):
            found = rows(self._pool.get(), CHAINS)
        return [r[0] for r in found]

    def entries(self, chain: str, *, after_seq: int = 0, limit: int = 10_000) -> list[AuditEntry]:
        with storage_errors(self._pool.path):
            found = rows(
                self._pool.get(),
                f"SELECT {COLUMNS} FROM audit_entries WHERE chain = ? AND seq > ? "
                "ORDER BY seq LIMIT ?",
                (chain, after_seq, limit),
            )
        return [entry_from_row(r) for r in found]

    def latest(self, chain: str | None = None, *, limit: int = 20) -> list[AuditEntry]:
        sql = f"SELECT {COLUMNS} FROM audit_entries WHERE chain = ? ORDER BY seq DESC LIMIT ?"
        wanted = [chain] if chain is not None else self.chains()
        found: list[AuditEntry] = []
        with storage_errors(self._pool.path):
            conn = self._pool.get()
            for one in wanted:  # each chain's newest through its key, then merged by time
                found += [entry_from_row(r) for r in rows(conn, sql, (one, limit))]
        found.sort(key=lambda e: (e.at, e.chain, e.seq), reverse=True)
        return found[:limit]

    def checkpoints(self, chain: str, *, after_seq: int = 0) -> list[Checkpoint]:
        with storage_errors(self._pool.path):
            found = rows(
                self._pool.get(),
                "SELECT chain, seq, hash, key_id, signature FROM audit_checkpoints "
                "WHERE chain = ? AND seq > ? ORDER BY seq",
                (chain, after_seq),
            )
        return [Checkpoint(*r) for r in found]

    def verified(self, chain: str) -> Checkpoint | None:
        with storage_errors(self._pool.path):
            found = rows(
                self._pool.get(),
                "SELECT chain, seq, hash, key_id, signature FROM audit_verified WHERE chain = ?",
                (chain,),
            )
        return Checkpoint(*found[0]) if found else None

    def mark_verified(self, chain: str, point: ChainPoint) -> None:
        key_id, signature = self.keys().sign(checkpoint_message(chain, point.seq, point.hash))
        conn = self._pool.get()
        with storage_errors(self._pool.path), write_tx(conn):
            conn.execute(
                "INSERT INTO audit_verified (chain, seq, hash, verified_at, key_id, signature) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (chain) DO UPDATE SET seq = excluded.seq, "
                "hash = excluded.hash, verified_at = excluded.verified_at, "
                "key_id = excluded.key_id, signature = excluded.signature",
                (chain, point.seq, point.hash, self._clock.now_ms(), key_id, signature),
            )

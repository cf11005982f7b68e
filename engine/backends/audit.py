"""The audit log on either SQL backend: the row codec, sealing a batch of events, and the
reads, one SQL for both.

How an append learns each chain's head safely differs (SQLite's single writer, PostgreSQL's
advisory locks), so each backend appends on its own; both seal through `seal_events`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from engine.backends.sql import Row, SqlPool, first
from engine.domain.audit import (
    CHECKPOINT_EVERY,
    GENESIS,
    AuditEntry,
    AuditEvent,
    ChainPoint,
    Checkpoint,
    KeyRing,
    VerificationMark,
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
CHECKPOINT_COLUMNS = "chain, seq, hash, key_id, signature"

KeySource = Callable[[], KeyRing]
# A checkpoint row, in the order of CHECKPOINT_COLUMNS.
CheckpointRow = tuple[str, int, str, str, str]

P = TypeVar("P", bound=SqlPool[Any])


# Each chain's newest sequence number, hopping along the primary key: one seek per chain.
HEADS = (
    "WITH RECURSIVE c(chain) AS (SELECT min(chain) FROM audit_entries UNION ALL "
    "SELECT (SELECT min(chain) FROM audit_entries WHERE chain > c.chain) FROM c "
    "WHERE c.chain IS NOT NULL) SELECT chain, "
    "(SELECT max(seq) FROM audit_entries e WHERE e.chain = c.chain) FROM c "
    "WHERE chain IS NOT NULL"
)


def head_sql(mark: str) -> str:
    """A chain's newest entry (seq, hash), through the primary key."""
    return f"SELECT seq, hash FROM audit_entries WHERE chain = {mark} ORDER BY seq DESC LIMIT 1"


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


def entry_values(entry: AuditEntry) -> tuple[Any, ...]:
    """The row for COLUMNS, in order."""
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


def seal_events(
    events: Sequence[AuditEvent],
    head: Callable[[str], ChainPoint],
    now_ms: int,
    keys: KeyRing,
) -> tuple[list[AuditEntry], list[CheckpointRow]]:
    """The entries sealing `events` in order, each chain continuing from `head(chain)` (asked
    once per chain, under whatever makes it race-free), and the checkpoints they complete."""
    heads: dict[str, ChainPoint] = {}
    sealed: list[AuditEntry] = []
    checkpoints: list[CheckpointRow] = []
    for event in events:
        at = heads.get(event.chain)
        if at is None:
            at = head(event.chain)
        entry = seal(event, seq=at.seq + 1, at=now_ms, prev_hash=at.hash, keys=keys)
        sealed.append(entry)
        heads[entry.chain] = ChainPoint(entry.seq, entry.hash)
        if entry.seq % CHECKPOINT_EVERY == 0:
            key_id, signature = keys.sign(checkpoint_message(entry.chain, entry.seq, entry.hash))
            checkpoints.append((entry.chain, entry.seq, entry.hash, key_id, signature))
    return sealed, checkpoints


class SqlAuditLog(Generic[P]):
    """The audit log's key ring and reads; a backend adds `append` and says how its distinct
    chains are listed (`CHAINS`)."""

    # The distinct chains, in byte order.
    CHAINS: ClassVar[str]

    def __init__(self, pool: P, clock: Clock, keys: KeySource | None) -> None:
        self._pool = pool
        self._clock = clock
        self._key_source = keys
        self._keys: KeyRing | None = None
        self._lock = threading.Lock()
        self._mark = pool.dialect.mark

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

    def is_empty(self) -> bool:
        return first(self._pool, "SELECT 1 FROM audit_entries LIMIT 1") is None

    def head(self, chain: str) -> ChainPoint:
        found = first(self._pool, head_sql(self._mark), (chain,))
        return ChainPoint(found[0], found[1]) if found else ChainPoint(0, GENESIS)

    def chains(self) -> list[str]:
        return [r[0] for r in self._pool.read(self.CHAINS)]

    def heads(self) -> dict[str, int]:
        return {str(chain): int(seq) for chain, seq in self._pool.read(HEADS)}

    def entries(self, chain: str, *, after_seq: int = 0, limit: int = 10_000) -> list[AuditEntry]:
        m = self._mark
        found = self._pool.read(
            f"SELECT {COLUMNS} FROM audit_entries WHERE chain = {m} AND seq > {m} "
            f"ORDER BY seq LIMIT {m}",
            (chain, after_seq, limit),
        )
        return [entry_from_row(r) for r in found]

    def latest(self, chain: str | None = None, *, limit: int = 20) -> list[AuditEntry]:
        m = self._mark
        sql = f"SELECT {COLUMNS} FROM audit_entries WHERE chain = {m} ORDER BY seq DESC LIMIT {m}"
        wanted = [chain] if chain is not None else self.chains()
        found: list[AuditEntry] = []
        for one in wanted:  # each chain's newest through its key, then merged by time
            found += [entry_from_row(r) for r in self._pool.read(sql, (one, limit))]
        found.sort(key=lambda e: (e.at, e.chain, e.seq), reverse=True)
        return found[:limit]

    def checkpoints(self, chain: str, *, after_seq: int = 0) -> list[Checkpoint]:
        m = self._mark
        found = self._pool.read(
            f"SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints "
            f"WHERE chain = {m} AND seq > {m} ORDER BY seq",
            (chain, after_seq),
        )
        return [Checkpoint(*r) for r in found]

    def verified(self, chain: str) -> VerificationMark | None:
        found = first(
            self._pool,
            f"SELECT {CHECKPOINT_COLUMNS}, verified_at FROM audit_verified "
            f"WHERE chain = {self._mark}",
            (chain,),
        )
        return None if found is None else VerificationMark(*found)

    def mark_verified(self, chain: str, point: ChainPoint) -> None:
        key_id, signature = self.keys().sign(checkpoint_message(chain, point.seq, point.hash))
        self._pool.write(
            "INSERT INTO audit_verified (chain, seq, hash, verified_at, key_id, signature) "
            f"VALUES ({self._pool.dialect.marks(6)}) ON CONFLICT (chain) DO UPDATE SET "
            "seq = excluded.seq, hash = excluded.hash, verified_at = excluded.verified_at, "
            "key_id = excluded.key_id, signature = excluded.signature",
            (chain, point.seq, point.hash, self._clock.now_ms(), key_id, signature),
        )

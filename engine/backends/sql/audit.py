"""The audit log on either SQL backend: the row codec, sealing a batch of events, and the
reads, one SQL for both.

How an append learns each chain's head safely differs (SQLite's single writer, PostgreSQL's
advisory locks), so each backend appends on its own; both seal through `seal_events`.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from engine.backends.sql import Row, SqlPool, first
from engine.domain.audit import (
    CHAIN_OPENED,
    CHECKPOINT_EVERY,
    EPOCH_SEALED,
    GENESIS,
    KEY_ROTATED,
    Anchor,
    AuditEntry,
    AuditEvent,
    ChainPoint,
    Checkpoint,
    FiredRun,
    KeyRing,
    VerificationMark,
    anchor_message,
    canonical,
    chain_tenant,
    checkpoint_message,
    seal,
    with_data_json,
)
from engine.domain.audit_keys import (
    EpochKey,
    KeyKind,
    KeyLineage,
    KeyPeriod,
    LineageBroken,
    catch_up,
    endorse,
)
from engine.domain.clock import Clock
from engine.domain.errors import AuditKeyMismatch, AuditKeyMissing
from engine.domain.timeutil import iso_utc

# Anchor and anchor_message are the domain's; kept importable from here.
__all__ = ["COLUMNS", "Anchor", "SqlAuditLog", "anchor_message", "entry_from_row", "seal_events"]

COLUMNS = (
    "chain, seq, event, actor, tenant, schedule_id, slot_key, at, data, prev_hash, hash, "
    "key_id, signature, seal"
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
        seal=row[13],
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
        entry.seal,
    )


def seal_events(
    events: Sequence[AuditEvent],
    head: Callable[[str], ChainPoint],
    now_ms: int,
    keys: KeyRing,
    *,
    opening: Mapping[str, str] | None = None,
) -> tuple[list[AuditEntry], list[CheckpointRow]]:
    """The entries sealing `events` in order, each chain continuing from `head(chain)` (asked
    once per chain, under whatever makes it race-free), and the checkpoints they complete
    (signed with Ed25519: an auditor checks them). A chain in `opening` (chain -> database
    id) first gets its opening entry, naming the database and the key."""
    heads: dict[str, ChainPoint] = {}
    sealed: list[AuditEntry] = []
    checkpoints: list[CheckpointRow] = []
    pending = dict(opening or {})

    def add(event: AuditEvent, at: ChainPoint) -> ChainPoint:
        entry = seal(event, seq=at.seq + 1, at=now_ms, prev_hash=at.hash, keys=keys)
        sealed.append(entry)
        if entry.seq % CHECKPOINT_EVERY == 0:
            signature = keys.seal(checkpoint_message(entry.chain, entry.seq, entry.hash))
            checkpoints.append((entry.chain, entry.seq, entry.hash, keys.active_id, signature))
        return ChainPoint(entry.seq, entry.hash)

    for event in events:
        chain = event.chain
        at = heads.get(chain)
        if at is None:
            at = head(chain)
        database_id = pending.pop(chain, None)
        if database_id is not None:
            at = add(opening_event(event, database_id, keys), at)
        heads[chain] = add(event, at)
    return sealed, checkpoints


def opening_event(first: AuditEvent, database_id: str, keys: KeyRing) -> AuditEvent:
    """The entry a chain opens with: which database it belongs to, and its key."""
    return AuditEvent(
        CHAIN_OPENED,
        actor=first.actor,
        tenant=first.tenant,
        data={
            "database_id": database_id,
            "epoch": keys.epoch,
            "key_id": keys.active_id,
            "public_key": keys.public_key,
        },
    )


def fired_row(row: Row) -> FiredRun:
    return (int(row[0]), str(row[2]), str(row[3]), int(row[4]), int(row[5]))


NEWEST_KEY = "SELECT epoch, key_id FROM audit_keys ORDER BY epoch DESC LIMIT 1"
DATABASE_ID = "SELECT database_id FROM audit_identity"
_LINEAGE = (
    "SELECT epoch, key_id, public_key, kind, started_at, endorsement FROM audit_keys ORDER BY epoch"
)


def read_identity(
    query: Callable[..., Sequence[Row]],
) -> tuple[str, list[KeyPeriod]] | None:
    """(database id, key lineage rows) through `query(sql)`; None when none is recorded."""
    found = list(query(DATABASE_ID))
    if not found:
        return None
    periods = [
        KeyPeriod(int(r[0]), str(r[1]), str(r[2]), KeyKind(str(r[3])), int(r[4]), str(r[5]))
        for r in query(_LINEAGE)
    ]
    return str(found[0][0]), periods


def record_root(conn: Any, mark: str, ring: KeyRing, now_ms: int) -> None:
    """Record the database's id and root key unless another process just did (its stay)."""
    if ring.epoch != 0:
        # A key of a later epoch cannot be a new database's root: it came from elsewhere.
        raise AuditKeyMismatch(
            f"this node's audit key {ring.active_id} is of epoch {ring.epoch}, and this "
            "database records no audit key yet: it belongs to another database; use this "
            "database's own key file, or a new key for a new database"
        )
    database_id = uuid.uuid4().hex
    conn.execute(
        f"INSERT INTO audit_identity (one, database_id, created_at) VALUES (1, {mark}, {mark}) "
        "ON CONFLICT (one) DO NOTHING",
        (database_id, now_ms),
    )
    stored = conn.execute(DATABASE_ID).fetchone()
    root = endorse(str(stored[0]), ring.current, ring.current, KeyKind.ROOT, now_ms)
    conn.execute(
        "INSERT INTO audit_keys (epoch, key_id, public_key, kind, started_at, endorsement) "
        f"VALUES (0, {mark}, {mark}, 'root', {mark}, {mark}) ON CONFLICT DO NOTHING",
        (root.key_id, root.public_key, root.started_at, root.endorsement),
    )


def key_mismatch(
    ring: KeyRing, epoch: int, key_id: str, periods: Sequence[KeyPeriod]
) -> AuditKeyMismatch:
    """The refusal when this process's key is not the database's, naming both."""
    ours = f"{ring.active_id} (epoch {ring.epoch})"
    theirs = f"{key_id} (epoch {epoch})"
    known = {p.key_id: p for p in periods}
    if ring.active_id in known and known[ring.active_id].epoch < epoch:
        following = periods[known[ring.active_id].epoch + 1]
        return AuditKeyMismatch(
            f"this node's audit key {ours} was retired: the database signs with {theirs} "
            f"since a {following.kind.value} key at {iso_utc(following.started_at)}. Copy the "
            "key file from the host that rotated it (`vortos audit rotate-key` wrote it) to "
            "this node, then start it again"
        )
    return AuditKeyMismatch(
        f"this node's audit key is {ours}, but the database signs with {theirs}: a key made "
        "for another database, or made on this host by a concurrent `db migrate`/`db init`. "
        "Use the database's key file (the one whose fingerprint is the second), from the "
        "host that made it, on every node"
    )


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
        # The newest key whose lineage this process checked (once per key, not per write).
        self._lineage_held: str | None = None

    @property
    def clock(self) -> Clock:
        """The store's clock (dispatch reads it again after a wait, for dispatched_at)."""
        return self._clock

    def keys(self) -> KeyRing:
        """The key ring, loaded on first need (a database that is only read never needs it)."""
        with self._lock:
            if self._keys is None:
                self._keys = self._load_keys()
            return self._keys

    def _load_keys(self) -> KeyRing:
        if self._key_source is None:
            raise AuditKeyMissing(
                "this engine was opened without an audit key: open it for writing"
            )
        return self._key_source()

    # -- the key lineage ------------------------------------------------------------------

    def identity(self) -> tuple[str, list[KeyPeriod]] | None:
        """The database's id and its key lineage as stored (unchecked); None before the
        first key was recorded."""
        return read_identity(lambda sql, args=(): self._pool.read(sql, args))

    def establish(self) -> KeyRing:
        """Check this process's key against the database's now, in a write transaction,
        recording it as the root when the database has none yet: a node, or a `db init`,
        with another deployment's key stops here (AuditKeyMismatch), not at its first fire."""
        with self._pool.transaction() as conn:
            return self.signing_keys(conn, self._clock.now_ms())

    def signing_keys(self, conn: Any, now_ms: int) -> KeyRing:
        """Inside a write transaction `conn` holds (after any chain lock): the ring to sign
        with, which must be the database's current key. The first key is recorded here, in
        the same transaction (so processes racing to make a database agree or lose); a key
        the database has moved on from is caught up (an evolved epoch is derived, a rotated
        one re-read from the key's source) or refused."""
        mark = self._mark
        found = conn.execute(NEWEST_KEY).fetchone()
        ring = self.keys()
        if found is None:
            record_root(conn, mark, ring, now_ms)
            found = conn.execute(NEWEST_KEY).fetchone()
            assert found is not None
        epoch, key_id = int(found[0]), str(found[1])
        if ring.epoch == epoch and ring.active_id == key_id:
            if self._lineage_held != key_id:
                self._check_lineage(conn, ring)
            return ring
        periods = read_identity(lambda sql, args=(): conn.execute(sql, args).fetchall())
        assert periods is not None
        adopted = self._adopt(ring, epoch, key_id, periods[1])
        if adopted is None:  # the source may hold the new key by now (a rotation)
            adopted = self._adopt(self._load_keys(), epoch, key_id, periods[1])
        if adopted is not None:
            self._check_lineage(conn, adopted)
            return adopted
        raise key_mismatch(ring, epoch, key_id, periods[1])

    def _check_lineage(self, conn: Any, ring: KeyRing) -> None:
        """Refuse to sign onto a lineage that does not follow from this key's root (its
        database id, a key's kind or time, an endorsement edited): verification would call
        every entry signed from now on forged."""
        found = read_identity(lambda sql, args=(): conn.execute(sql, args).fetchall())
        assert found is not None
        try:
            lineage = KeyLineage.checked(found[0], found[1], root_public_key=ring.root_public_key)
        except LineageBroken as exc:
            raise AuditKeyMismatch(
                f"the database's audit key lineage does not hold ({exc}): nothing is signed "
                "onto it. Run `vortos audit verify --full`, and restore the database from a "
                "backup"
            ) from None
        self._lineage_held = lineage.current.key_id

    def _adopt(
        self, ring: KeyRing, epoch: int, key_id: str, periods: Sequence[KeyPeriod]
    ) -> KeyRing | None:
        """`ring`, or its key evolved to the database's epoch, when that is the database's
        current key; kept from now on (an evolved one written back to its source, so the
        sealed epoch's key is gone there too)."""
        if ring.epoch == epoch and ring.active_id == key_id:
            adopted = ring
        else:
            caught = catch_up(ring.current, periods)
            if caught is None and ring.pending is not None:
                caught = catch_up(ring.pending, periods)  # a rotation that was under way
            if caught is None or caught.key_id != key_id:
                return None
            adopted = ring.moved_to(caught)
            adopted.persist()
        with self._lock:
            self._keys = adopted
        return adopted

    # -- epochs: sealing and rotating ------------------------------------------------------

    def _append_in(
        self, conn: Any, events: Sequence[AuditEvent], now_ms: int, keys: KeyRing
    ) -> list[AuditEntry]:
        """The backend's append inside `conn`'s transaction, signed with `keys`."""
        raise NotImplementedError

    def _lock_chains(self, conn: Any, chains: Sequence[str]) -> None:
        """Serialise with every append to `chains` until the transaction ends (SQLite's
        write lock already does)."""

    def transition(self, kind: KeyKind, new: EpochKey, actor: str) -> KeyPeriod:
        """Move the database to `new`, the next epoch's key (`evolved`: sealing the current
        epoch; `rotated`: a new key), in one transaction: an entry in every chain, signed
        and sealed by the current key, naming the new one; the lineage row, endorsed by the
        current key; the verification marks signed again. Then this process signs with the
        new key and its source is rewritten without the old one."""
        now = self._clock.now_ms()
        with self._pool.transaction() as conn:
            chains = [str(r[0]) for r in conn.execute(self.CHAINS).fetchall()]
            self._lock_chains(conn, chains)
            ring = self.signing_keys(conn, now)
            if new.epoch != ring.epoch + 1:
                raise AuditKeyMismatch(
                    f"the database's audit key moved to epoch {ring.epoch} meanwhile: try again"
                )
            event = EPOCH_SEALED if kind is KeyKind.EVOLVED else KEY_ROTATED
            data = {
                "epoch": ring.epoch,
                "next_epoch": new.epoch,
                "next_key_id": new.key_id,
                "next_public_key": new.public_key,
            }
            self._append_in(
                conn,
                [AuditEvent(event, actor=actor, tenant=chain_tenant(c), data=data) for c in chains],
                now,
                ring,
            )
            found = conn.execute(DATABASE_ID).fetchone()
            period = endorse(str(found[0]), ring.current, new, kind, now)
            m = self._mark
            conn.execute(
                "INSERT INTO audit_keys (epoch, key_id, public_key, kind, started_at, "
                f"endorsement) VALUES ({m}, {m}, {m}, {m}, {m}, {m})",
                (
                    period.epoch,
                    period.key_id,
                    period.public_key,
                    kind.value,
                    now,
                    period.endorsement,
                ),
            )
            # Verification marks stay as they are: each is signed with Ed25519 by the key of
            # its epoch, checkable from the lineage after that key is erased.
            moved = ring.moved_to(new)
        with self._lock:
            self._keys = moved
        moved.persist()
        return period

    def chain_openings(self, conn: Any, chains: Sequence[str]) -> dict[str, str]:
        """Of `chains`, those not opened yet (inside the write transaction), with the
        database id their opening names: one primary-key lookup per chain."""
        mark = self._mark
        opening: dict[str, str] = {}
        for chain in chains:
            if not conn.execute(
                f"SELECT 1 FROM audit_chains WHERE chain = {mark}", (chain,)
            ).fetchone():
                opening[chain] = ""
        if opening:
            found = conn.execute(DATABASE_ID).fetchone()
            assert found is not None, "signing_keys records the identity first"
            opening = dict.fromkeys(opening, str(found[0]))
        return opening

    def opened(self, conn: Any, entries: Sequence[AuditEntry]) -> None:
        """Record the openings among `entries`, in the same transaction."""
        mark = self._mark
        for entry in entries:
            if entry.event == CHAIN_OPENED:
                conn.execute(
                    f"INSERT INTO audit_chains (chain, opened_seq) VALUES ({mark}, {mark})",
                    (entry.chain, entry.seq),
                )

    def fired_runs(self, first_id: int, last_id: int) -> list[Row]:
        """Runs by id range, as a batch entry committed to them: (id, tenant, schedule id,
        slot key, slot at, due at), in id order."""
        m = self._mark
        return self._pool.read(
            f"SELECT id, tenant, schedule_id, slot_key, slot_at, due_at FROM runs "
            f"WHERE id >= {m} AND id <= {m} ORDER BY id",
            (first_id, last_id),
        )

    def scheduled_run_ids(self, tenant: str, after_id: int, limit: int) -> list[int]:
        """The ids of `tenant`'s dispatched (scheduled and backfilled) runs after `after_id`."""
        m = self._mark
        return [
            int(r[0])
            for r in self._pool.read(
                f"SELECT id FROM runs WHERE tenant = {m} AND id > {m} "
                f"AND (kind = 'scheduled' OR kind = 'backfill') ORDER BY id LIMIT {m}",
                (tenant, after_id, limit),
            )
        ]

    def tenants_with_history(self) -> list[str]:
        """Tenants with a schedule or a run: each must have its audit chain."""
        return sorted(
            str(r[0])
            for r in self._pool.read("SELECT tenant FROM schedules UNION SELECT tenant FROM runs")
        )

    def last_transition(self, chain: str, upto: int) -> AuditEntry | None:
        m = self._mark
        found = first(
            self._pool,
            f"SELECT {COLUMNS} FROM audit_entries WHERE chain = {m} AND seq <= {m} "
            f"AND (event = '{EPOCH_SEALED}' OR event = '{KEY_ROTATED}') "
            "ORDER BY seq DESC LIMIT 1",
            (chain, upto),
        )
        return None if found is None else entry_from_row(found)

    def anchor(self, chain: str) -> Anchor | None:
        m = self._mark
        found = first(
            self._pool,
            f"SELECT chain, seq, hash, key_id, at, signature, archive FROM audit_anchors "
            f"WHERE chain = {m}",
            (chain,),
        )
        return None if found is None else Anchor(*found)

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
        # Ed25519, by the current key: still checkable (from the lineage) once its epoch is
        # sealed and the secret erased.
        ring = self.keys()
        key_id, signature = (
            ring.active_id,
            ring.seal(checkpoint_message(chain, point.seq, point.hash)),
        )
        self._pool.write(
            "INSERT INTO audit_verified (chain, seq, hash, verified_at, key_id, signature) "
            f"VALUES ({self._pool.dialect.marks(6)}) ON CONFLICT (chain) DO UPDATE SET "
            "seq = excluded.seq, hash = excluded.hash, verified_at = excluded.verified_at, "
            "key_id = excluded.key_id, signature = excluded.signature",
            (chain, point.seq, point.hash, self._clock.now_ms(), key_id, signature),
        )

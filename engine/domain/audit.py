"""The audit chain: what an entry is, how it is sealed, and how a chain is checked (pure).

Every entry's hash covers its content and the previous entry's hash, so changing, removing,
inserting or reordering an entry breaks every link after it; every hash is signed with an
HMAC key that is never stored in the database, so a forged entry cannot be given a valid
signature without the key. A chain is one tenant's entries (`tenant:<name>`) or the system's
(`system`: leases, operators); sequence numbers start at 1 in each chain.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

from engine.domain.audit_keys import (
    MIN_KEY_BYTES,
    EpochKey,
    KeyLineage,
    key_fingerprint,
    verify_signed,
)

SYSTEM_CHAIN = "system"
GENESIS = hashlib.sha256(b"").hexdigest()  # the previous hash of a chain's first entry
CHECKPOINT_EVERY = 1000

# Entries about the chain itself: each carries an Ed25519 seal.
CHAIN_OPENED = "audit.chain_opened"  # a chain's first entry: its database and key
EPOCH_SEALED = "audit.epoch_sealed"  # the key evolves: the next epoch's key named
KEY_ROTATED = "audit.key_rotated"  # a new key drawn: named, endorsed by the old one
TRANSITIONS = frozenset({EPOCH_SEALED, KEY_ROTATED})
SEALED_EVENTS = frozenset({CHAIN_OPENED, *TRANSITIONS})
# One entry per dispatch transaction and tenant commits to all its fires (fires_digest).
FIRES_DISPATCHED = "fires.dispatched"
FIRES_BACKFILLED = "fires.backfilled"
FIRE_BATCHES = frozenset({FIRES_DISPATCHED, FIRES_BACKFILLED})

# What a batch entry commits to of each run: the columns no later change may touch.
FiredRun = tuple[int, str, str, int, int]  # run id, schedule id, slot key, slot at, due at


def fires_digest(runs: Iterable[FiredRun]) -> str:
    """SHA-256 over the runs of a batch, in run id order: deleting, editing, reordering or
    adding one changes it."""
    digest = hashlib.sha256()
    for run_id, schedule_id, key, slot_at, due_at in runs:
        digest.update(f"{run_id}\t{schedule_id}\t{key}\t{slot_at}\t{due_at}\n".encode())
    return digest.hexdigest()


def run_ranges(run_ids: Iterable[int]) -> list[list[int]]:
    """Sorted ids as [first, count] runs of consecutive ids: one pair for a SQLite batch."""
    ranges: list[list[int]] = []
    for run_id in sorted(run_ids):
        if ranges and ranges[-1][0] + ranges[-1][1] == run_id:
            ranges[-1][1] += 1
        else:
            ranges.append([run_id, 1])
    return ranges


def summary(event: str, data: Mapping[str, Any]) -> str | None:
    """A short line for the entries about fires and keys, whose data is for machines (a
    digest, id ranges, public keys); None for the others."""
    try:
        if event in FIRE_BATCHES:
            spans = [
                str(first) if n == 1 else f"{first}-{first + n - 1}" for first, n in data["runs"]
            ]
            shown = ", ".join(spans[:4]) + (f", +{len(spans) - 4} more" if len(spans) > 4 else "")
            return f"{data['count']} fire(s): run {shown}"
        if event == CHAIN_OPENED:
            return f"chain opened, key epoch {data['epoch']} (database and key in its data)"
        if event in TRANSITIONS:
            return f"key epoch {data['epoch']} -> {data['next_epoch']}: {data['next_key_id']}"
    except (KeyError, TypeError, ValueError):
        return None
    return None


def batch_data(runs: Sequence[FiredRun]) -> dict[str, Any]:
    """The data of a batch entry: how many runs, which ids, and the digest of them."""
    ordered = sorted(runs)
    return {
        "count": len(ordered),
        "runs": run_ranges(r[0] for r in ordered),
        "digest": fires_digest(ordered),
    }


def tenant_chain(tenant: str) -> str:
    return f"tenant:{tenant}"


def chain_tenant(chain: str) -> str | None:
    return chain.removeprefix("tenant:") if chain.startswith("tenant:") else None


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """Something to record: the service, the daemon and the dispatcher make these."""

    event: str  # e.g. schedule.paused, fires.dispatched, leader.acquired
    actor: str
    tenant: str | None = None  # None: the system chain
    schedule_id: str | None = None
    slot_key: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def chain(self) -> str:
        return SYSTEM_CHAIN if self.tenant is None else tenant_chain(self.tenant)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    chain: str
    seq: int
    event: str
    actor: str
    tenant: str | None
    schedule_id: str | None
    slot_key: str | None
    at: int  # ms since the epoch, UTC
    data: Mapping[str, Any]
    prev_hash: str
    hash: str
    key_id: str
    signature: str  # HMAC-SHA-256 of entry_message by the epoch key: the key's holder checks it
    # Ed25519 of entry_message by the epoch key's public half, on the entries an auditor
    # checks without the secret: chain openings, epoch seals and rotations (None on others).
    seal: str | None = None
    # The JSON text `data` was sealed as or read from, when known (`with_data_json`): hashed
    # as it is, it saves encoding `data` again. Not an argument, so that a changed copy
    # (`dataclasses.replace`) never carries the text of the data it was copied from.
    data_json: str | None = field(default=None, init=False, compare=False, repr=False)

    def computed_hash(self) -> str:
        """The hash its content and previous hash should have (what `hash` claims)."""
        fields = (
            self.chain,
            self.seq,
            self.event,
            self.actor,
            self.tenant,
            self.schedule_id,
            self.slot_key,
            self.at,
        )
        if self.data_json is not None:
            digest = _content_hash(*fields, self.data_json, self.prev_hash)
            if digest == self.hash:
                # The very text the hash was computed over, so the content is unchanged.
                return digest
            # Another text: the content changed, or the same content is spelled differently
            # (spaces, key order), which the hash does not tell apart. Decide on the content.
        return _content_hash(*fields, canonical(self.data), self.prev_hash)

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "seq": self.seq,
            "event": self.event,
            "actor": self.actor,
            "tenant": self.tenant,
            "schedule_id": self.schedule_id,
            "slot_key": self.slot_key,
            "at": self.at,
            "data": dict(self.data),
            "prev_hash": self.prev_hash,
            "hash": self.hash,
            "key_id": self.key_id,
            "signature": self.signature,
            "seal": self.seal,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> AuditEntry:
        return cls(
            chain=str(value["chain"]),
            seq=int(value["seq"]),
            event=str(value["event"]),
            actor=str(value["actor"]),
            tenant=value.get("tenant"),
            schedule_id=value.get("schedule_id"),
            slot_key=value.get("slot_key"),
            at=int(value["at"]),
            data=dict(value.get("data") or {}),
            prev_hash=str(value["prev_hash"]),
            hash=str(value["hash"]),
            key_id=str(value["key_id"]),
            signature=str(value["signature"]),
            seal=None if value.get("seal") is None else str(value["seal"]),
        )


def with_data_json(entry: AuditEntry, text: str) -> AuditEntry:
    """`entry`, which was just built with `data` decoded from `text` (or encoded as it by
    `canonical`), now knowing that text: its hash is checked against the text first."""
    object.__setattr__(entry, "data_json", text)  # frozen, and not an __init__ argument
    return entry


# json.dumps(value, **these) builds this encoder anew on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: the same bytes for the same content, always."""
    return _CANONICAL.encode(value)


def content_hash(
    *,
    chain: str,
    seq: int,
    event: str,
    actor: str,
    tenant: str | None,
    schedule_id: str | None,
    slot_key: str | None,
    at: int,
    data: Mapping[str, Any],
    prev_hash: str,
) -> str:
    return _content_hash(
        chain, seq, event, actor, tenant, schedule_id, slot_key, at, canonical(data), prev_hash
    )


def _content_hash(
    chain: str,
    seq: int,
    event: str,
    actor: str,
    tenant: str | None,
    schedule_id: str | None,
    slot_key: str | None,
    at: int,
    data_json: str,
    prev_hash: str,
) -> str:
    """SHA-256 of the canonical JSON of the ten fields, with `data` already encoded."""
    body = _plain_body(
        chain, seq, event, actor, tenant, schedule_id, slot_key, at, data_json, prev_hash
    )
    if body is None:  # let json spell what is around `data`
        before = canonical({"actor": actor, "at": at, "chain": chain})
        after = canonical(
            {
                "event": event,
                "prev_hash": prev_hash,
                "schedule_id": schedule_id,
                "seq": seq,
                "slot_key": slot_key,
                "tenant": tenant,
            }
        )
        body = f'{before[:-1]},"data":{data_json},{after[1:]}'
    return hashlib.sha256(body.encode()).hexdigest()


def _plain_body(
    chain: str,
    seq: int,
    event: str,
    actor: str,
    tenant: str | None,
    schedule_id: str | None,
    slot_key: str | None,
    at: int,
    data_json: str,
    prev_hash: str,
) -> str | None:
    """canonical() of the ten fields, a third of its cost: the keys in sorted order and each
    value spelled as json spells it. None unless the values are of their usual types (an edited
    export can hold others)."""
    if type(seq) is not int or type(at) is not int:  # a bool or an int subclass: json's way
        return None
    try:
        return (
            f'{{"actor":{encode_basestring(actor)},"at":{int.__repr__(at)},'
            f'"chain":{encode_basestring(chain)},"data":{data_json},'
            f'"event":{encode_basestring(event)},"prev_hash":{encode_basestring(prev_hash)},'
            f'"schedule_id":{_optional(schedule_id)},"seq":{int.__repr__(seq)},'
            f'"slot_key":{_optional(slot_key)},"tenant":{_optional(tenant)}}}'
        )
    except TypeError:  # encode_basestring of something not a string
        return None


def _optional(text: str | None) -> str:
    return "null" if text is None else encode_basestring(text)


class KeyRing:
    """The secret audit keys a node holds: the current epoch's key signs (HMAC per entry,
    Ed25519 where an auditor checks); `legacy` keys (key-file lines from before epochs) only
    verify entries they signed. A key's id is a fingerprint of it (never the key)."""

    def __init__(
        self,
        secrets: Iterable[bytes],
        *,
        epoch: int = 0,
        root_public_key: str | None = None,
        store: Callable[[KeyRing], None] | None = None,
        pending: EpochKey | None = None,
    ) -> None:
        listed = list(secrets)
        # A rotation under way: the next epoch's key, used once the database records it.
        self.pending = pending
        # Where a moved-on ring is written back (its key file), so the old secret goes.
        self._store = store
        if not listed:
            raise ValueError("a key ring needs at least one key")
        self.current = EpochKey(epoch, listed[-1])
        self._keys: dict[str, bytes] = {}
        for secret in listed:
            if len(secret) < MIN_KEY_BYTES:
                raise ValueError(f"an audit key must be at least {MIN_KEY_BYTES} bytes")
            self._keys[key_fingerprint(secret)] = secret
        # The trust root: epoch 0's public key, derivable while the root key is held.
        self.root_public_key = root_public_key or (self.current.public_key if epoch == 0 else None)

    def __repr__(self) -> str:
        return f"KeyRing(epoch={self.epoch}, active_id={self.active_id})"

    @property
    def epoch(self) -> int:
        return self.current.epoch

    @property
    def active_id(self) -> str:
        return self.current.key_id

    @property
    def public_key(self) -> str:
        return self.current.public_key

    @property
    def ids(self) -> list[str]:
        return list(self._keys)

    def holds(self, key_id: str) -> bool:
        return key_id in self._keys

    def sign(self, message: str, key_id: str | None = None) -> tuple[str, str]:
        """(key id, HMAC signature) of `message` under the current key (or `key_id`)."""
        used = key_id or self.active_id
        return used, hmac.new(self._keys[used], message.encode(), hashlib.sha256).hexdigest()

    def seal(self, message: str) -> str:
        """The current key's Ed25519 signature of `message`: checkable with the public key."""
        return self.current.sign(message)

    def valid(self, message: str, key_id: str, signature: str) -> bool | None:
        """True or False; None when the key id is not in this ring (cannot tell)."""
        secret = self._keys.get(key_id)
        if secret is None:
            return None
        expected = hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, signature)

    def moved_to(self, key: EpochKey) -> KeyRing:
        """A ring holding only `key`: a sealed or rotated epoch's secret is not kept."""
        return KeyRing(
            [key.secret], epoch=key.epoch, root_public_key=self.root_public_key, store=self._store
        )

    def with_pending(self, key: EpochKey) -> KeyRing:
        """This ring with `key` as the rotation under way (its legacy keys kept)."""
        ring = KeyRing(
            [*self._keys.values()],
            epoch=self.epoch,
            root_public_key=self.root_public_key,
            store=self._store,
            pending=key,
        )
        ring.current = self.current
        return ring

    def persist(self) -> None:
        """Write this ring back where it came from (nothing for a key in the environment)."""
        if self._store is not None:
            self._store(self)


def entry_message(chain: str, seq: int, entry_hash: str) -> str:
    return f"entry:{chain}:{seq}:{entry_hash}"


def checkpoint_message(chain: str, seq: int, entry_hash: str) -> str:
    return f"checkpoint:{chain}:{seq}:{entry_hash}"


def seal(event: AuditEvent, *, seq: int, at: int, prev_hash: str, keys: KeyRing) -> AuditEntry:
    """The entry that follows `prev_hash` at `seq` in the event's chain, hashed and signed;
    its `data_json` is the text hashed, for storing as it is."""
    chain = event.chain
    data = dict(event.data)
    data_json = canonical(data)
    digest = _content_hash(
        chain,
        seq,
        event.event,
        event.actor,
        event.tenant,
        event.schedule_id,
        event.slot_key,
        at,
        data_json,
        prev_hash,
    )
    message = entry_message(chain, seq, digest)
    key_id, signature = keys.sign(message)
    entry = AuditEntry(
        chain=chain,
        seq=seq,
        event=event.event,
        actor=event.actor,
        tenant=event.tenant,
        schedule_id=event.schedule_id,
        slot_key=event.slot_key,
        at=at,
        data=data,
        prev_hash=prev_hash,
        hash=digest,
        key_id=key_id,
        signature=signature,
        seal=keys.seal(message) if event.event in SEALED_EVENTS else None,
    )
    return with_data_json(entry, data_json)


@dataclass(frozen=True, slots=True)
class ChainPoint:
    """A position in a chain: the entry at `seq` has hash `hash` (seq 0: before the first)."""

    seq: int
    hash: str

    def spelled(self) -> str:
        return f"{self.seq}:{self.hash}"


START = ChainPoint(0, GENESIS)


@dataclass(frozen=True, slots=True)
class Anchor:
    """Where a chain's archived part ends (the entries up to `seq` may be pruned)."""

    chain: str
    seq: int
    hash: str
    key_id: str
    at: int
    signature: str  # Ed25519 of anchor_message
    archive: str  # the archive's name (its manifest's file)


def anchor_message(chain: str, seq: int, digest: str, archive: str) -> str:
    return f"anchor:{chain}:{seq}:{digest}:{archive}"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    chain: str
    seq: int
    hash: str  # the hash of the entry at seq: the running hash of the chain so far
    key_id: str
    signature: str


@dataclass(frozen=True, slots=True)
class VerificationMark:
    """Where the last verification of a chain ended, signed like a checkpoint, and when: the
    next incremental verification trusts the entries up to it."""

    chain: str
    seq: int
    hash: str
    key_id: str
    signature: str
    at: int  # ms since the epoch, UTC

    @property
    def point(self) -> ChainPoint:
        return ChainPoint(self.seq, self.hash)


@dataclass(frozen=True, slots=True)
class ChainProblem:
    seq: int  # the first bad sequence number
    reason: str
    # Not a sign of tampering: nothing the verifier holds can vouch for these entries (the
    # public key alone, and entries signed only with the secret key since the last seal).
    unverifiable: bool = False


@dataclass(slots=True)
class ChainWalk:
    """Checks entries one by one, in sequence order, from a trusted point.

    What vouches for an entry: its HMAC under a key the verifier holds, or the Ed25519 seal of
    a later entry, checkpoint or signed head of the same chain (its hash covers every entry
    before it), signed by the key the chain was signed with at that point. The key follows the
    chain: its opening names the first, each epoch seal or rotation the next, and an entry
    signed by a key the chain has moved on from is refused. With a `lineage` (the database's
    keys checked from their root), every key named must be the lineage's, and the chain must
    belong to the lineage's database."""

    chain: str
    keys: KeyRing | None
    at: ChainPoint = START
    checked: int = 0
    problem: ChainProblem | None = None
    lineage: KeyLineage | None = None
    # The key this chain is signed with now (None: not opened yet, or a chain from before
    # openings, whose entries only legacy HMAC keys vouch for).
    key_id: str | None = None
    # Keys this chain moved on from, with the entry that retired each.
    retired: dict[str, int] = field(default_factory=dict)
    # Public keys named by the chain's own openings and transitions (used without a lineage).
    named: dict[str, str] = field(default_factory=dict)
    # The first entry nothing has vouched for yet (its key is not held; no seal since).
    unproven_from: int | None = None
    seals_checked: int = 0

    def start_at(self, point: ChainPoint, key_id: str | None) -> None:
        """Resume after `point`, trusted, the chain being signed with `key_id` there."""
        self.at = point
        self.key_id = key_id

    def feed(self, entry: AuditEntry) -> bool:
        """Check the next entry; False (and `problem` set) at the first bad one."""
        if self.problem is not None:
            return False
        expected = self.at.seq + 1
        if entry.chain != self.chain:
            return self._bad(expected, f"entry of chain {entry.chain!r} inside {self.chain!r}")
        if entry.seq != expected:
            what = "missing (deleted?)" if entry.seq > expected else "out of order or repeated"
            return self._bad(expected, f"entry {expected} is {what}: found {entry.seq} next")
        if entry.prev_hash != self.at.hash:
            return self._bad(entry.seq, "its previous hash is not the hash of the entry before it")
        digest = entry.computed_hash()
        if digest != entry.hash:
            return self._bad(entry.seq, "its content does not match its hash (edited)")
        if entry.event == CHAIN_OPENED:
            if not self._opened(entry):
                return False
        elif self.key_id is not None and entry.key_id != self.key_id:
            retired_at = self.retired.get(entry.key_id)
            if retired_at is not None:
                return self._bad(
                    entry.seq,
                    f"it is signed with key {entry.key_id}, which this chain retired at entry "
                    f"{retired_at}: forged with a retired key",
                )
            return self._bad(
                entry.seq,
                f"it is signed with key {entry.key_id}, but the chain is signed with "
                f"{self.key_id} here (forged, or a key from elsewhere)",
            )
        if not self._vouched(entry):
            return False
        if entry.event in TRANSITIONS and not self._moved_on(entry):
            return False
        self.at = ChainPoint(entry.seq, entry.hash)
        self.checked += 1
        return True

    def _vouched(self, entry: AuditEntry) -> bool:
        message = entry_message(entry.chain, entry.seq, entry.hash)
        mac = None if self.keys is None else self.keys.valid(message, entry.key_id, entry.signature)
        if mac is False:
            return self._bad(entry.seq, "its signature is not valid (forged, or the wrong key)")
        if entry.event in SEALED_EVENTS and entry.seal is None:
            return self._bad(entry.seq, f"a {entry.event} entry without its seal (forged)")
        if entry.seal is not None:
            public = self.public_key(entry.key_id)
            if public is None:
                return self._bad(
                    entry.seq, f"it is sealed with key {entry.key_id}, which nothing here names"
                )
            if not verify_signed(public, message, entry.seal):
                return self._bad(entry.seq, "its seal is not valid (forged, or the wrong key)")
            self.seals_checked += 1
            self.unproven_from = None
        elif mac is None and self.unproven_from is None:
            self.unproven_from = entry.seq
        elif mac:
            self.unproven_from = None
        return True

    def _opened(self, entry: AuditEntry) -> bool:
        if self.key_id is not None:
            return self._bad(entry.seq, "a second opening inside the chain (forged)")
        data = entry.data
        try:
            database_id = str(data["database_id"])
            key_id, public = str(data["key_id"]), str(data["public_key"])
        except KeyError:
            return self._bad(entry.seq, "its opening names no database or key (forged)")
        if key_id != entry.key_id:
            return self._bad(entry.seq, "its opening names another key than signed it (forged)")
        if self.lineage is not None:
            if database_id != self.lineage.database_id:
                return self._bad(
                    entry.seq,
                    f"this chain belongs to database {database_id}, not to this one "
                    f"({self.lineage.database_id}): copied from another database",
                )
            period = self.lineage.by_id().get(key_id)
            if period is None or period.public_key != public:
                return self._bad(
                    entry.seq, f"it opens with key {key_id}, which is not this database's"
                )
        self.named[key_id] = public
        self.key_id = key_id
        return True

    def _moved_on(self, entry: AuditEntry) -> bool:
        data = entry.data
        try:
            new_id, public = str(data["next_key_id"]), str(data["next_public_key"])
            epoch = int(data["next_epoch"])
        except (KeyError, ValueError, TypeError):
            return self._bad(entry.seq, f"the {entry.event} entry names no next key (forged)")
        if self.lineage is not None:
            period = self.lineage.after(epoch - 1)
            if period is None or period.key_id != new_id or period.public_key != public:
                return self._bad(
                    entry.seq,
                    f"it moves the chain to key {new_id} (epoch {epoch}), which is not the "
                    "database's key of that epoch",
                )
        if self.key_id is not None:
            self.retired[self.key_id] = entry.seq
        self.named[new_id] = public
        self.key_id = new_id
        return True

    def public_key(self, key_id: str) -> str | None:
        if self.lineage is not None:
            period = self.lineage.by_id().get(key_id)
            return None if period is None else period.public_key
        if key_id in self.named:
            return self.named[key_id]
        if self.keys is not None and self.keys.active_id == key_id:
            return self.keys.public_key
        return None

    def cover(self, seq: int, digest: str, key_id: str, signature: str, message: str) -> bool:
        """A signed statement that the entry at `seq` (walked just now) has hash `digest`: an
        Ed25519 signature by the chain's key, or a legacy HMAC one."""
        if self.problem is not None:
            return False
        if seq != self.at.seq or digest != self.at.hash:
            return self._bad(seq, "a signed point names another hash than the entry's")
        public = self.public_key(key_id)
        if public is not None and verify_signed(public, message, signature):
            self.seals_checked += 1
            self.unproven_from = None
            return True
        legacy = None if self.keys is None else self.keys.valid(message, key_id, signature)
        if legacy is None and public is None:
            return self._bad(seq, f"a signed point is signed with key {key_id}, unknown here")
        if not legacy:
            return self._bad(seq, "a signed point's signature is not valid (forged)")
        return True

    def check_point(self, checkpoint: Checkpoint) -> bool:
        """A checkpoint at the sequence just walked must name its hash, signed."""
        return self.cover(
            checkpoint.seq,
            checkpoint.hash,
            checkpoint.key_id,
            checkpoint.signature,
            checkpoint_message(checkpoint.chain, checkpoint.seq, checkpoint.hash),
        )

    def finish(self) -> ChainProblem | None:
        """What is wrong once the walk reached the end it was given: entries nothing vouched
        for, or a chain still signed with a key the database has retired."""
        if self.problem is not None:
            return self.problem
        if self.unproven_from is not None:
            self.problem = ChainProblem(
                self.unproven_from,
                f"entries {self.unproven_from}..{self.at.seq} are signed only with the secret "
                "key, which is not here, and nothing signed with a public key covers them "
                "(verify with the secret key, or an export or archive, whose heads are signed)",
                unverifiable=True,
            )
            return self.problem
        if self.lineage is not None and self.key_id is not None:
            current = self.lineage.current
            if self.key_id != current.key_id:
                return self._problem(
                    self.at.seq + 1,
                    f"the chain is still signed with key {self.key_id}, which the database "
                    f"retired (its key is {current.key_id} since epoch {current.epoch}): the "
                    "entry that moved this chain on is missing (truncated)",
                )
        return None

    def _problem(self, seq: int, reason: str) -> ChainProblem:
        self.problem = ChainProblem(seq, reason)
        return self.problem

    def _bad(self, seq: int, reason: str) -> bool:
        self.problem = ChainProblem(seq, reason)
        return False


def parse_point(text: str) -> ChainPoint:
    """`SEQ:HASH`, as `vortos audit verify` prints a head."""
    seq, sep, digest = text.partition(":")
    if (
        not sep
        or not seq.isdigit()
        or len(digest) != 64
        or not all(c in "0123456789abcdef" for c in digest)
    ):
        raise ValueError(f"{text!r} is not a chain head: write SEQ:HASH as verify printed it")
    return ChainPoint(int(seq), digest)

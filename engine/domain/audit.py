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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SYSTEM_CHAIN = "system"
GENESIS = hashlib.sha256(b"").hexdigest()  # the previous hash of a chain's first entry
CHECKPOINT_EVERY = 1000


def tenant_chain(tenant: str) -> str:
    return f"tenant:{tenant}"


def chain_tenant(chain: str) -> str | None:
    return chain.removeprefix("tenant:") if chain.startswith("tenant:") else None


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """Something to record: the service, the daemon and the dispatcher make these."""

    event: str  # e.g. schedule.paused, fire.dispatched, leader.acquired
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
    signature: str

    def computed_hash(self) -> str:
        """The hash its content and previous hash should have (what `hash` claims)."""
        return content_hash(
            chain=self.chain,
            seq=self.seq,
            event=self.event,
            actor=self.actor,
            tenant=self.tenant,
            schedule_id=self.schedule_id,
            slot_key=self.slot_key,
            at=self.at,
            data=self.data,
            prev_hash=self.prev_hash,
        )

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
        )


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: the same bytes for the same content, always."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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
    body = canonical(
        {
            "chain": chain,
            "seq": seq,
            "event": event,
            "actor": actor,
            "tenant": tenant,
            "schedule_id": schedule_id,
            "slot_key": slot_key,
            "at": at,
            "data": data,
            "prev_hash": prev_hash,
        }
    )
    return hashlib.sha256(body.encode()).hexdigest()


class KeyRing:
    """HMAC keys by id. The newest signs; every one verifies, so entries signed before a
    rotation stay verifiable. A key's id is a fingerprint of it (never the key)."""

    def __init__(self, secrets: Iterable[bytes]) -> None:
        self._keys: dict[str, bytes] = {}
        self.active_id = ""
        for secret in secrets:
            if len(secret) < 16:
                raise ValueError("an audit key must be at least 16 bytes")
            key_id = key_fingerprint(secret)
            self._keys[key_id] = secret
            self.active_id = key_id
        if not self._keys:
            raise ValueError("a key ring needs at least one key")

    @property
    def ids(self) -> list[str]:
        return list(self._keys)

    def sign(self, message: str, key_id: str | None = None) -> tuple[str, str]:
        """(key id, signature) of `message` under the active key (or `key_id`)."""
        used = key_id or self.active_id
        return used, hmac.new(self._keys[used], message.encode(), hashlib.sha256).hexdigest()

    def valid(self, message: str, key_id: str, signature: str) -> bool | None:
        """True or False; None when the key id is not in this ring (cannot tell)."""
        secret = self._keys.get(key_id)
        if secret is None:
            return None
        expected = hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, signature)


def key_fingerprint(secret: bytes) -> str:
    return hashlib.sha256(b"vortos-audit-key:" + secret).hexdigest()[:16]


def entry_message(chain: str, seq: int, entry_hash: str) -> str:
    return f"entry:{chain}:{seq}:{entry_hash}"


def checkpoint_message(chain: str, seq: int, entry_hash: str) -> str:
    return f"checkpoint:{chain}:{seq}:{entry_hash}"


def seal(event: AuditEvent, *, seq: int, at: int, prev_hash: str, keys: KeyRing) -> AuditEntry:
    """The entry that follows `prev_hash` at `seq` in the event's chain, hashed and signed."""
    digest = content_hash(
        chain=event.chain,
        seq=seq,
        event=event.event,
        actor=event.actor,
        tenant=event.tenant,
        schedule_id=event.schedule_id,
        slot_key=event.slot_key,
        at=at,
        data=event.data,
        prev_hash=prev_hash,
    )
    key_id, signature = keys.sign(entry_message(event.chain, seq, digest))
    return AuditEntry(
        chain=event.chain,
        seq=seq,
        event=event.event,
        actor=event.actor,
        tenant=event.tenant,
        schedule_id=event.schedule_id,
        slot_key=event.slot_key,
        at=at,
        data=dict(event.data),
        prev_hash=prev_hash,
        hash=digest,
        key_id=key_id,
        signature=signature,
    )


@dataclass(frozen=True, slots=True)
class ChainPoint:
    """A position in a chain: the entry at `seq` has hash `hash` (seq 0: before the first)."""

    seq: int
    hash: str

    def spelled(self) -> str:
        return f"{self.seq}:{self.hash}"


START = ChainPoint(0, GENESIS)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    chain: str
    seq: int
    hash: str  # the hash of the entry at seq: the running hash of the chain so far
    key_id: str
    signature: str


@dataclass(frozen=True, slots=True)
class ChainProblem:
    seq: int  # the first bad sequence number
    reason: str


@dataclass(slots=True)
class ChainWalk:
    """Checks entries one by one, in sequence order, from a trusted point."""

    chain: str
    keys: KeyRing
    at: ChainPoint = START
    checked: int = 0
    problem: ChainProblem | None = None

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
        valid = self.keys.valid(
            entry_message(entry.chain, entry.seq, digest), entry.key_id, entry.signature
        )
        if valid is None:
            return self._bad(
                entry.seq, f"it is signed with key {entry.key_id}, which is not in the key ring"
            )
        if not valid:
            return self._bad(entry.seq, "its signature is not valid (forged, or the wrong key)")
        self.at = ChainPoint(entry.seq, entry.hash)
        self.checked += 1
        return True

    def check_point(self, checkpoint: Checkpoint) -> bool:
        """A checkpoint at a sequence already walked must name the same hash, signed."""
        if self.problem is not None:
            return False
        valid = self.keys.valid(
            checkpoint_message(checkpoint.chain, checkpoint.seq, checkpoint.hash),
            checkpoint.key_id,
            checkpoint.signature,
        )
        if not valid:
            return self._bad(checkpoint.seq, "the checkpoint's signature is not valid")
        return True

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

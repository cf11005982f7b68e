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
from json.encoder import encode_basestring
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
    key_id, signature = keys.sign(entry_message(chain, seq, digest))
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
        if valid is None:
            return self._bad(
                checkpoint.seq,
                f"the checkpoint is signed with key {checkpoint.key_id}, which is not in the "
                "key ring",
            )
        if not valid:
            return self._bad(checkpoint.seq, "the checkpoint's signature is not valid (forged)")
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

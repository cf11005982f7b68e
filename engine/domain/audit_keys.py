"""The audit key's life: epochs, one-way evolution, rotation, and the public half (pure).

A deployment's audit key is a secret that changes by epochs. Epoch 0's key is the root; each
later epoch's key is either derived one-way from the one before (`evolved`: sealing an epoch,
so that a key stolen later cannot sign anything of an epoch already sealed) or drawn afresh
(`rotated`). Every epoch key has two halves:

- the secret itself signs each entry with HMAC-SHA-256 (about 3 µs), which only a holder of
  the key can check;
- an Ed25519 key derived from it signs what an auditor checks with the public half alone: the
  chain openings, epoch seals and rotations, checkpoints, anchors, export heads and archive
  manifests. Nobody can sign with a public key.

The epochs of a database are its key lineage (`audit_keys`): each epoch's public key is
endorsed by the epoch before it, and epoch 0's by itself together with the database's id, so
that from the root public key alone anyone can tell which key signed what, and when it was
retired.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

MIN_KEY_BYTES = 16


class KeyKind(StrEnum):
    ROOT = "root"  # epoch 0: the deployment's first key
    EVOLVED = "evolved"  # derived one-way from the epoch before (an epoch sealed)
    ROTATED = "rotated"  # drawn afresh (`vortos audit rotate-key`)


def key_fingerprint(secret: bytes) -> str:
    """A key's id: a fingerprint, never the key (16 hex digits)."""
    return hashlib.sha256(b"vortos-audit-key:" + secret).hexdigest()[:16]


def evolve_secret(secret: bytes) -> bytes:
    """The next epoch's secret: one-way, so the next key tells nothing of this one."""
    return hashlib.sha256(b"vortos-audit-evolve:" + secret).hexdigest().encode()


def _signing_key(secret: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(
        hashlib.sha256(b"vortos-audit-ed25519:" + secret).digest()
    )


def public_key_of(secret: bytes) -> str:
    """The public half of an epoch key (hex), which verifies its Ed25519 signatures."""
    return _signing_key(secret).public_key().public_bytes_raw().hex()


def verify_signed(public_key: str, message: str, signature: str) -> bool:
    """Whether `signature` (hex) is `public_key`'s Ed25519 signature of `message`."""
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key))
        key.verify(bytes.fromhex(signature), message.encode())
    except (ValueError, InvalidSignature):
        return False
    return True


@dataclass(frozen=True, slots=True)
class EpochKey:
    """The secret of one epoch. Never printed: `repr` names only the id."""

    epoch: int
    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) < MIN_KEY_BYTES:
            raise ValueError(f"an audit key must be at least {MIN_KEY_BYTES} bytes")

    def __repr__(self) -> str:
        return f"EpochKey(epoch={self.epoch}, key_id={self.key_id})"

    @property
    def key_id(self) -> str:
        return key_fingerprint(self.secret)

    @property
    def public_key(self) -> str:
        return public_key_of(self.secret)

    def mac(self, message: str) -> str:
        return hmac.new(self.secret, message.encode(), hashlib.sha256).hexdigest()

    def sign(self, message: str) -> str:
        """The Ed25519 signature (hex) an auditor checks with `public_key`."""
        return _signing_key(self.secret).sign(message.encode()).hex()

    def evolved(self) -> EpochKey:
        return EpochKey(self.epoch + 1, evolve_secret(self.secret))


def endorsement_message(
    database_id: str, epoch: int, key_id: str, public_key: str, kind: KeyKind, started_at: int
) -> str:
    return f"key:{database_id}:{epoch}:{key_id}:{public_key}:{kind.value}:{started_at}"


@dataclass(frozen=True, slots=True)
class KeyPeriod:
    """One row of a database's key lineage."""

    epoch: int
    key_id: str
    public_key: str
    kind: KeyKind
    started_at: int  # ms since the epoch, UTC
    # Ed25519 by the epoch before (epoch 0: by itself) of endorsement_message.
    endorsement: str

    def message(self, database_id: str) -> str:
        return endorsement_message(
            database_id, self.epoch, self.key_id, self.public_key, self.kind, self.started_at
        )


def endorse(
    database_id: str, endorser: EpochKey, new: EpochKey, kind: KeyKind, at: int
) -> KeyPeriod:
    """The lineage row of `new`, endorsed by `endorser` (`new` itself for the root)."""
    public = new.public_key
    message = endorsement_message(database_id, new.epoch, new.key_id, public, kind, at)
    return KeyPeriod(new.epoch, new.key_id, public, kind, at, endorser.sign(message))


class LineageBroken(ValueError):
    """The key lineage does not follow from the trusted root: what is wrong, in words."""


@dataclass(frozen=True, slots=True)
class KeyLineage:
    """A database's epochs, checked from its root public key: which key signed when."""

    database_id: str
    periods: tuple[KeyPeriod, ...]

    @classmethod
    def checked(
        cls, database_id: str, periods: Sequence[KeyPeriod], *, root_public_key: str | None
    ) -> KeyLineage:
        """The lineage, once every endorsement is found valid, epoch 0 being the key whose
        public half is `root_public_key` (None: the database's own root is trusted, which
        only the secret key's holder may do: their HMAC checks catch a root swapped)."""
        if not periods:
            raise LineageBroken("the database records no audit key")
        ordered = sorted(periods, key=lambda p: p.epoch)
        if [p.epoch for p in ordered] != list(range(len(ordered))):
            raise LineageBroken(
                "the database's audit key epochs are not 0, 1, 2, ... (one was removed or "
                f"added: {[p.epoch for p in ordered]})"
            )
        root = ordered[0]
        if root.kind is not KeyKind.ROOT:
            raise LineageBroken("epoch 0 of the audit key is not a root key")
        if root_public_key is not None and root.public_key != root_public_key:
            raise LineageBroken(
                f"this database's root audit key is {root.key_id} ({root.public_key[:16]}…), "
                f"not the one trusted ({root_public_key[:16]}…): another deployment's "
                "database, or its root was replaced"
            )
        if not verify_signed(root.public_key, root.message(database_id), root.endorsement):
            raise LineageBroken(
                f"the root audit key {root.key_id} is not endorsed for database {database_id} "
                "(the database's id or its root key was changed)"
            )
        for before, period in itertools.pairwise(ordered):
            if period.kind is KeyKind.ROOT or not verify_signed(
                before.public_key, period.message(database_id), period.endorsement
            ):
                raise LineageBroken(
                    f"audit key {period.key_id} (epoch {period.epoch}) is not endorsed by the "
                    f"key of epoch {before.epoch} ({before.key_id}): forged"
                )
        return cls(database_id, tuple(ordered))

    def by_id(self) -> Mapping[str, KeyPeriod]:
        return {p.key_id: p for p in self.periods}

    @property
    def current(self) -> KeyPeriod:
        return self.periods[-1]

    def after(self, epoch: int) -> KeyPeriod | None:
        return self.periods[epoch + 1] if epoch + 1 < len(self.periods) else None


def catch_up(key: EpochKey, lineage: Iterable[KeyPeriod]) -> EpochKey | None:
    """`key` evolved to the newest epoch of `lineage`, when every epoch after it was evolved
    and the derived ids match; None when a rotation lies between (the new key cannot be
    derived) or `key` is not this lineage's."""
    periods = {p.epoch: p for p in lineage}
    if periods.get(key.epoch) is None or periods[key.epoch].key_id != key.key_id:
        return None
    newest = max(periods)
    while key.epoch < newest:
        period = periods[key.epoch + 1]
        if period.kind is not KeyKind.EVOLVED:
            return None
        key = key.evolved()
        if key.key_id != period.key_id:
            return None
    return key

"""The audit log: append-only chains of signed entries (see engine.domain.audit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.domain.audit import (
    AuditEntry,
    AuditEvent,
    ChainPoint,
    Checkpoint,
    KeyRing,
    VerificationMark,
)


class AuditLog(Protocol):
    """Contract:
    - `append` gives each event the next sequence number of its chain, links it to the chain's
      head and signs it, atomically: inside a transaction the caller holds, it lands or fails
      with that transaction (a change and its entry are one); alone, in its own.
    - Appends to one chain are serialised: two writers never take the same sequence number.
    - Nothing here changes or removes an entry.
    - Appending without an audit key raises AuditKeyMissing; reading needs no key.
    """

    def keys(self) -> KeyRing:
        """The signing and verifying keys, loaded on first need; AuditKeyMissing without."""
        ...

    def append(self, events: Sequence[AuditEvent]) -> list[AuditEntry]: ...

    def head(self, chain: str) -> ChainPoint:
        """The newest entry of the chain (seq 0 and the genesis hash when it is empty)."""
        ...

    def chains(self) -> list[str]: ...

    def heads(self) -> dict[str, int]:
        """Each chain's newest sequence number (chains without entries absent), in one read."""
        ...

    def is_empty(self) -> bool:
        """No entry in any chain."""
        ...

    def entries(self, chain: str, *, after_seq: int = 0, limit: int = 10_000) -> list[AuditEntry]:
        """Entries in sequence order, starting after `after_seq`."""
        ...

    def latest(self, chain: str | None = None, *, limit: int = 20) -> list[AuditEntry]:
        """The newest entries, newest first (of one chain, or of all)."""
        ...

    def checkpoints(self, chain: str, *, after_seq: int = 0) -> list[Checkpoint]: ...

    def verified(self, chain: str) -> VerificationMark | None:
        """Where the last verification of the chain ended (signed like a checkpoint), and
        when."""
        ...

    def mark_verified(self, chain: str, point: ChainPoint) -> None: ...

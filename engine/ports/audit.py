"""The audit log: append-only chains of signed entries (see engine.domain.audit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.domain.audit import (
    Anchor,
    AuditEntry,
    AuditEvent,
    ChainPoint,
    Checkpoint,
    KeyRing,
    VerificationMark,
)
from engine.domain.audit_keys import EpochKey, KeyKind, KeyPeriod


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

    def identity(self) -> tuple[str, list[KeyPeriod]] | None:
        """The database's id and its audit key lineage as stored (unchecked); None before
        the first key was recorded."""
        ...

    def tenants_with_history(self) -> list[str]:
        """Tenants with a schedule or a run (each must have its audit chain)."""
        ...

    def last_transition(self, chain: str, upto: int) -> AuditEntry | None:
        """The chain's newest epoch seal or rotation at or before `upto` (None: none)."""
        ...

    def anchor(self, chain: str) -> Anchor | None:
        """Where the chain's archived (and pruned) part ends, signed."""
        ...

    def fired_runs(
        self, first_id: int, last_id: int
    ) -> Sequence[tuple[int, str, str, str, int, int]]:
        """Runs with ids in [first_id, last_id], in id order: (id, tenant, schedule id, slot
        key, slot at, due at), the columns a batch entry commits to."""
        ...

    def establish(self) -> KeyRing:
        """This process's key, checked against the database's (recorded as the root when
        there is none yet); AuditKeyMismatch when it is not the database's."""
        ...

    def transition(self, kind: KeyKind, new: EpochKey, actor: str) -> KeyPeriod:
        """Seal the epoch (`evolved`) or rotate the key (`rotated`) to `new`, the next
        epoch's key: an entry in every chain naming it, the lineage row, atomically; then
        sign with it."""
        ...

    def scheduled_run_ids(self, tenant: str, after_id: int, limit: int) -> list[int]:
        """Ids of the tenant's dispatched runs (scheduled and backfilled) after `after_id`."""
        ...

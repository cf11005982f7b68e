"""Authorisation: identities and the decision for each operation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engine.domain.access import Grant, Identity, Operation, Role


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str  # when refused: what is missing, in words an operator can act on


@runtime_checkable
class Policy(Protocol):
    """One decision per operation. `tenant` is the tenant the operation touches (None for
    operations on the whole installation). Must not raise for a refusal: return it."""

    def decide(self, identity: Identity, operation: Operation, tenant: str | None) -> Decision: ...


@runtime_checkable
class IdentityProvider(Protocol):
    """Who an operator is: their grants, as stored (or from a directory)."""

    def identity(self, operator: str) -> Identity: ...


class OperatorStore(Protocol):
    """Grants of roles to operators. Changes are atomic and join the caller's transaction."""

    def grants(self, operator: str | None = None) -> list[Grant]: ...

    def grant(self, grant: Grant, *, by: str, at: int) -> bool:
        """Store the grant; False when it was already there (nothing changes)."""
        ...

    def revoke(self, grant: Grant) -> bool:
        """Remove it; False when there was no such grant."""
        ...

    def count(self, role: Role | None = None) -> int: ...

"""Approval requests for four-eyes changes."""

from __future__ import annotations

from typing import Protocol

from engine.domain.approvals import Approval, ApprovalState


class ApprovalStore(Protocol):
    """Contract: every method is atomic and joins the caller's transaction; a state change
    is conditional on the state the caller saw (`expect`), so two approvers racing, or a
    change consuming an approval twice, cannot both win."""

    def add(self, approval: Approval) -> None: ...

    def get(self, approval_id: str) -> Approval | None: ...

    def find(
        self, *, tenant: str, digest: str, state: ApprovalState, now_ms: int
    ) -> Approval | None:
        """The newest unexpired request with this digest in `state` (pending or approved)."""
        ...

    def list(
        self,
        *,
        tenant: str | None = None,
        state: ApprovalState | None = None,
        limit: int = 100,
        tenants: frozenset[str] | None = None,
    ) -> list[Approval]:
        """Newest first (pending first when no state is given); `tenants`, when given, keeps
        only those tenants' requests."""
        ...

    def transition(
        self,
        approval_id: str,
        *,
        expect: ApprovalState,
        to: ApprovalState,
        by: str,
        at: int,
        reason: str | None = None,
    ) -> bool:
        """Move it from `expect` to `to`; False (nothing changed) when it was not in `expect`."""
        ...

"""Four-eyes approvals: request (by attempting a sensitive change), approve, reject, consume."""

from __future__ import annotations

import logging

from engine.domain.access import Operation, PermissionDenied
from engine.domain.approvals import (
    Approval,
    ApprovalState,
    validate_reason,
)
from engine.domain.audit import AuditEvent
from engine.domain.errors import Conflict, NotFound
from engine.service.core import ServiceCore

log = logging.getLogger("vortos.service")


class Approvals(ServiceCore):
    def approvals(
        self,
        *,
        actor: str,
        tenant: str | None = None,
        state: ApprovalState | None = None,
        limit: int = 100,
    ) -> list[Approval]:
        """Requests, pending first, of the tenants `actor` may view. `state` is as of now (an
        expired one is expired)."""
        scope = self.listing_scope(actor, tenant)
        now = self._clock.now_ms()
        stored = None if state in (None, ApprovalState.EXPIRED) else state
        found = self._storage.approvals.list(
            tenant=tenant, state=stored, limit=limit * 2, tenants=scope.tenants
        )
        if state is not None:
            found = [a for a in found if a.state_at(now) is state]
        return found[:limit]

    def approval(self, approval_id: str, *, actor: str, tenant: str | None = None) -> Approval:
        """One request. Another tenant's, where `actor` may not look, is not found: its id
        says nothing about whether it exists."""
        found = self._storage.approvals.get(approval_id)
        if (
            found is None
            or (tenant is not None and found.tenant != tenant)
            or not self.scope(actor).allows(found.tenant)
        ):
            raise NotFound(
                f"no approval request {approval_id!r}: `vortos approvals list` shows them"
            )
        return found

    def approve(self, approval_id: str, *, actor: str, tenant: str | None = None) -> Approval:
        """Approve a pending request of someone else's (needs the approver role there)."""
        return self._decide(approval_id, actor, tenant, ApprovalState.APPROVED, None)

    def reject(
        self, approval_id: str, *, actor: str, reason: str, tenant: str | None = None
    ) -> Approval:
        """Reject a pending request of someone else's, saying why (10 characters or more)."""
        return self._decide(
            approval_id, actor, tenant, ApprovalState.REJECTED, validate_reason(reason)
        )

    def _decide(
        self,
        approval_id: str,
        actor: str,
        tenant: str | None,
        to: ApprovalState,
        reason: str | None,
    ) -> Approval:
        request = self.approval(approval_id, actor=actor, tenant=tenant)
        verb = "approve" if to is ApprovalState.APPROVED else "reject"
        if request.requested_by == actor:  # whatever roles the requester holds
            raise PermissionDenied(
                f"{actor} asked for {approval_id} and so cannot {verb} it: another approver must"
            )
        self._authorize(actor, Operation.APPROVE, request.tenant)
        now = self._clock.now_ms()
        current = request.state_at(now)
        if current is not ApprovalState.PENDING:
            raise Conflict(
                f"approval {approval_id} is {current.value}: only a pending one can "
                f"be {verb}d" + (" (ask again)" if current is ApprovalState.EXPIRED else "")
            )
        with self._changing(actor, Operation.APPROVE, request.tenant):
            moved = self._storage.approvals.transition(
                approval_id,
                expect=ApprovalState.PENDING,
                to=to,
                by=actor,
                at=now,
                reason=reason,
            )
            if not moved:
                raise Conflict(f"approval {approval_id} was decided by someone else meanwhile")
            self._append(
                actor,
                [
                    AuditEvent(
                        f"approval.{to.value}",
                        actor=actor,
                        tenant=request.tenant,
                        data={"approval": approval_id, "reason": reason},
                    )
                ],
            )
        log.info("%s %sd approval %s", actor, verb, approval_id)
        decided = self._storage.approvals.get(approval_id)
        assert decided is not None
        return decided

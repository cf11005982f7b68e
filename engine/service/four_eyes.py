"""The four-eyes gate a sensitive change goes through."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from engine.domain.approvals import (
    Approval,
    ApprovalRequired,
    ApprovalState,
    GatedOperation,
    change_digest,
)
from engine.domain.audit import AuditEvent
from engine.domain.clock import Clock
from engine.domain.errors import Conflict
from engine.domain.timeutil import iso_utc
from engine.ports.storage import Storage

log = logging.getLogger("vortos.service")

Append = Callable[[str, list[AuditEvent]], None]


class FourEyesGate:
    """What a sensitive change goes through: an approved request for exactly this change is
    consumed by it; otherwise a pending request is stored (or found: asking twice is one
    request) and the change is refused until someone else approves."""

    def __init__(self, storage: Storage, clock: Clock, append: Append, ttl_ms: int) -> None:
        self._storage = storage
        self._clock = clock
        self._append = append
        self.ttl_ms = ttl_ms
        # Request ids: short random hex (replaceable, e.g. for reproducible screenshots).
        self.new_id: Callable[[], str] = lambda: uuid.uuid4().hex[:12]

    def check(
        self,
        actor: str,
        operation: GatedOperation,
        tenant: str,
        schedule: str,
        change: Mapping[str, Any],
        *,
        written: Mapping[str, Any] | None = None,
        why: str = "",
    ) -> Approval:
        """The approved request of `actor`'s to consume; raises ApprovalRequired (after
        storing the request in its own transaction, so it outlives the refusal) when there is
        none. The request binds to `written`, the change as the operator wrote it (default:
        `change`); `change` is what it stores and shows, with anything left open in `written`
        (an interval's anchor) fixed, and what the caller applies from the approved request.
        `why` says what makes the schedule sensitive, for the message."""
        described = {"schedule": schedule, **change}
        digest = change_digest(
            operation, tenant, {"schedule": schedule, **(written or change)}, actor
        )
        now = self._clock.now_ms()
        approved = self._storage.approvals.find(
            tenant=tenant, digest=digest, state=ApprovalState.APPROVED, now_ms=now
        )
        if approved is not None:
            return approved
        with self._storage.atomic():
            pending = self._pending(actor, operation, tenant, schedule, described, digest, now)
        raise ApprovalRequired(
            f"{operation.value} of sensitive schedule {tenant}/{schedule}{why} needs a second "
            f"operator's approval: request {pending.id} is pending until "
            f"{iso_utc(pending.expires_at)}. An approver other than {pending.requested_by} runs "
            f"`vortos approvals approve {pending.id}`; then {actor} runs this again (an "
            "approval is its requester's to use, for exactly this change)",
            pending,
        )

    def _pending(
        self,
        actor: str,
        operation: GatedOperation,
        tenant: str,
        schedule: str,
        described: dict[str, Any],
        digest: str,
        now: int,
    ) -> Approval:
        """The pending request for this change: the one stored (asking twice is one request),
        else a new one, stored and audited (inside the caller's transaction)."""
        approvals = self._storage.approvals
        pending = approvals.find(
            tenant=tenant, digest=digest, state=ApprovalState.PENDING, now_ms=now
        )
        if pending is not None:
            return pending
        pending = Approval(
            id=self.new_id(),
            tenant=tenant,
            schedule=schedule,
            operation=operation,
            digest=digest,
            change=described,
            requested_by=actor,
            requested_at=now,
            expires_at=now + self.ttl_ms,
            stored_state=ApprovalState.PENDING,
        )
        approvals.add(pending)
        self._append(
            actor,
            [
                AuditEvent(
                    "approval.requested",
                    actor=actor,
                    tenant=tenant,
                    data={
                        "approval": pending.id,
                        "operation": operation.value,
                        "schedule": schedule,
                        "digest": digest,
                    },
                )
            ],
        )
        log.info("%s asked for approval %s: %s %s", actor, pending.id, operation, schedule)
        return pending

    def consume(self, actor: str, approval: Approval) -> None:
        """Inside the change's transaction: use the approval up, once."""
        used = self._storage.approvals.transition(
            approval.id,
            expect=ApprovalState.APPROVED,
            to=ApprovalState.CONSUMED,
            by=actor,
            at=self._clock.now_ms(),
        )
        if not used:
            raise Conflict(
                f"approval {approval.id} was used by another change meanwhile: ask again"
            )
        self._append(
            actor,
            [
                AuditEvent(
                    "approval.consumed",
                    actor=actor,
                    tenant=approval.tenant,
                    data={"approval": approval.id, "operation": approval.operation.value},
                )
            ],
        )

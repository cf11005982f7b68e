"""Four-eyes: a sensitive change waits for a second operator's approval (pure).

An approval authorises exactly one execution of exactly the approved change: the request
carries a digest of the change (the operation, the schedule at its version, the parameters),
and executing the change consumes it. It expires after a TTL whether or not anyone sweeps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from engine.domain.audit import canonical
from engine.domain.control_chars import refuse_control_characters
from engine.domain.errors import InvalidInput, VortosError
from engine.domain.timeutil import SECOND_MS, parse_duration

DEFAULT_APPROVAL_TTL_MS = 24 * 3600 * 1000
MAX_APPROVAL_TTL_MS = 30 * 24 * 3600 * 1000


def approval_ttl_ms(text: str) -> int:
    """How long a request stays open, and an approval usable, as an operator writes it."""
    ttl = parse_duration(text, what="approval TTL")
    if not SECOND_MS <= ttl <= MAX_APPROVAL_TTL_MS:
        raise InvalidInput(f"approval TTL {text!r} is out of range: use 1s to 30d")
    return ttl


REASON_MIN = 10
REASON_MAX = 1000


class ApprovalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"  # derived: pending or approved past its expiry, never stored
    CONSUMED = "consumed"


class GatedOperation(StrEnum):
    """The changes of a sensitive schedule that need a second operator. Pausing is not one:
    stopping a schedule is what an operator does in an incident, alone, at once."""

    CREATE = "create"
    UPDATE = "update"
    RESUME = "resume"  # activating it
    TRIGGER = "trigger"
    BACKFILL = "backfill"
    DELETE = "delete"  # else delete-and-recreate without the flag would step around the gate
    REQUEUE = "requeue"  # a dead letter run again is one more execution an operator chose


@dataclass(frozen=True, slots=True)
class Approval:
    id: str
    tenant: str
    schedule: str  # the schedule's name
    operation: GatedOperation
    digest: str
    change: Mapping[str, Any]  # what was asked, as shown to the approver
    requested_by: str
    requested_at: int
    expires_at: int
    stored_state: ApprovalState
    decided_by: str | None = None
    decided_at: int | None = None
    reason: str | None = None
    consumed_at: int | None = None

    def state_at(self, now_ms: int) -> ApprovalState:
        if self.stored_state in (ApprovalState.PENDING, ApprovalState.APPROVED) and (
            now_ms >= self.expires_at
        ):
            return ApprovalState.EXPIRED
        return self.stored_state


def change_digest(
    operation: GatedOperation, tenant: str, change: Mapping[str, Any], requested_by: str
) -> str:
    """What an approval is bound to: the change as its requester wrote it, and the requester.
    Only the operator who asked may apply the approved change (another operator asking for
    the same change makes a request of their own)."""
    body = canonical(
        {
            "operation": operation.value,
            "tenant": tenant,
            "change": dict(change),
            "requested_by": requested_by,
        }
    )
    return hashlib.sha256(body.encode()).hexdigest()


def validate_reason(reason: str) -> str:
    text = reason.strip()
    if len(text) < REASON_MIN:
        raise InvalidInput(
            f"a rejection needs a reason of at least {REASON_MIN} characters, so the requester "
            "knows what to change"
        )
    if len(text) > REASON_MAX:
        raise InvalidInput(f"the reason is {len(text)} characters: at most {REASON_MAX}")
    refuse_control_characters(text, "reason")
    return text


class ApprovalRequired(VortosError):
    """The change waits for a second operator; the message names the request and what to do."""

    exit_code = 6

    def __init__(self, message: str, approval: Approval) -> None:
        super().__init__(message)
        self.approval = approval

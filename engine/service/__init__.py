"""ScheduleService: the only way anything changes a schedule or asks for a fire.

The CLI, the console and Python callers all come through here, so validation happens once, at
the boundary, before anything is stored. Policy, four-eyes and audit join this path with the
governance issue; with access control given, every change is authorised first.
"""

from engine.domain.preview import PREVIEW_MAX, PreviewSlot
from engine.service.approvals import Approvals
from engine.service.audit_trail import AuditTrail
from engine.service.core import validate_spec
from engine.service.manual import BACKFILL_CONFIRM_OVER, BackfillReport, ManualFires
from engine.service.operators import OperatorAdmin
from engine.service.queue import DeadLetters
from engine.service.retention import RetentionAdmin, RetentionView
from engine.service.site import SiteFacts
from engine.service.static import StaticSync, SyncReport


class ScheduleService(
    ManualFires,
    DeadLetters,
    StaticSync,
    OperatorAdmin,
    Approvals,
    AuditTrail,
    RetentionAdmin,
    SiteFacts,
):
    """Schedules (create, pause, resume, delete, preview), manual fires (trigger, backfill),
    dead letters (list, requeue, purge), static schedules (sync), operators (grant,
    revoke), four-eyes approvals (approve, reject), the audit chains an operator may read, and
    retention (per-tenant overrides, legal holds, pruning now)."""


__all__ = [
    "BACKFILL_CONFIRM_OVER",
    "PREVIEW_MAX",
    "BackfillReport",
    "PreviewSlot",
    "RetentionView",
    "ScheduleService",
    "SyncReport",
    "validate_spec",
]

"""The doctor's look at the external anchors: is the newest signed head recent enough?"""

from __future__ import annotations

from pathlib import Path

from engine.domain.errors import InvalidInput
from engine.domain.timeutil import format_duration
from engine.domain.triggers import IntervalTrigger
from engine.governance.anchors import default_anchor_file, newest_anchor_at
from engine.governance.checks import _Named
from engine.governance.doctor import DoctorContext, Finding
from engine.retention.audit_upkeep import ANCHOR_EVERY_MS, ANCHOR_SCHEDULE, ANCHOR_TENANT

ANCHOR_HINT = (
    "`vortos run` anchors every hour (schedule system/vortos.audit-anchor: make sure it is "
    "active); `vortos audit anchor` anchors now"
)


class AnchorAge(_Named):
    """The newest external anchor is younger than twice the anchoring interval."""

    def __init__(self) -> None:
        super().__init__("audit.anchor_age")

    def run(self, ctx: DoctorContext) -> Finding:
        schedule = ctx.storage.schedules.find_by_name(ANCHOR_TENANT, ANCHOR_SCHEDULE)
        every = ANCHOR_EVERY_MS
        named = None
        if schedule is not None:
            if isinstance(schedule.trigger, IntervalTrigger):
                every = schedule.trigger.every_ms
            file = schedule.payload.get("file")
            named = Path(file) if isinstance(file, str) and file else None
        path = named or default_anchor_file(ctx.db)
        has_entries = not ctx.storage.audit.is_empty()
        if path is None:
            if not has_entries:
                return self.ok("no audit entries yet")
            return self.warn(
                "no anchors file is configured",
                "a PostgreSQL database has no default anchors file, so a truncated chain "
                "tail goes unnoticed",
                f"set `file` in the payload of {ANCHOR_TENANT}/{ANCHOR_SCHEDULE}",
            )
        try:
            newest = newest_anchor_at(path)
        except InvalidInput as exc:
            return self.warn("the anchors file cannot be read", str(exc), ANCHOR_HINT)
        if newest is None:
            if not has_entries:
                return self.ok("no audit entries yet")
            return self.warn(
                "the audit chains have never been anchored",
                f"no signed head in {path}: a truncated chain tail would go unnoticed",
                ANCHOR_HINT,
            )
        age = max(0, ctx.clock.now_ms() - newest)
        if age > 2 * every:
            return self.warn(
                f"the newest anchor is {format_duration(age // 1000 * 1000)} old",
                f"anchoring every {format_duration(every)}: more than twice that since the "
                f"last signed head in {path}",
                ANCHOR_HINT,
            )
        return self.ok(
            f"the newest anchor is {format_duration(age // 1000 * 1000)} old",
            f"in {path}, anchoring every {format_duration(every)}",
        )

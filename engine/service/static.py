"""Static schedules: declared in code with @scheduled, synced into the store at start."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from engine.commands.decorators import StaticSchedule
from engine.domain.access import Operation
from engine.domain.approvals import GatedOperation
from engine.domain.errors import DuplicateName, InvalidInput
from engine.domain.misfire import due_at
from engine.domain.schedule import (
    DEFAULT_TENANT,
    Schedule,
    ScheduleOrigin,
    ScheduleSpec,
    ScheduleStatus,
)
from engine.domain.triggers import CronTrigger
from engine.ports.schedules import ScheduleQuery
from engine.service.core import (
    ServiceCore,
    definition,
    new_schedule,
    validate_spec,
    with_definition,
)

log = logging.getLogger("vortos.service")

UNDECLARED_NOTE = "no longer declared in code"
DECLARED_PAUSED_NOTE = "declared paused in code"


@dataclass(slots=True)
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)  # static, stored, no longer declared


class StaticSync(ServiceCore):
    def sync_static(
        self, declared: Sequence[StaticSchedule], *, actor: str, complete: bool = True
    ) -> SyncReport:
        """Make the stored static schedules match `declared`: create the new, update the
        changed (keeping an operator's override), and, when `declared` is `complete` (every
        static schedule of the app), disable the ones no longer declared. Everything is
        checked before anything is written: a clash with a dynamic schedule's name changes
        nothing."""
        now = self._clock.now_ms()
        # A static schedule of a sensitive command is stored sensitive, like a dynamic one: a
        # process that does not load the app (a CLI, a service started without --app) still
        # gates it. Syncing stores the flag on schedules stored before.
        declared = [replace(item, spec=self._sensitive_by_command(item.spec)) for item in declared]
        firsts = self._checked_first_slots(declared, now)
        report = SyncReport()
        # One transaction: a sync lands whole, with its audit entries, or not at all.
        with self._storage.atomic():
            wanted = {_key(item.spec) for item in declared}
            for as_declared in declared:
                self._sync_one(as_declared, firsts, now, actor, report)
            for stored in self._stored_static() if complete else []:
                if (
                    stored.tenant,
                    stored.name,
                ) in wanted or stored.status is ScheduleStatus.DISABLED:
                    continue
                self._disable_undeclared(stored, now, actor)
                report.disabled.append(f"{stored.tenant}/{stored.name}")
        log.info(
            "static schedules synced by %s: %d created, %d updated, %d unchanged, %d disabled",
            actor,
            len(report.created),
            len(report.updated),
            len(report.unchanged),
            len(report.disabled),
        )
        return report

    def _checked_first_slots(
        self, declared: Sequence[StaticSchedule], now: int
    ) -> dict[tuple[str, str], int]:
        """Each declared schedule's first slot, once all are checked: a spec that does not
        validate, or a clash with a dynamic schedule's name, refuses the sync before any write."""
        firsts = {}
        for item in declared:
            firsts[_key(item.spec)] = validate_spec(item.spec, self.commands, now)
            existing = self._storage.schedules.find_by_name(item.spec.tenant, item.spec.name)
            if existing is not None and existing.origin is ScheduleOrigin.DYNAMIC:
                raise DuplicateName(
                    f"static schedule {item.spec.name!r} ({item.source}) clashes with a dynamic "
                    f"schedule of that name in tenant {item.spec.tenant!r}: delete the dynamic "
                    "one, or give the static one another name"
                )
        return firsts

    def _sync_one(
        self,
        as_declared: StaticSchedule,
        firsts: dict[tuple[str, str], int],
        now: int,
        actor: str,
        report: SyncReport,
    ) -> None:
        """Create, update or leave as it is one declared schedule (in the sync's transaction)."""
        existing = self._storage.schedules.find_by_name(
            as_declared.spec.tenant, as_declared.spec.name
        )
        item = _keeping_stored_dst_rules(as_declared, existing)
        spec = item.spec
        label = f"{spec.tenant}/{spec.name}"
        if existing is None:
            created = new_schedule(spec, firsts[_key(spec)], now, ScheduleOrigin.STATIC)
            if item.paused:
                created = replace(
                    created,
                    status=ScheduleStatus.PAUSED,
                    declared_paused=True,
                    pause_note=DECLARED_PAUSED_NOTE,
                )
            self._storage.schedules.insert(created)
            self._record("schedule.created", actor, created, definition=definition(created))
            report.created.append(label)
        elif _same_definition(existing, item) and existing.status is _status(existing, item.paused):
            report.unchanged.append(label)
        else:
            updated = self._storage.schedules.update(
                _redefined(existing, item, now), existing.version
            )
            self._record("schedule.updated", actor, updated, definition=definition(updated))
            report.updated.append(label)

    def _disable_undeclared(self, stored: Schedule, now: int, actor: str) -> None:
        """A static schedule the app no longer declares: disabled, not deleted (its runs and
        history stay; declared again, it returns as declared)."""
        disabled = self._storage.schedules.update(
            replace(
                stored,
                status=ScheduleStatus.DISABLED,
                pause_note=UNDECLARED_NOTE,
                updated_at=now,
            ),
            stored.version,
        )
        self._record("schedule.disabled", actor, disabled, reason=UNDECLARED_NOTE)

    def clear_override(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
    ) -> Schedule:
        """Drop an operator's pause or resume of a static schedule: it is again as its code
        declares (a declared-active schedule fires from the next slot after now)."""
        self._authorize(actor, Operation.PAUSE, tenant)
        schedule = self._current(name, tenant, expected_version)
        if schedule.origin is not ScheduleOrigin.STATIC:
            raise InvalidInput(
                f"schedule {name!r} is dynamic: only a static (code-declared) schedule has an "
                "override to clear; pause or resume it instead"
            )
        if schedule.override is None:
            return schedule
        target = (
            ScheduleStatus.DISABLED
            if schedule.status is ScheduleStatus.DISABLED
            else schedule.declared_status
        )
        activating = target is ScheduleStatus.ACTIVE and schedule.status is not target
        operation = Operation.RESUME if activating else Operation.PAUSE
        self._authorize(actor, operation, tenant)
        approval = (
            self.four_eyes.check(
                actor,
                GatedOperation.RESUME,
                tenant,
                name,
                {"schedule_id": schedule.id, "version": schedule.version, "clear_override": True},
                why=why,
            )
            if activating
            and (why := self.protection(schedule.sensitive, schedule.command)) is not None
            else None
        )
        changed = _override_cleared(schedule, target, self._clock.now_ms(), activating=activating)
        with self._changing(actor, operation, tenant):
            if approval is not None:
                self.four_eyes.consume(actor, approval)
            stored = self._storage.schedules.update(changed, schedule.version)
            self._record("schedule.override_cleared", actor, stored, status=target.value)
        log.info(
            "schedule %s/%s: override cleared by %s, now %s as declared",
            tenant,
            name,
            actor,
            target.value,
        )
        return stored

    def _stored_static(self) -> list[Schedule]:
        found: list[Schedule] = []
        offset = 0
        while True:
            page = self._storage.schedules.query(ScheduleQuery(limit=1000, offset=offset))
            found.extend(s for s in page if s.origin is ScheduleOrigin.STATIC)
            if len(page) < 1000:
                return found
            offset += 1000


def _key(spec: ScheduleSpec) -> tuple[str, str]:
    return (spec.tenant, spec.name)


def _status(s: Schedule, declared_paused: bool) -> ScheduleStatus:
    """What a declared static schedule's status is: an operator's override, else the code's."""
    if s.override is not None:
        return s.override.state
    return ScheduleStatus.PAUSED if declared_paused else ScheduleStatus.ACTIVE


def _same_definition(s: Schedule, item: StaticSchedule) -> bool:
    spec = item.spec
    return (
        s.declared_paused == item.paused
        and s.trigger == spec.trigger
        and s.timezone == spec.timezone
        and s.command == spec.command
        and dict(s.payload) == dict(spec.payload)
        and s.misfire == spec.misfire
        and s.overlap is spec.overlap
        and s.jitter_ms == spec.jitter_ms
        and s.sensitive == spec.sensitive
        and dict(s.metadata) == dict(spec.metadata)
        and s.retry == spec.retry
    )


def _redefined(s: Schedule, item: StaticSchedule, now: int) -> Schedule:
    """`s` as `item` declares it. A new trigger, zone or jitter restarts the cursor from now;
    an operator's override survives; a disabled (once undeclared) schedule returns as declared.
    A schedule the code no longer declares paused fires from the next slot after now."""
    spec = item.spec
    status = _status(s, item.paused)
    changed = replace(with_definition(s, spec, now), declared_paused=item.paused, status=status)
    if status is not s.status:
        note = s.pause_note if s.override is not None else DECLARED_PAUSED_NOTE
        changed = replace(changed, pause_note=None if status is ScheduleStatus.ACTIVE else note)
    restart = status is ScheduleStatus.ACTIVE and s.status is ScheduleStatus.PAUSED
    if restart or (s.trigger, s.timezone, s.jitter_ms) != (
        spec.trigger,
        spec.timezone,
        spec.jitter_ms,
    ):
        changed = _from_next_slot(changed, now)
    return changed


def _override_cleared(
    schedule: Schedule, target: ScheduleStatus, now: int, *, activating: bool
) -> Schedule:
    """`schedule` with its override dropped, in the `target` status its code declares (a
    disabled one stays disabled, with its note); one that becomes active fires from the next
    slot after now, not from the slots it missed while paused."""
    changed = replace(
        schedule,
        status=target,
        override=None,
        updated_at=now,
        pause_note=DECLARED_PAUSED_NOTE
        if target is ScheduleStatus.PAUSED
        else (schedule.pause_note if target is ScheduleStatus.DISABLED else None),
    )
    return _from_next_slot(changed, now) if activating else changed


def _from_next_slot(schedule: Schedule, now: int) -> Schedule:
    """`schedule` with its cursor restarted at its trigger's first slot after now."""
    slot = schedule.trigger.slot_after(now - 1, schedule.timezone)
    at = None if slot is None else slot.at_ms
    return replace(
        schedule,
        next_slot_at=at,
        next_fire_at=None
        if at is None
        else due_at(schedule.id, at, schedule.timezone, schedule.jitter_ms),
    )


def _keeping_stored_dst_rules(item: StaticSchedule, existing: Schedule | None) -> StaticSchedule:
    """A cron declared without DST rules keeps the ones its stored schedule has: the default
    for new schedules changed (to `auto`), and a deploy must not change how an existing
    schedule fires on the night the clocks change."""
    declared, stored = item.spec.trigger, None if existing is None else existing.trigger
    if item.dst_declared or not isinstance(declared, CronTrigger):
        return item
    if not isinstance(stored, CronTrigger):
        return item
    kept = CronTrigger(declared.expression, stored.repeated, stored.missing)
    return replace(item, spec=replace(item.spec, trigger=kept))

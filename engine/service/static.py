"""Static schedules: declared in code with @scheduled, synced into the store at start."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from engine.commands.decorators import StaticSchedule
from engine.domain.errors import DuplicateName
from engine.domain.misfire import due_at
from engine.domain.schedule import Schedule, ScheduleOrigin, ScheduleSpec, ScheduleStatus
from engine.ports.schedules import ScheduleQuery
from engine.service.core import ServiceCore, definition, new_schedule, validate_spec

log = logging.getLogger("vortos.service")

UNDECLARED_NOTE = "no longer declared in code"


@dataclass(slots=True)
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)  # static, stored, no longer declared


class StaticSync(ServiceCore):
    def sync_static(self, declared: Sequence[StaticSchedule], *, actor: str) -> SyncReport:
        """Make the stored static schedules match `declared`: create the new, update the
        changed (keeping a pause), disable the ones no longer declared. Everything is checked
        before anything is written: a clash with a dynamic schedule's name changes nothing."""
        now = self._clock.now_ms()
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
        report = SyncReport()
        # One transaction: a sync lands whole, with its audit entries, or not at all.
        with self._storage.atomic():
            wanted = {_key(item.spec) for item in declared}
            for item in declared:
                spec = item.spec
                label = f"{spec.tenant}/{spec.name}"
                existing = self._storage.schedules.find_by_name(spec.tenant, spec.name)
                if existing is None:
                    created = new_schedule(spec, firsts[_key(spec)], now, ScheduleOrigin.STATIC)
                    self._storage.schedules.insert(created)
                    self._record("schedule.created", actor, created, definition=definition(created))
                    report.created.append(label)
                elif _same_definition(existing, spec) and existing.status is not (
                    ScheduleStatus.DISABLED
                ):
                    report.unchanged.append(label)
                else:
                    updated = self._storage.schedules.update(
                        _redefined(existing, spec, now), existing.version
                    )
                    self._record("schedule.updated", actor, updated, definition=definition(updated))
                    report.updated.append(label)
            for stored in self._stored_static():
                if (
                    stored.tenant,
                    stored.name,
                ) in wanted or stored.status is ScheduleStatus.DISABLED:
                    continue
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


def _same_definition(s: Schedule, spec: ScheduleSpec) -> bool:
    return (
        s.trigger == spec.trigger
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


def _redefined(s: Schedule, spec: ScheduleSpec, now: int) -> Schedule:
    """`s` with `spec`'s definition. A new trigger, zone or jitter restarts the cursor from now;
    a pause by an operator survives; a disabled (once undeclared) schedule is active again."""
    changed = replace(
        s,
        trigger=spec.trigger,
        timezone=spec.timezone,
        command=spec.command,
        payload=dict(spec.payload),
        misfire=spec.misfire,
        overlap=spec.overlap,
        jitter_ms=spec.jitter_ms,
        sensitive=spec.sensitive,
        metadata=dict(spec.metadata),
        retry=spec.retry,
        updated_at=now,
    )
    if s.status is ScheduleStatus.DISABLED:
        changed = replace(changed, status=ScheduleStatus.ACTIVE, pause_note=None)
    if (s.trigger, s.timezone, s.jitter_ms) != (spec.trigger, spec.timezone, spec.jitter_ms):
        slot = spec.trigger.slot_after(now - 1, spec.timezone)
        at = None if slot is None else slot.at_ms
        changed = replace(
            changed,
            next_slot_at=at,
            next_fire_at=None if at is None else due_at(s.id, at, spec.timezone, spec.jitter_ms),
        )
    return changed

"""Upcoming slots of a schedule, as an operator previews them (pure: no storage, no clock)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.domain.errors import InvalidInput
from engine.domain.misfire import due_at
from engine.domain.schedule import Schedule
from engine.domain.slots import slot_key
from engine.domain.timeutil import iso_local, iso_utc
from engine.domain.wallclock import SlotNote

PREVIEW_MAX = 1000


@dataclass(frozen=True, slots=True)
class PreviewSlot:
    """One upcoming slot as `preview` shows it."""

    at_ms: int
    due_ms: int
    local: str
    utc: str
    slot_key: str
    note: SlotNote


def preview_slots(schedule: Schedule, after_ms: int, count: int) -> list[PreviewSlot]:
    """The next `count` slots at or after `after_ms`, marking DST effects. Fewer when the
    trigger ends (a one-shot that has passed has none)."""
    if not 1 <= count <= PREVIEW_MAX:
        raise InvalidInput(f"count {count} is out of range: use 1 to {PREVIEW_MAX}")
    cursor = after_ms - 1
    slots: list[PreviewSlot] = []
    while len(slots) < count:
        slot = schedule.trigger.slot_after(cursor, schedule.timezone)
        if slot is None:
            break
        cursor = slot.at_ms
        slots.append(
            PreviewSlot(
                at_ms=slot.at_ms,
                due_ms=due_at(schedule.id, slot.at_ms, schedule.timezone, schedule.jitter_ms),
                local=iso_local(slot.at_ms, schedule.timezone),
                utc=iso_utc(slot.at_ms),
                slot_key=slot_key(schedule.id, slot.at_ms, schedule.timezone),
                note=slot.note,
            )
        )
    return slots

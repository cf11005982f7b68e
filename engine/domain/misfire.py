"""Which due slots of a schedule fire now: the misfire policy applied to the slots in the window.

Pure: given the trigger, the cursor (first unresolved slot) and the current instant, it says which
slot instants to dispatch and where the cursor goes next.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.domain.schedule import MisfireKind, MisfirePolicy
from engine.domain.slots import jitter_offset_ms, slot_key
from engine.domain.triggers import Trigger, next_after

# One resolve never walks more slots than this; the rest are taken on the next tick.
MAX_SLOTS_PER_RESOLVE = 100_000
# Slots dropped for age are counted up to this many; past it the cursor jumps straight on.
AGE_COUNT_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """The outcome of resolving one schedule at one instant."""

    fire: tuple[int, ...]  # slot instants to dispatch, oldest first
    skipped_missed: int  # missed slots the policy chose not to fire
    dropped_aged: int  # slots older than the maximum catch-up age (saturates at AGE_COUNT_LIMIT)
    next_slot_at: int | None
    next_fire_at: int | None


def due_at(schedule_id: str, at_ms: int, tz: str, jitter_ms: int) -> int:
    """When a slot is due: its instant plus its stable jitter offset."""
    if jitter_ms <= 0:
        return at_ms
    return at_ms + jitter_offset_ms(slot_key(schedule_id, at_ms, tz), jitter_ms)


def plan_slots(
    *,
    schedule_id: str,
    trigger: Trigger,
    tz: str,
    cursor_ms: int,
    now_ms: int,
    policy: MisfirePolicy,
    jitter_ms: int = 0,
) -> SlotPlan:
    """Resolve the slots from `cursor_ms` (inclusive) that are due at `now_ms`."""
    on_time_from = now_ms - min(policy.grace_ms, policy.max_age_ms)
    if jitter_ms <= 0 and on_time_from <= cursor_ms <= now_ms:
        # The common case, taken for every fire: one slot, on time. Decided without the
        # general walk below, which would reach the same answer.
        following = next_after(trigger, cursor_ms, tz)
        if following is None or following > now_ms:
            return SlotPlan((cursor_ms,), 0, 0, following, following)
    cursor: int | None = cursor_ms
    dropped_aged = 0
    horizon = now_ms - policy.max_age_ms
    while cursor is not None and cursor < horizon and dropped_aged < AGE_COUNT_LIMIT:
        dropped_aged += 1
        cursor = next_after(trigger, cursor, tz)
    if cursor is not None and cursor < horizon:
        cursor = next_after(trigger, horizon - 1, tz)

    due: list[int] = []
    while (
        cursor is not None
        and due_at(schedule_id, cursor, tz, jitter_ms) <= now_ms
        and len(due) < MAX_SLOTS_PER_RESOLVE
    ):
        due.append(cursor)
        cursor = next_after(trigger, cursor, tz)

    missed = [s for s in due if now_ms - due_at(schedule_id, s, tz, jitter_ms) > policy.grace_ms]
    missed_set = set(missed)
    on_time = [s for s in due if s not in missed_set]
    if policy.kind is MisfireKind.SKIP:
        fire = on_time
    elif policy.kind is MisfireKind.LATEST:
        fire = on_time if on_time else missed[-1:]
    else:
        fire = sorted(missed[-policy.catch_up_cap :] + on_time)
    next_fire = None if cursor is None else due_at(schedule_id, cursor, tz, jitter_ms)
    return SlotPlan(
        fire=tuple(fire),
        skipped_missed=len(due) - len(fire),
        dropped_aged=dropped_aged,
        next_slot_at=cursor,
        next_fire_at=next_fire,
    )

"""Misfire policies after a simulated 3-hour outage, on a manual clock and a real database.

The schedule fires every 10 minutes from 00:00. The daemon dispatches 00:00, then is down until
03:05 (or 03:00:30), so 00:10 .. 03:00 are due when it comes back.
"""

from __future__ import annotations

import pytest

from engine import (
    CronTrigger,
    Engine,
    ManualClock,
    MisfireKind,
    MisfirePolicy,
    ScheduleSpec,
)
from engine.domain.timeutil import HOUR_MS, MINUTE_MS
from tests.conftest import T0
from tests.helpers import fired_slots, settle

EVERY_TEN = "*/10 * * * *"
ALL_MISSED = [f"2026-01-05T{h:02d}:{m:02d}:00+00:00" for h in range(4) for m in range(0, 60, 10)]
ALL_MISSED = [s for s in ALL_MISSED if "T00:00" not in s and s <= "2026-01-05T03:00:00+00:00"]


def outage(engine: Engine, clock: ManualClock, policy: MisfirePolicy, back_at_ms: int) -> list[str]:
    engine.service.create(
        ScheduleSpec(name="report", trigger=CronTrigger(EVERY_TEN), command="noop", misfire=policy),
        actor="test",
    )
    daemon = engine.daemon(node_id="n1", lease_ttl_ms=10_000)
    settle(daemon)  # 00:00 fires on time
    clock.set(back_at_ms)
    settle(daemon)
    slots = fired_slots(engine, "report")
    assert slots[0] == "2026-01-05T00:00:00+00:00"
    return slots[1:]


BACK_LATE = T0 + 3 * HOUR_MS + 5 * MINUTE_MS  # 03:05: the 03:00 slot is 5 minutes late
BACK_IN_GRACE = T0 + 3 * HOUR_MS + 30_000  # 03:00:30: the 03:00 slot is within its grace


def test_there_are_eighteen_missed_slots() -> None:
    assert len(ALL_MISSED) == 18


def test_skip_fires_none_of_the_missed_slots(engine: Engine, clock: ManualClock) -> None:
    assert outage(engine, clock, MisfirePolicy(MisfireKind.SKIP), BACK_LATE) == []


def test_skip_still_fires_a_slot_within_its_grace(engine: Engine, clock: ManualClock) -> None:
    fired = outage(engine, clock, MisfirePolicy(MisfireKind.SKIP), BACK_IN_GRACE)
    assert fired == ["2026-01-05T03:00:00+00:00"]


def test_latest_fires_only_the_newest_missed_slot(engine: Engine, clock: ManualClock) -> None:
    fired = outage(engine, clock, MisfirePolicy(MisfireKind.LATEST), BACK_LATE)
    assert fired == ["2026-01-05T03:00:00+00:00"]


def test_latest_fires_nothing_extra_when_a_slot_is_on_time(
    engine: Engine, clock: ManualClock
) -> None:
    fired = outage(engine, clock, MisfirePolicy(MisfireKind.LATEST), BACK_IN_GRACE)
    assert fired == ["2026-01-05T03:00:00+00:00"]


def test_each_fires_every_missed_slot_oldest_first(engine: Engine, clock: ManualClock) -> None:
    assert outage(engine, clock, MisfirePolicy(MisfireKind.EACH), BACK_LATE) == ALL_MISSED


def test_each_with_a_cap_fires_only_the_newest_missed_slots(
    engine: Engine, clock: ManualClock
) -> None:
    fired = outage(engine, clock, MisfirePolicy(MisfireKind.EACH, catch_up_cap=5), BACK_LATE)
    assert fired == ALL_MISSED[-5:]


def test_maximum_age_drops_older_slots_under_each(engine: Engine, clock: ManualClock) -> None:
    policy = MisfirePolicy(MisfireKind.EACH, max_age_ms=HOUR_MS)
    fired = outage(engine, clock, policy, BACK_LATE)
    # Older than 02:05 is dropped: 02:10 .. 03:00 remain.
    assert fired == [s for s in ALL_MISSED if s >= "2026-01-05T02:10"]


def test_maximum_age_and_cap_together(engine: Engine, clock: ManualClock) -> None:
    policy = MisfirePolicy(MisfireKind.EACH, catch_up_cap=3, max_age_ms=HOUR_MS)
    assert outage(engine, clock, policy, BACK_LATE) == ALL_MISSED[-3:]


def test_maximum_age_drops_everything_under_latest_when_all_too_old(
    engine: Engine, clock: ManualClock
) -> None:
    policy = MisfirePolicy(MisfireKind.LATEST, max_age_ms=2 * MINUTE_MS)
    assert outage(engine, clock, policy, BACK_LATE) == []


@pytest.mark.parametrize("kind", list(MisfireKind))
def test_after_catching_up_the_next_slot_fires_on_time(
    engine: Engine, clock: ManualClock, kind: MisfireKind
) -> None:
    outage(engine, clock, MisfirePolicy(kind), BACK_LATE)
    schedule = engine.service.get("report")
    assert schedule.next_fire_at == T0 + 3 * HOUR_MS + 10 * MINUTE_MS

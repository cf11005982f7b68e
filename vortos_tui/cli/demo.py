"""Demo schedules, so `vortos run --demo` shows fires on a fresh database at once."""

from __future__ import annotations

from engine import CronTrigger, Engine, IntervalTrigger, ScheduleSpec
from engine.domain.timeutil import SECOND_MS

DEMO_TENANT = "demo"


def seed_demo(engine: Engine, actor: str) -> list[str]:
    """Add the demo schedules that are missing; return the names added."""
    now = engine.clock.now_ms()
    wanted = [
        ScheduleSpec(
            name="heartbeat",
            trigger=IntervalTrigger(5 * SECOND_MS, (now // 1000 + 1) * 1000),
            command="echo",
            payload={"message": "still alive"},
            tenant=DEMO_TENANT,
        ),
        ScheduleSpec(
            name="every-minute",
            trigger=CronTrigger("* * * * *"),
            command="noop",
            tenant=DEMO_TENANT,
        ),
        ScheduleSpec(
            name="nightly-report",
            trigger=CronTrigger("30 2 * * *"),
            timezone="Europe/Berlin",
            command="echo",
            payload={"report": "nightly"},
            tenant=DEMO_TENANT,
        ),
    ]
    added = []
    for spec in wanted:
        if engine.storage.schedules.find_by_name(spec.tenant, spec.name) is None:
            engine.service.create(spec, actor=actor)
            added.append(spec.name)
    return added

"""Demo schedules and their commands, so `vortos run --demo` and `vortos-tui --demo` show fires,
runs, failures, retries and a dead letter on a fresh database within seconds.

The demo commands exist only in a process started with --demo: they are for looking at, not
for production. Their outcomes are decided by the run id, so every demo shows the same mix.
"""

from __future__ import annotations

from engine import (
    CommandRegistry,
    CronTrigger,
    Engine,
    FireContext,
    IntervalTrigger,
    PermanentFailure,
    RetryPolicy,
    ScheduleService,
    ScheduleSpec,
)
from engine.domain.timeutil import SECOND_MS

DEMO_TENANT = "demo"


def _flaky(context: FireContext) -> str:
    """Fails the first attempt of every third run; the retry succeeds."""
    if context.run_id % 3 == 0 and context.attempt == 1:
        raise RuntimeError("upstream answered 503 (the demo's planned failure; retrying)")
    return f"synced on attempt {context.attempt}"


def _slow(context: FireContext, seconds: float = 4.0) -> str:
    """Takes a while, so a run is seen running; stops early when cancelled."""
    context.wait_cancelled(seconds)
    return f"took {seconds}s"


def _broken(context: FireContext) -> None:
    """Every other run fails for good (no retry): a failure to look at."""
    if context.run_id % 2 == 0:
        raise PermanentFailure(
            "the report template is missing (the demo's planned permanent failure)"
        )


def demo_commands(registry: CommandRegistry) -> CommandRegistry:
    """Add the demo's commands to `registry` (idempotent)."""
    for name, run in (("demo.flaky", _flaky), ("demo.slow", _slow), ("demo.broken", _broken)):
        if name not in registry:
            registry.register(name, run)
    return registry


def demo_specs(now_ms: int) -> list[ScheduleSpec]:
    anchor = (now_ms // 1000 + 1) * 1000
    return [
        ScheduleSpec(
            name="heartbeat",
            trigger=IntervalTrigger(5 * SECOND_MS, anchor),
            command="echo",
            payload={"message": "still alive"},
            tenant=DEMO_TENANT,
        ),
        ScheduleSpec(
            name="sync-inventory",
            trigger=IntervalTrigger(7 * SECOND_MS, anchor),
            command="demo.flaky",
            tenant=DEMO_TENANT,
            retry=RetryPolicy(max_attempts=3, backoff_ms=SECOND_MS, backoff_cap_ms=5 * SECOND_MS),
        ),
        ScheduleSpec(
            name="rebuild-search-index",
            trigger=IntervalTrigger(15 * SECOND_MS, anchor),
            command="demo.slow",
            payload={"seconds": 4},
            tenant=DEMO_TENANT,
        ),
        ScheduleSpec(
            name="monthly-invoices",
            trigger=IntervalTrigger(20 * SECOND_MS, anchor),
            command="demo.broken",
            tenant=DEMO_TENANT,
            sensitive=True,
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
        ScheduleSpec(
            name="weekly-cleanup",
            trigger=CronTrigger("0 4 * * 0"),
            timezone="America/New_York",
            command="noop",
            tenant=DEMO_TENANT,
        ),
    ]


PAUSED_NOTE = "paused by the demo: resume it with u"


def seed_demo(engine: Engine, actor: str) -> list[str]:
    """Add the demo schedules that are missing; return the names added. weekly-cleanup is
    added paused, so the console has a paused row to resume."""
    demo_commands(engine.commands)
    # Seeding is the demo's own set-up, not an operator's change: no roles, no four-eyes
    # (one demo schedule is sensitive); every schedule it adds is audited all the same.
    service = ScheduleService(engine.storage, engine.clock, engine.commands)
    added = []
    for spec in demo_specs(engine.clock.now_ms()):
        if engine.storage.schedules.find_by_name(spec.tenant, spec.name) is None:
            service.create(spec, actor=actor)
            if spec.name == "weekly-cleanup":
                service.pause(spec.name, actor=actor, tenant=spec.tenant, note=PAUSED_NOTE)
            added.append(spec.name)
    return added

"""Testing your schedules without a database or a wall clock.

`scheduler_harness` runs the real engine (ScheduleService, SchedulerDaemon, FireQueueConsumer)
on a temporary SQLite file with a ManualClock, and moves time from due instant to due
instant, running each fire's command to completion: a simulated week takes a moment.

    from engine import CronTrigger, ScheduleSpec
    from engine.testing import scheduler_harness
    import myjobs  # billing.send-invoices: @scheduled(cron="0 3 * * *", timezone="Europe/Berlin")

    def test_invoices() -> None:
        with scheduler_harness(app=myjobs, start="2026-03-23T00:00:00Z") as h:
            # a week in which Berlin moves to summer time; offset-less: Berlin wall time
            h.assert_fires_at(
                "billing.send-invoices",
                [f"2026-03-{day}T03:00:00" for day in range(23, 30)],
                within="7d",
            )
            h.service.create(
                ScheduleSpec(
                    name="us-invoices",
                    trigger=CronTrigger("0 6 * * 1"),
                    command="billing.send-invoices",
                    payload={"region": "us"},
                    timezone="America/New_York",
                ),
                actor="test",
            )
            h.advance("7d")
            h.assert_ran_once("billing.send-invoices", {"region": "us"})

Dynamic schedules are created through `h.service`, the real ScheduleService; `h.advance("1h")`
and `h.run_until(instant)` move time; `h.runs(...)` and `h.fires(...)` read what happened.

The conformance suites for new backends are in `engine.testing.conformance`.
"""

import contextlib

# Plain asserts in the shipped conformance suites report their operands, as in a test module:
# registered before anything imports them (pytest is there whenever they run).
with contextlib.suppress(ImportError):
    import pytest

    pytest.register_assert_rewrite("engine.testing.conformance")

from engine.domain.clock import ManualClock
from engine.testing.expectations import Duration, Instant, RunRecord
from engine.testing.harness import SchedulerHarness, scheduler_harness

__all__ = [
    "Duration",
    "Instant",
    "ManualClock",
    "RunRecord",
    "SchedulerHarness",
    "scheduler_harness",
]

"""A seeded database for the console's tests: a fixed set of schedules with fixed ids and a
half hour of real history (fires dispatched by the daemon, run by a consumer, on a manual clock),
so every screen renders the same bytes on every run."""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path
from zoneinfo import ZoneInfo

from engine import (
    CommandFailed,
    CommandRegistry,
    CronTrigger,
    FireContext,
    FireQueueConsumer,
    IntervalTrigger,
    ManualClock,
    RetryPolicy,
    ScheduleSpec,
    builtin_commands,
    open_engine,
)
from engine.domain.schedule import ScheduleOrigin
from engine.domain.timeutil import MINUTE_MS, SECOND_MS, parse_instant
from engine.governance.keys import default_key_file
from engine.service.core import new_schedule, validate_spec
from vortos_tui.cli.demo import demo_commands

# Saturday 23:00 UTC, midnight in Berlin: the clocks there jump from 02:00 to 03:00 tonight, so
# the nightly report's next slots carry a DST mark.
NOW = parse_instant("2026-03-28T23:00:00Z")
HISTORY_MS = 30 * MINUTE_MS
NODE = "node-a"
OPERATOR = "alice"
ZONE = ZoneInfo("Europe/Berlin")


def specs(start: int) -> list[tuple[str, ScheduleSpec]]:
    retry = RetryPolicy(max_attempts=3, backoff_ms=30 * SECOND_MS, backoff_cap_ms=MINUTE_MS)
    return [
        ("s01", ScheduleSpec("heartbeat", IntervalTrigger(MINUTE_MS, start), "echo", tenant="ops")),
        (
            "s02",
            ScheduleSpec(
                "sync-inventory",
                IntervalTrigger(3 * MINUTE_MS, start),
                "demo.flaky",
                tenant="ops",
                retry=retry,
            ),
        ),
        (
            "s03",
            ScheduleSpec(
                "nightly-report",
                CronTrigger("30 2 * * *"),
                "echo",
                timezone="Europe/Berlin",
                payload={"report": "nightly"},
                tenant="ops",
            ),
        ),
        (
            "s04",
            ScheduleSpec(
                "invoice-export",
                IntervalTrigger(4 * MINUTE_MS, start),
                "billing.export",
                tenant="billing",
                sensitive=True,
                retry=RetryPolicy(max_attempts=1),
            ),
        ),
        (
            "s05",
            ScheduleSpec(
                "reconcile-ledger",
                CronTrigger("*/15 * * * *"),
                "noop",
                timezone="America/New_York",
                tenant="billing",
            ),
        ),
        (
            "s06",
            ScheduleSpec(
                "rebuild-search-index", IntervalTrigger(10 * MINUTE_MS, start), "noop", tenant="ops"
            ),
        ),
        ("s07", ScheduleSpec("weekly-cleanup", CronTrigger("0 4 * * 0"), "noop", tenant="ops")),
    ]


def _export(context: FireContext) -> str:
    """Every other export fails the way a program does: an exit code and what it printed (no
    traceback, whose paths and line numbers would differ between checkouts)."""
    if context.run_id % 2 == 0:
        raise CommandFailed(
            "exporter exited with 2",
            output="reading template invoices.tmpl\nerror: template invoices.tmpl not found",
            exit_code=2,
        )
    return "exported 12 invoices"


def commands() -> CommandRegistry:
    """The commands the seeded schedules use."""
    registry = demo_commands(builtin_commands())
    registry.register("billing.export", _export)
    return registry


def _settle(consumer: FireQueueConsumer) -> None:
    deadline = time.monotonic() + 10
    while True:
        consumer.step()
        if consumer.busy == 0 and consumer.unsettled == 0:
            consumer.step()
            if consumer.busy == 0 and consumer.unsettled == 0:
                return
        if time.monotonic() > deadline:
            raise AssertionError("the seeding consumer did not finish")
        time.sleep(0.001)


def build(path: Path) -> None:
    """Write the seeded database at `path`."""
    start = NOW - HISTORY_MS
    clock = ManualClock(start)
    with open_engine(path, clock=clock, commands=commands()) as engine:
        for sid, spec in specs(start):
            first = validate_spec(spec, engine.commands, start)
            schedule = new_schedule(spec, first, start, ScheduleOrigin.DYNAMIC)
            engine.storage.schedules.insert(replace(schedule, id=sid))
        engine.service.pause(
            "weekly-cleanup", actor=OPERATOR, tenant="ops", note="disk migration until Monday"
        )
        daemon = engine.daemon(node_id=NODE, lease_ttl_ms=15 * MINUTE_MS)
        consumer = engine.consumer(consumer_id=NODE, concurrency=1)
        try:
            while True:
                daemon.step()
                _settle(consumer)
                if clock.now_ms() >= NOW:
                    break
                clock.advance(30)
        finally:
            consumer.stop()
            consumer.drain(1.0)


def copy_seeded(template: Path, target: Path) -> Path:
    """The template database and its audit key, as a backup restores both."""
    shutil.copyfile(template, target)
    shutil.copyfile(default_key_file(template), default_key_file(target))
    return target

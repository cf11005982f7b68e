"""The consumer in one process on a manual clock: retries, fencing, manual fires, static sync."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import apsw
import pytest

from engine import (
    CommandRegistry,
    Conflict,
    CronTrigger,
    DuplicateName,
    Engine,
    FireContext,
    FireQueueConsumer,
    FireState,
    IntervalTrigger,
    InvalidInput,
    ManualClock,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    RunKind,
    RunState,
    ScheduleOrigin,
    ScheduleSpec,
    ScheduleStatus,
    StorageError,
    builtin_commands,
    open_engine,
    schedulable,
    scheduled,
)
from engine.commands import Command, StaticSchedule
from engine.commands.decorators import command_of, schedules_of
from engine.domain.timeutil import MINUTE_MS, parse_instant
from engine.ports import RunQuery
from engine.ports.fire_queue import FireQuery
from tests.conftest import T0
from tests.helpers import settle


@dataclass
class Calls:
    """What the test commands did, and a switch to make `flaky` fail."""

    seen: list[tuple[str, int, int]] = field(default_factory=list)  # slot key, attempt, run
    failing: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, fire: FireContext) -> None:
        with self.lock:
            self.seen.append((fire.slot_key, fire.attempt, fire.run_id))

    def flaky(self, *, fire: FireContext) -> str:
        self.record(fire)
        if self.failing:
            raise RuntimeError(f"attempt {fire.attempt} failed")
        return "ok"

    def ok(self, n: int = 0, *, fire: FireContext) -> int:
        self.record(fire)
        return n


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def engine(db_path: Path, clock: ManualClock, calls: Calls) -> Iterator[Engine]:
    commands: CommandRegistry = builtin_commands()
    commands.register("flaky", calls.flaky)
    commands.register("ok", calls.ok)
    commands.add(command_of_nightly())
    with open_engine(db_path, clock=clock, commands=commands) as opened:
        yield opened


def command_of_nightly() -> Command:
    found = command_of(nightly)
    assert found is not None
    return found


def drive(consumer: FireQueueConsumer, until: Callable[[], bool], what: str) -> None:
    """Step the consumer (real time, no clock movement) until `until` holds."""
    deadline = time.monotonic() + 10
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        consumer.step()
        time.sleep(0.002)


def every_minute(name: str, command: str, **extra: object) -> ScheduleSpec:
    return ScheduleSpec(
        name=name,
        trigger=IntervalTrigger(MINUTE_MS, T0),
        command=command,
        **extra,  # type: ignore[arg-type]
    )


def attempted(consumer: FireQueueConsumer, calls: Calls, n: int) -> Callable[[], bool]:
    return lambda: consumer.busy == 0 and len(calls.seen) == n


def only_run(engine: Engine) -> tuple[int, RunState, int]:
    (run,) = engine.service.runs(RunQuery())
    return run.id, run.state, run.attempts


def test_a_failing_command_is_retried_with_growing_delays_then_dead_lettered(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    retry = RetryPolicy(max_attempts=4, backoff_ms=10_000, backoff_cap_ms=3_600_000)
    engine.service.create(every_minute("flaky", "flaky", retry=retry), actor="t")
    engine.service.pause("flaky", actor="t")  # one slot is enough
    engine.service.trigger("flaky", actor="t")
    consumer = engine.consumer(consumer_id="c1", concurrency=1)
    waits: list[int] = []
    for attempt in range(1, 5):
        drive(consumer, attempted(consumer, calls, attempt), f"attempt {attempt}")
        (fire,) = engine.storage.fire_queue.read(FireQuery())
        if attempt < 4:
            assert fire.state_at(clock.now_ms()) is FireState.SCHEDULED
            waits.append(fire.available_at - clock.now_ms())
            clock.set(fire.available_at)
    assert [a for _, a, _ in calls.seen] == [1, 2, 3, 4]
    assert waits[0] >= 10_000
    assert waits[1] >= 20_000
    assert waits[2] >= 40_000
    assert waits == sorted(waits)
    assert all(w <= base * 1.25 for w, base in zip(waits, (10_000, 20_000, 40_000), strict=True))
    run_id, state, attempts = only_run(engine)
    assert state is RunState.DEAD_LETTERED
    assert attempts == 4
    assert [f.run_id for f in engine.service.dead_letters()] == [run_id]


def test_a_requeued_dead_letter_runs_again_and_can_complete(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    engine.service.create(
        every_minute("flaky", "flaky", retry=RetryPolicy(max_attempts=1)), actor="t"
    )
    engine.service.pause("flaky", actor="t")
    engine.service.trigger("flaky", actor="t")
    consumer = engine.consumer(consumer_id="c1", concurrency=1)
    drive(consumer, lambda: only_run(engine)[1] is RunState.DEAD_LETTERED, "the dead letter")
    calls.failing = False
    run_id = only_run(engine)[0]
    assert engine.service.requeue([run_id], actor="t") == 1
    assert only_run(engine)[1] is RunState.DISPATCHED
    drive(consumer, lambda: only_run(engine)[1] is RunState.COMPLETED, "the requeued run")
    assert engine.service.dead_letters() == []
    assert only_run(engine)[2] == 2  # attempts counted on


def test_a_late_settle_after_another_consumer_reclaimed_is_stale_and_changes_nothing(
    engine: Engine, clock: ManualClock
) -> None:
    release = threading.Event()
    commands = builtin_commands()

    def slow(*, fire: FireContext) -> str:
        release.wait(10)
        return f"attempt {fire.attempt}"

    commands.register("slow", slow)
    engine.commands.register("slow", slow)
    engine.service.create(every_minute("slow", "slow", overlap=OverlapPolicy.ALLOW), actor="t")
    engine.service.pause("slow", actor="t")
    engine.service.trigger("slow", actor="t")
    first = engine.consumer(consumer_id="first", concurrency=1, claim_ttl_ms=5_000)
    first.step()
    assert first.busy == 1
    clock.advance(6)  # the first claim ran out and nobody heartbeat it
    second = engine.storage.fire_queue.claim(consumer="second", ttl_ms=60_000, limit=10)
    assert len(second.fires) == 1
    release.set()
    drive(first, lambda: first.busy == 0, "the first consumer's settlement")
    assert first.stats.stale == 1
    run_id, state, attempts = only_run(engine)
    assert state is RunState.RUNNING  # still the second consumer's
    assert attempts == 2
    fire = engine.storage.fire_queue.get(run_id)
    assert fire is not None
    assert fire.consumed_by == "second"
    assert fire.stale_ack_count == 1
    assert fire.abandoned_count == 1
    assert fire.last_abandoned_by == "first"


def test_a_fire_whose_consumer_died_more_often_than_consumer_deaths_is_dead_lettered_unrun(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    engine.service.create(every_minute("ok", "ok", retry=RetryPolicy(max_attempts=5)), actor="t")
    engine.service.pause("ok", actor="t")
    engine.service.trigger("ok", actor="t")
    for n in range(2):  # two consumers that die holding it
        assert engine.storage.fire_queue.claim(consumer=f"dead{n}", ttl_ms=1_000, limit=1).fires
        clock.advance(2)
    consumer = engine.consumer(consumer_id="c1", concurrency=1, consumer_deaths=1)
    consumer.step()
    run_id, state, _ = only_run(engine)
    assert state is RunState.DEAD_LETTERED
    assert calls.seen == []
    run = engine.storage.runs.get(run_id)
    assert run is not None
    assert run.error is not None
    assert "abandoned" in run.error


def test_a_graceful_stop_gives_back_what_does_not_finish_within_the_grace(
    engine: Engine, clock: ManualClock
) -> None:
    started = threading.Event()

    def stuck(*, fire: FireContext) -> None:
        started.set()
        time.sleep(5)  # ignores cancellation on purpose

    engine.commands.register("stuck", stuck)
    engine.service.create(every_minute("stuck", "stuck"), actor="t")
    engine.service.pause("stuck", actor="t")
    engine.service.trigger("stuck", actor="t")
    consumer = engine.consumer(consumer_id="c1", concurrency=1, grace_ms=100)
    consumer.step()
    assert started.wait(5)
    consumer.stop()
    consumer.drain(0.1)
    _, state, _ = only_run(engine)
    assert state is RunState.DISPATCHED
    fire = engine.storage.fire_queue.pending()[0]
    assert fire.lease_token is None
    assert fire.abandoned_count == 0  # released, not abandoned


def test_the_command_receives_its_fires_identity(engine: Engine, calls: Calls) -> None:
    engine.service.create(every_minute("ok", "ok", payload={"n": 7}), actor="t")
    engine.service.pause("ok", actor="t")
    run = engine.service.trigger("ok", actor="t")
    consumer = engine.consumer(consumer_id="c1")
    drive(consumer, lambda: only_run(engine)[1] is RunState.COMPLETED, "the run")
    assert calls.seen == [(run.slot_key, 1, run.id)]
    done = engine.storage.runs.get(run.id)
    assert done is not None
    assert done.output == "7"
    assert done.consumer == "c1"
    assert done.duration_ms is not None


def test_trigger_now_fires_once_and_leaves_the_cursor_alone(
    engine: Engine, clock: ManualClock
) -> None:
    before = engine.service.create(every_minute("ok", "ok"), actor="t")
    run = engine.service.trigger("ok", actor="t")
    after = engine.service.get("ok")
    assert run.kind is RunKind.MANUAL
    assert (after.next_slot_at, after.next_fire_at) == (before.next_slot_at, before.next_fire_at)
    assert engine.service.trigger("ok", actor="t").slot_key != run.slot_key


def test_backfill_of_two_hours_on_a_five_minute_cron_dispatches_24_slots_once(
    engine: Engine, clock: ManualClock
) -> None:
    engine.service.create(
        ScheduleSpec(name="five", trigger=CronTrigger("*/5 * * * *"), command="ok"), actor="t"
    )
    clock.set(parse_instant("2026-01-05T06:00:00Z"))
    start, end = parse_instant("2026-01-05T01:00:00Z"), parse_instant("2026-01-05T03:00:00Z")
    first = engine.service.backfill("five", start_ms=start, end_ms=end, actor="t")
    again = engine.service.backfill("five", start_ms=start, end_ms=end, actor="t")
    assert (first.slots, first.dispatched, first.already) == (24, 24, 0)
    assert (again.slots, again.dispatched, again.already) == (24, 0, 24)
    runs = engine.service.runs(RunQuery(limit=100))
    assert len(runs) == 24
    assert {r.kind for r in runs} == {RunKind.BACKFILL}
    assert len({r.slot_key for r in runs}) == 24


def test_backfill_never_doubles_a_slot_the_daemon_dispatched(
    engine: Engine, clock: ManualClock
) -> None:
    engine.service.create(every_minute("ok", "ok"), actor="t")
    daemon = engine.daemon(node_id="n1", lease_ttl_ms=86_400_000)
    for _ in range(3):
        settle(daemon)
        clock.advance(60)
    report = engine.service.backfill("ok", start_ms=T0, end_ms=T0 + 3 * MINUTE_MS, actor="t")
    assert (report.slots, report.dispatched, report.already) == (3, 0, 3)


def test_resume_with_catch_up_fires_the_slots_missed_while_paused(
    engine: Engine, clock: ManualClock
) -> None:
    each = MisfirePolicy(kind=MisfireKind.EACH)
    engine.service.create(every_minute("ok", "ok", misfire=each), actor="t")
    daemon = engine.daemon(node_id="n1", lease_ttl_ms=86_400_000)
    settle(daemon)
    engine.service.pause("ok", actor="t")
    clock.advance(5 * 60)
    engine.service.resume("ok", actor="t", catch_up=True)
    settle(daemon)
    slots = sorted(r.slot_at for r in engine.service.runs(RunQuery(limit=100)))
    assert slots == [T0 + n * MINUTE_MS for n in range(6)]


def test_resume_without_catch_up_fires_nothing_missed(engine: Engine, clock: ManualClock) -> None:
    engine.service.create(every_minute("ok", "ok"), actor="t")
    daemon = engine.daemon(node_id="n1", lease_ttl_ms=86_400_000)
    settle(daemon)
    engine.service.pause("ok", actor="t")
    clock.advance(5 * 60 + 1)
    engine.service.resume("ok", actor="t")
    settle(daemon)
    assert [r.slot_at for r in engine.service.runs(RunQuery(limit=100))] == [T0]


# -- static schedules --------------------------------------------------------------------------


@scheduled("0 3 * * *")
@schedulable("nightly")
def nightly(*, fire: FireContext) -> None:
    """A static schedule for the tests."""


def declared(cron: str = "0 3 * * *") -> list[StaticSchedule]:
    """nightly's static schedule, its cron changed to `cron` as if the code had been edited."""
    (static,) = schedules_of(nightly)
    return [replace(static, spec=replace(static.spec, trigger=CronTrigger(cron)))]


def test_static_schedules_are_created_and_then_left_alone(engine: Engine) -> None:
    first = engine.service.sync_static(declared(), actor="app")
    again = engine.service.sync_static(declared(), actor="app")
    assert first.created == ["default/nightly"]
    assert again.unchanged == ["default/nightly"]
    schedule = engine.service.get("nightly")
    assert schedule.origin is ScheduleOrigin.STATIC
    assert schedule.version == 1


def test_a_changed_static_schedule_is_updated_and_keeps_an_operators_pause(
    engine: Engine,
) -> None:
    engine.service.sync_static(declared(), actor="app")
    engine.service.pause("nightly", actor="op", note="maintenance")
    report = engine.service.sync_static(declared("0 4 * * *"), actor="app")
    assert report.updated == ["default/nightly"]
    schedule = engine.service.get("nightly")
    assert schedule.status is ScheduleStatus.PAUSED
    assert schedule.trigger == CronTrigger("0 4 * * *")


def test_a_static_schedule_no_longer_declared_is_disabled_and_comes_back(
    engine: Engine,
) -> None:
    engine.service.sync_static(declared(), actor="app")
    assert engine.service.sync_static([], actor="app").disabled == ["default/nightly"]
    assert engine.service.get("nightly").status is ScheduleStatus.DISABLED
    engine.service.sync_static(declared(), actor="app")
    assert engine.service.get("nightly").status is ScheduleStatus.ACTIVE


def test_a_static_schedule_cannot_be_deleted_but_can_be_paused_and_resumed(
    engine: Engine,
) -> None:
    engine.service.sync_static(declared(), actor="app")
    with pytest.raises(Conflict, match="static"):
        engine.service.delete("nightly", actor="op")
    engine.service.pause("nightly", actor="op")
    engine.service.resume("nightly", actor="op")
    assert engine.service.get("nightly").status is ScheduleStatus.ACTIVE


def test_a_dynamic_schedule_cannot_take_a_static_ones_name(engine: Engine) -> None:
    engine.service.sync_static(declared(), actor="app")
    with pytest.raises(DuplicateName, match="static schedule declared in code"):
        engine.service.create(every_minute("nightly", "ok"), actor="op")


def test_a_static_schedule_clashing_with_a_dynamic_one_changes_nothing(engine: Engine) -> None:
    engine.service.create(every_minute("nightly", "ok"), actor="op")
    with pytest.raises(DuplicateName, match="clashes with a dynamic schedule"):
        engine.service.sync_static(declared(), actor="app")
    assert engine.service.get("nightly").origin is ScheduleOrigin.DYNAMIC
    assert len(engine.service.schedules()) == 1


def test_a_static_schedule_with_an_unknown_command_is_refused_before_anything_is_stored(
    db_path: Path, clock: ManualClock
) -> None:
    with open_engine(db_path, clock=clock) as bare:  # no app commands registered
        with pytest.raises(InvalidInput, match="unknown command 'nightly'"):
            bare.service.sync_static(declared(), actor="app")
        assert bare.service.schedules() == []


def test_a_requeued_dead_letter_gets_its_retries_again(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    retry = RetryPolicy(max_attempts=2, backoff_ms=1_000, backoff_cap_ms=1_000)
    engine.service.create(every_minute("flaky", "flaky", retry=retry), actor="t")
    engine.service.pause("flaky", actor="t")
    engine.service.trigger("flaky", actor="t")
    consumer = engine.consumer(consumer_id="c1", concurrency=1)

    def fail_until_dead() -> None:
        while only_run(engine)[1] is not RunState.DEAD_LETTERED:
            drive(consumer, lambda: consumer.busy == 0 and calls.seen != [], "an attempt")
            clock.advance(2)
            consumer.step()

    fail_until_dead()
    assert len(calls.seen) == 2
    engine.service.requeue([only_run(engine)[0]], actor="t")
    fail_until_dead()
    assert [attempt for _, attempt, _ in calls.seen] == [1, 2, 3, 4]  # two more attempts
    run = engine.storage.runs.get(only_run(engine)[0])
    assert run is not None
    assert run.error is not None
    assert "failed 2 of 2 attempts since its requeue" in run.error


def test_a_threads_first_wait_for_changes_does_not_sleep_through_an_earlier_commit(
    engine: Engine,
) -> None:
    # The first wait of a thread has no baseline to compare with: it must not block.
    started = time.monotonic()
    assert engine.storage.changes.wait(5.0) is True
    assert time.monotonic() - started < 1.0
    assert engine.storage.changes.wait(0.05) is False  # now it has one: nothing changed


def test_a_settlement_that_cannot_be_written_is_kept_and_never_run_again(
    db_path: Path, clock: ManualClock, calls: Calls
) -> None:
    commands = builtin_commands()
    commands.register("ok", calls.ok)
    with open_engine(db_path, clock=clock, commands=commands, busy_timeout_ms=50) as engine:
        engine.service.create(every_minute("ok", "ok"), actor="t")
        engine.service.pause("ok", actor="t")
        engine.service.trigger("ok", actor="t")
        consumer = engine.consumer(consumer_id="c1", concurrency=1)
        consumer.step()
        deadline = time.monotonic() + 10
        while consumer.unsettled == 0 and time.monotonic() < deadline:
            time.sleep(0.002)  # the command runs on a worker thread
        blocker = apsw.Connection(str(db_path))
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            with pytest.raises(StorageError):
                consumer.step()
            consumer.drain(0.0)  # a stop now must not give the finished fire back
            assert consumer.unsettled == 1
            assert only_run(engine)[1] is RunState.RUNNING
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        drive(consumer, lambda: only_run(engine)[1] is RunState.COMPLETED, "the settlement")
        assert len(calls.seen) == 1
        assert engine.storage.fire_queue.depth() == 0

"""The default lookahead on a manual clock and a real database file: a slot is dispatched up to a
second before it is due, yet its fire never starts before its instant, and an operator's pause,
delete or edit made in between decides what runs, as if the slot had been dispatched at its
instant.

A pause or delete is re-checked when the fire is claimed; an edit withdraws the fires written
ahead of their instant (unrun, never claimed) and the daemon dispatches those slots again from
the new definition, the edit's audit entry naming the runs withdrawn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from engine import (
    CronTrigger,
    Engine,
    FireContext,
    FireQueueConsumer,
    IntervalTrigger,
    ManualClock,
    MisfireKind,
    MisfirePolicy,
    OneShotTrigger,
    RunState,
    SchedulerDaemon,
    ScheduleSpec,
    builtin_commands,
    open_engine,
)
from engine.config import BY_NAME
from engine.domain.overlap import SKIPPED_DELETED, SKIPPED_PAUSED
from engine.domain.run import Run
from engine.domain.timeutil import MINUTE_MS, SECOND_MS
from engine.domain.triggers import Trigger
from engine.ports import RunQuery
from engine.ports.dispatch import DispatchReport
from engine.runtime.daemon import DEFAULT_LOOKAHEAD_MS
from tests.conftest import T0
from tests.helpers import settle

# The first slot of every schedule here: a minute after T0, created a second after T0.
SLOT = T0 + MINUTE_MS
AHEAD = SLOT - DEFAULT_LOOKAHEAD_MS // 2  # inside the default lookahead
NOT_THE_OLD_SLOT = "the old definition's slot must not run"


@dataclass
class Calls:
    """What the `record` command saw: (slot instant, payload value, when it started)."""

    seen: list[tuple[int, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def engine(db_path: Path, clock: ManualClock, calls: Calls) -> Iterator[Engine]:
    commands = builtin_commands()

    def record(v: int = 0, *, fire: FireContext) -> int:
        with calls.lock:
            calls.seen.append((fire.slot_at, v, clock.now_ms()))
        return v

    commands.register("record", record)
    clock.set(T0 + SECOND_MS)
    with open_engine(db_path, clock=clock, commands=commands) as opened:
        yield opened


def spec(trigger: Trigger | None = None, v: int = 1, **extra: object) -> ScheduleSpec:
    return ScheduleSpec(
        name="tick",
        trigger=trigger or IntervalTrigger(MINUTE_MS, T0),
        command="record",
        payload={"v": v},
        **extra,  # type: ignore[arg-type]
    )


def daemon_of(engine: Engine, reports: list[DispatchReport] | None = None) -> SchedulerDaemon:
    """A daemon with every default (the lookahead's among them)."""
    on_dispatch = None if reports is None else reports.append
    daemon = engine.daemon(node_id="a", lease_ttl_ms=3_600_000, on_dispatch=on_dispatch)
    assert daemon.config.lookahead_ms == DEFAULT_LOOKAHEAD_MS
    return daemon


def runs(engine: Engine) -> list[Run]:
    return sorted(engine.service.runs(RunQuery(limit=100)), key=lambda r: r.slot_at)


def dispatched_ahead(engine: Engine, clock: ManualClock) -> tuple[SchedulerDaemon, Run]:
    """The schedule's first slot dispatched half the lookahead before it is due."""
    daemon = daemon_of(engine)
    settle(daemon)
    assert runs(engine) == []
    clock.set(AHEAD)
    settle(daemon)
    (run,) = runs(engine)
    assert (run.slot_at, run.due_at, run.state) == (SLOT, SLOT, RunState.DISPATCHED)
    assert run.dispatched_at == AHEAD
    return daemon, run


def drive(consumer: FireQueueConsumer, until: Callable[[], bool], what: str) -> None:
    """Step the consumer (real time, the manual clock still) until `until` holds."""
    deadline = time.monotonic() + 10
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        consumer.step()
        time.sleep(0.002)


def finished(engine: Engine, consumer: FireQueueConsumer, n: int) -> Callable[[], bool]:
    """`n` runs exist and none is waiting or running."""

    def check() -> bool:
        found = runs(engine)
        open_states = (RunState.DISPATCHED, RunState.RUNNING)
        return (
            consumer.busy == 0
            and len(found) == n
            and all(r.state not in open_states for r in found)
        )

    return check


def test_the_default_lookahead_is_the_daemons_the_apis_and_the_settings() -> None:
    assert DEFAULT_LOOKAHEAD_MS == 1_000
    assert BY_NAME["lookahead"].default == DEFAULT_LOOKAHEAD_MS


def test_a_fire_dispatched_ahead_never_starts_before_its_due_instant(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    engine.service.create(spec(), actor="t")
    _, run = dispatched_ahead(engine, clock)
    consumer = engine.consumer(consumer_id="c", concurrency=1)
    for instant in (AHEAD, SLOT - 1):
        clock.set(instant)
        claim = engine.storage.fire_queue.claim(consumer="probe", ttl_ms=60_000, limit=10)
        assert claim.fires == [], "a fire written ahead was claimable before its instant"
        consumer.step()
        assert consumer.busy == 0
    assert calls.seen == []
    clock.set(SLOT)
    drive(consumer, finished(engine, consumer, 1), "the slot's run")
    assert calls.seen == [(SLOT, 1, SLOT)]
    (done,) = runs(engine)
    assert done.id == run.id
    assert done.state is RunState.COMPLETED
    assert done.started_at is not None
    assert done.started_at >= done.due_at


def test_a_schedule_paused_within_the_lookahead_does_not_fire_the_slot(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    engine.service.create(spec(), actor="t")
    dispatched_ahead(engine, clock)
    engine.service.pause("tick", actor="t")
    clock.set(SLOT)
    consumer = engine.consumer(consumer_id="c", concurrency=1)
    drive(consumer, finished(engine, consumer, 1), "the slot to be decided")
    (run,) = runs(engine)
    assert (run.state, run.error) == (RunState.SKIPPED, SKIPPED_PAUSED)
    assert calls.seen == []


def test_paused_and_resumed_within_the_lookahead_the_slot_fires_once(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    engine.service.create(spec(), actor="t")
    daemon, _ = dispatched_ahead(engine, clock)
    engine.service.pause("tick", actor="t")
    engine.service.resume("tick", actor="t")  # the cursor is back on the slot: not due twice
    settle(daemon)
    clock.set(SLOT)
    settle(daemon)
    consumer = engine.consumer(consumer_id="c", concurrency=1)
    drive(consumer, finished(engine, consumer, 1), "the slot's run")
    assert calls.seen == [(SLOT, 1, SLOT)]


def test_a_schedule_deleted_within_the_lookahead_does_not_fire_the_slot(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    engine.service.create(spec(), actor="t")
    dispatched_ahead(engine, clock)
    engine.service.delete("tick", actor="t")
    clock.set(SLOT)
    consumer = engine.consumer(consumer_id="c", concurrency=1)
    drive(consumer, finished(engine, consumer, 1), "the slot to be decided")
    (run,) = runs(engine)
    assert (run.state, run.error) == (RunState.SKIPPED, SKIPPED_DELETED)
    assert calls.seen == []


def verified_intact(engine: Engine) -> None:
    """The ledger still matches the chain: a withdrawn run is excused by its edit's entry."""
    from engine.governance.audit import verify  # noqa: PLC0415

    result = verify(engine.storage.audit, engine.storage.audit.keys(), full=True, record=False)
    assert result.intact, [r.problem for r in result.chains]


def test_a_payload_edited_within_the_lookahead_is_the_one_the_slot_runs_with(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    engine.service.create(spec(v=1), actor="t")
    daemon, old = dispatched_ahead(engine, clock)
    engine.service.update(spec(v=2), actor="t")  # same trigger: the slot stays the new one's
    assert runs(engine) == []  # withdrawn, unrun
    clock.set(SLOT)
    settle(daemon)  # dispatched again, from the new definition
    consumer = engine.consumer(consumer_id="c", concurrency=1)
    drive(consumer, finished(engine, consumer, 1), "the slot's run")
    assert calls.seen == [(SLOT, 2, SLOT)], NOT_THE_OLD_SLOT
    (run,) = runs(engine)
    assert run.id != old.id
    assert (run.slot_at, run.state) == (SLOT, RunState.COMPLETED)
    edit = next(e for e in engine.storage.audit.latest(limit=10) if e.event == "schedule.updated")
    assert edit.data["withdrawn"] == [[old.id, 1]]
    verified_intact(engine)


def test_a_trigger_edited_within_the_lookahead_fires_the_new_slots_not_the_old(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    engine.service.create(spec(), actor="t")
    daemon, _old = dispatched_ahead(engine, clock)
    # Every 7 minutes from T0 + 1 s: the old slot (T0 + 1 min) is not one of its slots.
    seven = IntervalTrigger(7 * MINUTE_MS, T0 + SECOND_MS)
    engine.service.update(spec(seven), actor="t")
    consumer = engine.consumer(consumer_id="c", concurrency=1)
    clock.set(SLOT)
    settle(daemon)
    assert runs(engine) == []  # the old slot is gone, unrun
    new_slot = T0 + SECOND_MS + 7 * MINUTE_MS
    clock.set(new_slot)
    settle(daemon)
    drive(consumer, finished(engine, consumer, 1), "the new slot's run")
    assert [c[0] for c in calls.seen] == [new_slot], NOT_THE_OLD_SLOT
    (run,) = runs(engine)
    assert (run.slot_at, run.state) == (new_slot, RunState.COMPLETED)
    verified_intact(engine)


def test_a_command_edited_within_the_lookahead_is_the_one_the_slot_runs(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    engine.service.create(spec(), actor="t")
    daemon, _old = dispatched_ahead(engine, clock)
    engine.service.update(replace(spec(), command="noop", payload={}), actor="t")
    clock.set(SLOT)
    settle(daemon)
    consumer = engine.consumer(consumer_id="c", concurrency=1)
    drive(consumer, finished(engine, consumer, 1), "the slot's run")
    assert calls.seen == [], NOT_THE_OLD_SLOT
    (run,) = runs(engine)
    assert run.state is RunState.COMPLETED  # noop ran
    verified_intact(engine)


def test_an_edit_leaves_a_fire_already_due_as_it_was_dispatched(
    engine: Engine, clock: ManualClock, calls: Calls
) -> None:
    """Only slots not yet due are the new definition's: one already due (waiting for a
    consumer) was the old definition's to fire, and runs as dispatched."""
    engine.service.create(spec(v=1), actor="t")
    _daemon, old = dispatched_ahead(engine, clock)
    clock.set(SLOT + SECOND_MS)
    engine.service.update(spec(v=2), actor="t")
    consumer = engine.consumer(consumer_id="c", concurrency=1)
    drive(consumer, finished(engine, consumer, 1), "the slot's run")
    assert calls.seen == [(SLOT, 1, SLOT + SECOND_MS)]
    (run,) = runs(engine)
    assert run.id == old.id


@pytest.mark.parametrize("kind", list(MisfireKind))
def test_a_slot_dispatched_ahead_is_on_time_whatever_the_grace(
    engine: Engine, clock: ManualClock, calls: Calls, kind: MisfireKind
) -> None:
    """Misfire is judged at the real instant, not at the lookahead's horizon: with no grace at
    all a slot written ahead is not 'missed' (misfire skip would have dropped it)."""
    engine.service.create(spec(misfire=MisfirePolicy(kind, grace_ms=0)), actor="t")
    reports: list[DispatchReport] = []
    daemon = daemon_of(engine, reports)
    settle(daemon)
    clock.set(AHEAD)
    settle(daemon)
    assert [len(r.dispatched) for r in reports if r.dispatched] == [1]
    assert sum(r.skipped_missed for r in reports) == 0
    clock.set(SLOT)
    consumer = engine.consumer(consumer_id="c", concurrency=1)
    drive(consumer, finished(engine, consumer, 1), "the slot's run")
    assert calls.seen == [(SLOT, 1, SLOT)]


def test_a_missed_slot_is_still_missed_with_the_lookahead(
    engine: Engine, clock: ManualClock
) -> None:
    """The lookahead does not hide lateness either: a slot further behind than its grace is
    missed, one just within it is not."""
    every_second = CronTrigger("* * * * * *")
    policy = MisfirePolicy(MisfireKind.SKIP, grace_ms=10 * SECOND_MS)
    engine.service.create(spec(every_second, misfire=policy), actor="t")
    reports: list[DispatchReport] = []
    daemon = daemon_of(engine, reports)
    settle(daemon)  # at T0 + 1 s: its slots up to T0 + 2 s (the lookahead) are out
    reports.clear()
    clock.advance(30)  # the daemon was away: 30 slots to resolve, T0 + 3 s to T0 + 32 s
    settle(daemon)
    fired = sorted(f.slot_at for r in reports for f in r.dispatched)
    now = clock.now_ms()
    # On time: the 11 slots of the last 10 s (the grace) and the one due within the lookahead.
    assert fired == list(range(now - 10 * SECOND_MS, now + 2 * SECOND_MS, SECOND_MS))
    assert sum(r.skipped_missed for r in reports) == 30 - 12


def run_daemon_for(daemon: SchedulerDaemon, clock: ManualClock, ms: int) -> None:
    """The daemon's loop on the manual clock: each step, then the wait it asks for."""
    end = clock.now_ms() + ms
    while clock.now_ms() < end:
        delay = daemon.step()
        clock.advance(delay)


def test_slots_spread_over_the_second_go_out_a_few_transactions_a_second_none_late(
    engine: Engine, clock: ManualClock
) -> None:
    for i in range(50):
        anchor = T0 + MINUTE_MS + i * 20  # 50 schedules every second, 20 ms apart
        engine.service.create(
            replace(spec(IntervalTrigger(SECOND_MS, anchor)), name=f"s{i}"), actor="t"
        )
    reports: list[DispatchReport] = []
    daemon = daemon_of(engine, reports)
    clock.set(SLOT - 2 * SECOND_MS)
    run_daemon_for(daemon, clock, 12 * SECOND_MS)
    fired = [f for r in reports for f in r.dispatched]
    assert len(fired) >= 50 * 10
    assert all(f.dispatched_at <= f.due_at for f in fired), "a slot was written after its instant"
    # Without gathering, one transaction per slot instant: 50 a second here.
    transactions = sum(1 for r in reports if r.dispatched)
    assert transactions <= 6 * 12


def test_a_slot_brought_forward_while_others_gather_is_not_late(
    engine: Engine, clock: ManualClock
) -> None:
    """A commit wakes the daemon early (a schedule created, say): a slot due sooner than the
    gathering lasts goes out before its instant."""
    engine.service.create(spec(IntervalTrigger(SECOND_MS, SLOT)), actor="t")
    reports: list[DispatchReport] = []
    daemon = daemon_of(engine, reports)
    clock.set(SLOT - 2 * SECOND_MS)
    run_daemon_for(daemon, clock, 2 * SECOND_MS)
    assert reports
    assert any(r.dispatched for r in reports)
    # Just after a dispatch: gathering. A new schedule's first slot is due in 100 ms.
    daemon.step()
    soon = clock.now_ms() + 100
    engine.service.create(replace(spec(OneShotTrigger(soon)), name="soon"), actor="t")
    reports.clear()
    delay = daemon.step()  # woken by that commit
    clock.advance(delay)
    run_daemon_for(daemon, clock, 200)
    (fire,) = [f for r in reports for f in r.dispatched if f.schedule_name == "soon"]
    assert fire.dispatched_at <= fire.due_at == soon

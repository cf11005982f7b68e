"""The daemon on a manual clock and a real database file: leading, fencing, dispatch."""

from __future__ import annotations

import random
from pathlib import Path

import apsw
import pytest

from engine import (
    CronTrigger,
    Engine,
    IntervalTrigger,
    LeaseNotOwned,
    ManualClock,
    MisfireKind,
    MisfirePolicy,
    OneShotTrigger,
    ScheduleSpec,
    open_engine,
)
from engine.domain.schedule import Schedule
from engine.domain.timeutil import MINUTE_MS, SECOND_MS
from engine.ports import RunQuery
from engine.ports.lease import LEADER_LEASE
from tests.conftest import T0
from tests.helpers import fired_slots, leads, resolver_at, settle, sqlite_pool


def every_minute(
    engine: Engine, name: str = "tick", misfire: MisfirePolicy | None = None
) -> Schedule:
    return engine.service.create(
        ScheduleSpec(
            name=name,
            trigger=CronTrigger("* * * * *"),
            command="noop",
            misfire=misfire or MisfirePolicy(),
        ),
        actor="t",
    )


def test_the_first_daemon_leads_and_a_second_stands_by(engine: Engine) -> None:
    first, second = engine.daemon(node_id="a"), engine.daemon(node_id="b")
    first.step()
    second.step()
    assert first.leading
    assert not second.leading


def test_a_slot_is_dispatched_once_with_its_run_and_fire(
    engine: Engine, clock: ManualClock
) -> None:
    every_minute(engine)
    daemon = engine.daemon(node_id="a")
    settle(daemon)
    clock.advance(60)
    settle(daemon)
    settle(daemon)
    assert fired_slots(engine, "tick") == ["2026-01-05T00:00:00+00:00", "2026-01-05T00:01:00+00:00"]
    assert engine.storage.fire_queue.depth() == 2


def test_the_daemon_sleeps_until_the_next_due_slot(engine: Engine, clock: ManualClock) -> None:
    every_minute(engine)
    daemon = engine.daemon(node_id="a", lease_ttl_ms=600_000, lookahead_ms=0)
    settle(daemon)
    clock.advance(20)
    assert daemon.step() == pytest.approx(40.0)


def test_a_deposed_leader_cannot_dispatch(engine: Engine, clock: ManualClock) -> None:
    every_minute(engine)
    old = engine.daemon(node_id="old", lease_ttl_ms=5_000)
    settle(old)
    runs_before = engine.storage.runs.count()
    # The old holder goes silent past its TTL; another node takes the lease.
    clock.advance(60)
    usurper = engine.storage.leases.acquire(LEADER_LEASE, "new-token", "new", 5_000)
    assert usurper is not None
    with pytest.raises(LeaseNotOwned):
        engine.storage.dispatcher.dispatch_due(
            lease_key=LEADER_LEASE,
            token=old.token,
            node_id="old",
            now_ms=clock.now_ms(),
            limit=100,
            resolve=resolver_at(clock.now_ms()),
        )
    assert engine.storage.runs.count() == runs_before
    assert engine.storage.fire_queue.depth() == runs_before
    assert engine.service.get("tick").next_slot_at == T0 + MINUTE_MS


def test_a_deposed_leader_steps_down_instead_of_dispatching(
    engine: Engine, clock: ManualClock
) -> None:
    every_minute(engine)
    old = engine.daemon(node_id="old", lease_ttl_ms=5_000)
    settle(old)
    clock.advance(60)
    assert engine.storage.leases.acquire(LEADER_LEASE, "new-token", "new", 60_000) is not None
    old.step()
    assert not old.leading
    assert len(fired_slots(engine, "tick")) == 1


def test_no_dispatch_once_renewal_has_been_silent_for_most_of_the_ttl(
    db_path: Path, clock: ManualClock
) -> None:
    with open_engine(db_path, clock=clock, busy_timeout_ms=50) as engine:
        engine.service.create(
            ScheduleSpec(
                name="tick",
                trigger=CronTrigger("* * * * * *"),
                command="noop",
                misfire=MisfirePolicy(MisfireKind.EACH),
            ),
            actor="t",
        )
        daemon = engine.daemon(node_id="a", lease_ttl_ms=10_000, lookahead_ms=0)
        settle(daemon)
        # apsw, not the stdlib sqlite3: two SQLite libraries in one process do not see each
        # other's locks.
        blocker = apsw.Connection(str(db_path))
        # The stored lease stays ours for long, so only the guard can hold dispatch back.
        blocker.execute("UPDATE leases SET expires_at = ?", (T0 + 10 * MINUTE_MS,))
        blocker.execute("BEGIN IMMEDIATE")  # every renewal now fails: database locked
        clock.set(T0 + 9_500)
        daemon.step()
        blocker.execute("ROLLBACK")
        blocker.close()
        assert fired_slots(engine, "tick") == ["2026-01-05T00:00:00+00:00"]
        settle(daemon)  # renewal works again: the held-back slots go out
        assert len(fired_slots(engine, "tick")) == 10


def test_a_standby_takes_over_after_the_leader_stops_renewing(
    engine: Engine, clock: ManualClock
) -> None:
    every_minute(engine)
    leader, standby = engine.daemon(node_id="a", lease_ttl_ms=5_000), engine.daemon(node_id="b")
    settle(leader)
    wait = standby.step()
    assert not standby.leading
    assert wait <= 5.0 + 1.0
    clock.advance(6)
    settle(standby)
    assert leads(standby)
    clock.set(T0 + MINUTE_MS)
    settle(standby)
    assert fired_slots(engine, "tick")[-1] == "2026-01-05T00:01:00+00:00"


def test_a_released_lease_is_taken_at_once(engine: Engine) -> None:
    leader, standby = engine.daemon(node_id="a"), engine.daemon(node_id="b")
    leader.step()
    leader.release()
    standby.step()
    assert standby.leading


def test_two_daemons_on_one_file_never_dispatch_a_slot_twice(
    db_path: Path, clock: ManualClock
) -> None:
    with open_engine(db_path, clock=clock) as a, open_engine(db_path, clock=clock) as b:
        a.service.create(
            ScheduleSpec(
                name="tick",
                trigger=CronTrigger("* * * * *"),
                command="noop",
                misfire=MisfirePolicy(MisfireKind.EACH),
            ),
            actor="t",
        )
        daemons = [
            a.daemon(node_id="a", lease_ttl_ms=20_000),
            b.daemon(node_id="b", lease_ttl_ms=20_000),
        ]
        chooser = random.Random(7)
        for _ in range(400):
            # Only one node gets to run each round: the other is silent, sometimes long
            # enough for its lease to pass to the other.
            chooser.choice(daemons).step()
            clock.advance(7)
        for daemon in daemons:
            daemon.step()
            daemon.step()
        slots = fired_slots(a, "tick")
        assert len(slots) == len(set(slots))
        assert len(slots) == 400 * 7 // 60 + 1
        assert {r.node_id for r in a.service.runs(RunQuery(limit=1000))} == {"a", "b"}


def test_a_paused_schedule_is_not_dispatched_and_resumes_without_a_burst(
    engine: Engine, clock: ManualClock
) -> None:
    every_minute(engine)
    daemon = engine.daemon(node_id="a", lease_ttl_ms=600_000)
    settle(daemon)
    engine.service.pause("tick", actor="t", note="maintenance")
    clock.advance(300)
    settle(daemon)
    assert len(fired_slots(engine, "tick")) == 1
    clock.advance(30)
    engine.service.resume("tick", actor="t")
    clock.set(T0 + 6 * MINUTE_MS)
    settle(daemon)
    assert fired_slots(engine, "tick") == ["2026-01-05T00:00:00+00:00", "2026-01-05T00:06:00+00:00"]


def test_a_one_shot_fires_once_and_then_has_no_next_fire(
    engine: Engine, clock: ManualClock
) -> None:
    engine.service.create(
        ScheduleSpec(name="once", trigger=OneShotTrigger(T0 + 5 * SECOND_MS), command="noop"),
        actor="t",
    )
    daemon = engine.daemon(node_id="a", lease_ttl_ms=600_000)
    clock.advance(5)
    settle(daemon)
    clock.advance(3600)
    settle(daemon)
    assert fired_slots(engine, "once") == ["2026-01-05T00:00:05+00:00"]
    assert engine.service.get("once").next_fire_at is None


def test_an_interval_schedule_fires_on_its_anchor_grid(engine: Engine, clock: ManualClock) -> None:
    engine.service.create(
        ScheduleSpec(
            name="poll",
            trigger=IntervalTrigger(45 * SECOND_MS, T0 + 10 * SECOND_MS),
            command="noop",
        ),
        actor="t",
    )
    daemon = engine.daemon(node_id="a", lease_ttl_ms=600_000)
    for _ in range(12):
        clock.advance(10)
        settle(daemon)
    assert fired_slots(engine, "poll") == [
        "2026-01-05T00:00:10+00:00",
        "2026-01-05T00:00:55+00:00",
        "2026-01-05T00:01:40+00:00",
    ]


def test_jitter_delays_each_slot_by_a_stable_offset_within_the_window(
    engine: Engine, clock: ManualClock
) -> None:
    engine.service.create(
        ScheduleSpec(
            name="spread",
            trigger=CronTrigger("* * * * *"),
            command="noop",
            jitter_ms=30 * SECOND_MS,
        ),
        actor="t",
    )
    daemon = engine.daemon(node_id="a", lease_ttl_ms=600_000, lookahead_ms=0)
    settle(daemon)
    due = engine.service.get("spread").next_fire_at
    assert due is not None
    assert T0 <= due <= T0 + 30 * SECOND_MS
    clock.set(due - 1)
    settle(daemon)
    assert fired_slots(engine, "spread") == [] or due == T0
    clock.set(due)
    settle(daemon)
    assert fired_slots(engine, "spread") == ["2026-01-05T00:00:00+00:00"]


def test_an_unreadable_schedule_is_held_back_and_the_others_still_fire(
    engine: Engine, clock: ManualClock
) -> None:
    every_minute(engine, "good")
    every_minute(engine, "broken")
    conn = sqlite_pool(engine).get()
    conn.execute("UPDATE schedules SET trigger_spec = '{\"cron\": 1}' WHERE name = 'broken'")
    daemon = engine.daemon(node_id="a", lease_ttl_ms=600_000)
    settle(daemon)
    assert fired_slots(engine, "good") == ["2026-01-05T00:00:00+00:00"]
    cursor = conn.execute(
        "SELECT next_slot_at, next_fire_at FROM schedules WHERE name = 'broken'"
    ).fetchall()
    assert cursor == [(T0, T0 + MINUTE_MS)]


def test_slots_already_in_the_ledger_are_skipped_and_the_new_ones_still_land(
    engine: Engine, clock: ManualClock
) -> None:
    every_minute(engine, misfire=MisfirePolicy(MisfireKind.EACH))
    daemon = engine.daemon(node_id="a", lease_ttl_ms=3_600_000)
    for minute in range(3):
        clock.set(T0 + minute * MINUTE_MS)
        settle(daemon)
    # A cursor put back, as after restoring a stale copy: 00:00-00:02 resolve again.
    sqlite_pool(engine).get().execute(
        "UPDATE schedules SET next_slot_at = ?, next_fire_at = ?", (T0, T0)
    )
    clock.set(T0 + 3 * MINUTE_MS)
    report = engine.storage.dispatcher.dispatch_due(
        lease_key=LEADER_LEASE,
        token=daemon.token,
        node_id="a",
        now_ms=clock.now_ms(),
        limit=100,
        resolve=resolver_at(clock.now_ms()),
    )
    assert report.already_dispatched == 3
    assert [f.slot_at for f in report.dispatched] == [T0 + 3 * MINUTE_MS]
    assert len(fired_slots(engine, "tick")) == 4
    assert engine.storage.fire_queue.depth() == 4


def test_lookahead_dispatches_early_but_the_fire_waits_for_its_instant(
    engine: Engine, clock: ManualClock
) -> None:
    every_minute(engine)
    daemon = engine.daemon(node_id="a", lease_ttl_ms=3_600_000, lookahead_ms=2_000)
    settle(daemon)
    clock.set(T0 + MINUTE_MS - 3_000)  # 3 s before the slot: outside the lookahead
    settle(daemon)
    assert len(fired_slots(engine, "tick")) == 1
    clock.set(T0 + MINUTE_MS - 1_500)  # 1.5 s before: inside
    settle(daemon)
    assert fired_slots(engine, "tick")[-1] == "2026-01-05T00:01:00+00:00"
    fire = engine.storage.fire_queue.pending(limit=10)[-1]
    assert fire.available_at == T0 + MINUTE_MS
    run = engine.service.runs(RunQuery(limit=1))[0]
    assert run.dispatched_at == T0 + MINUTE_MS - 1_500

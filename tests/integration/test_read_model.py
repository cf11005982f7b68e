"""The console's read model on every backend (real SQLite files, a schema of its own in the
real PostgreSQL server), with runs that real consumers settled.

Every database here is built through the engine's own paths (the service, the daemon, the
consumer, the fire queue), except the filler rows of the fire filter window, which are written
in one statement because a hundred thousand runs through the service would take seconds.
Tests of what only a file can suffer (moved, replaced by junk) run on SQLite; their PostgreSQL
counterparts (a dropped session, a schema gone, a server not there) follow them.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import apsw
import psycopg
import pytest

from engine import (
    CommandRegistry,
    Engine,
    FireContext,
    FireListQuery,
    FireQueueConsumer,
    IntervalTrigger,
    LeaderView,
    ManualClock,
    OneShotTrigger,
    OverlapPolicy,
    Page,
    PermanentFailure,
    ReadModel,
    RecentRun,
    RetryPolicy,
    Run,
    RunState,
    ScheduleListQuery,
    ScheduleRow,
    ScheduleSpec,
    ScheduleStatus,
    StorageError,
    builtin_commands,
    open_engine,
    open_read_model,
)
from engine.commands import StaticSchedule
from engine.domain.audit import KeyRing
from engine.domain.database import PlainDatabase
from engine.domain.run import TERMINAL_STATES
from engine.domain.timeutil import HOUR_MS, MINUTE_MS
from engine.ports import RunQuery
from engine.ports.fire_queue import Outcome, Settlement
from engine.ports.read_model import FIRE_FILTER_WINDOW, RECENT_OUTCOMES
from tests.conftest import T0
from tests.helpers import leads, settle
from tests.pg import PG_AUDIT_KEY, fresh_schema

T = TypeVar("T")

DEFAULT = "default"


def read(call: Coroutine[Any, Any, T]) -> T:
    """One read model call, on its own event loop (the tests are plain functions)."""
    return asyncio.run(call)


# -- commands whose outcome and duration a test decides ---------------------------------------


@dataclass
class Script:
    """What the `scripted` command does next: (outcome, seconds of manual clock it takes).

    Outcomes: ok (completes), fail (PermanentFailure: the run fails for good), error (an
    ordinary exception: retried, or dead-lettered when no attempts are left)."""

    clock: ManualClock
    plan: deque[tuple[str, float]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def scripted(self, *, fire: FireContext) -> str:
        with self.lock:
            outcome, seconds = self.plan.popleft()
        self.clock.advance(seconds)
        if outcome == "fail":
            raise PermanentFailure(f"run {fire.run_id} failed for good")
        if outcome == "error":
            raise RuntimeError(f"run {fire.run_id} broke")
        return "ok"

    def ok(self, *, fire: FireContext) -> str:
        return f"run {fire.run_id} ok"

    def boom(self, *, fire: FireContext) -> str:
        raise RuntimeError(f"run {fire.run_id} broke")


@pytest.fixture
def script(clock: ManualClock) -> Script:
    return Script(clock)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# For what only a SQLite file can suffer (or only SQLite's own tools can do to it).
sqlite_only = pytest.mark.parametrize("backend", ["sqlite"])


@pytest.fixture
def db(backend: str, db_path: Path) -> Iterator[PlainDatabase]:
    """The database: a SQLite file's path, or the URL of a new schema in the test server."""
    if backend == "postgres":
        with fresh_schema() as url:
            yield url
        return
    yield db_path


@pytest.fixture
def engine(db: PlainDatabase, clock: ManualClock, script: Script) -> Iterator[Engine]:
    commands: CommandRegistry = builtin_commands()
    commands.register("scripted", script.scripted)
    commands.register("ok", script.ok)
    commands.register("boom", script.boom)
    if isinstance(db, Path):
        with open_engine(db, clock=clock, commands=commands) as opened:
            yield opened
        return
    from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - an extra

    keys = KeyRing([PG_AUDIT_KEY.encode()])
    with Engine(PostgresBackend(db, clock, audit_keys=lambda: keys), clock, commands) as opened:
        yield opened


@pytest.fixture
def model(engine: Engine, db: PlainDatabase) -> Iterator[ReadModel]:
    """The read model of the engine's database (the engine fixture created it)."""
    opened = open_read_model(db)
    yield opened
    read(opened.close())


@pytest.fixture
def consumer(engine: Engine) -> Iterator[FireQueueConsumer]:
    worker = engine.consumer(consumer_id="c1", concurrency=1)
    yield worker
    worker.close()


# -- building databases -----------------------------------------------------------------------


def spec(
    name: str,
    *,
    tenant: str = DEFAULT,
    command: str = "noop",
    first_at: int = T0 + HOUR_MS,
    every: int = HOUR_MS,
    **extra: Any,
) -> ScheduleSpec:
    """Every `every` from `first_at` (its first fire, as the schedule is created at T0)."""
    return ScheduleSpec(
        name=name,
        trigger=IntervalTrigger(every, first_at),
        command=command,
        tenant=tenant,
        **extra,
    )


def create(engine: Engine, name: str, *, paused: bool = False, **extra: Any) -> str:
    """Create a schedule (and pause it); return its id."""
    schedule = engine.service.create(spec(name, **extra), actor="test")
    if paused:
        engine.service.pause(name, tenant=schedule.tenant, actor="test")
    return schedule.id


def disable_static(engine: Engine, name: str, *, tenant: str = DEFAULT) -> str:
    """A static schedule that the app's code no longer declares: stored as disabled."""
    declared = StaticSchedule(spec(name, tenant=tenant), source="tests.read_model")
    engine.service.sync_static([declared], actor="app")
    assert engine.service.sync_static([], actor="app").disabled == [f"{tenant}/{name}"]
    return engine.service.get(name, tenant=tenant).id


def finish_one_shot(engine: Engine, clock: ManualClock, name: str, *, tenant: str) -> str:
    """An active schedule whose only slot was dispatched: active, with no next fire."""
    at = clock.now_ms() + 1_000
    engine.service.create(
        ScheduleSpec(name=name, trigger=OneShotTrigger(at), command="noop", tenant=tenant),
        actor="test",
    )
    clock.set(at)
    daemon = engine.daemon(node_id="dispatcher")
    settle(daemon)
    daemon.release()
    finished = engine.service.get(name, tenant=tenant)
    assert finished.status is ScheduleStatus.ACTIVE
    assert finished.next_fire_at is None
    return finished.id


def runs_of(engine: Engine, schedule_id: str | None = None) -> list[Run]:
    """The ledger through the engine (not the read model), oldest dispatch first."""
    found = engine.service.runs(RunQuery(schedule_id=schedule_id, limit=100_000))
    return sorted(found, key=lambda r: r.id)


def state_of(engine: Engine, run_id: int) -> RunState:
    run = engine.storage.runs.get(run_id)
    assert run is not None
    return run.state


def drive(consumer: FireQueueConsumer, until: Callable[[], bool], what: str) -> None:
    """Step the consumer (real time, the manual clock stands still) until `until` holds."""
    deadline = time.monotonic() + 10
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        consumer.step()
        time.sleep(0.001)


def all_settled(engine: Engine, consumer: FireQueueConsumer) -> Callable[[], bool]:
    return lambda: consumer.busy == 0 and all(r.state in TERMINAL_STATES for r in runs_of(engine))


def names(rows: tuple[ScheduleRow, ...]) -> list[tuple[str, str]]:
    return [(r.schedule.tenant, r.schedule.name) for r in rows]


async def every_page(model: ReadModel, query: ScheduleListQuery) -> list[Page[ScheduleRow]]:
    """Page through a schedule list from query.offset, query.limit at a time."""
    pages = [await model.schedules(query)]
    while pages[-1].more:
        offset = pages[-1].offset + len(pages[-1].rows)
        pages.append(
            await model.schedules(
                ScheduleListQuery(
                    text=query.text,
                    tenant=query.tenant,
                    status=query.status,
                    offset=offset,
                    limit=query.limit,
                )
            )
        )
    return pages


# -- 1. the order of the schedules page -------------------------------------------------------

# tenant, name, minutes after T0 of the first fire: due order differs from name order.
DUE = [
    ("default", "zulu", 7),
    ("acme", "mike", 2),
    ("default", "alpha", 5),
    ("beta", "kilo", 1),
    ("acme", "bravo", 9),
    ("default", "echo", 3),
    ("zeta", "aaa", 11),
]
PAUSED = [
    ("default", "paused-b"),
    ("acme", "paused-z"),
    ("zeta", "paused-a"),
    ("acme", "paused-a"),
    ("default", "paused-a"),
]
DUE_ORDER = [(t, n) for t, n, _ in sorted(DUE, key=lambda d: d[2])]
PAUSED_ORDER = sorted(PAUSED)


def catalogue(engine: Engine) -> list[tuple[str, str]]:
    """7 active schedules with a next fire and 5 paused ones; the expected page order."""
    for tenant, name, minutes in DUE:
        create(engine, name, tenant=tenant, first_at=T0 + minutes * MINUTE_MS)
    for tenant, name in PAUSED:
        create(engine, name, tenant=tenant, paused=True)
    return DUE_ORDER + PAUSED_ORDER


def test_schedules_due_soonest_come_first_then_the_rest_by_tenant_and_name(
    engine: Engine, model: ReadModel
) -> None:
    expected = catalogue(engine)
    page = read(model.schedules(ScheduleListQuery()))
    assert names(page.rows) == expected
    assert page.offset == 0
    assert page.total == 12
    assert page.more is False
    due = [r.schedule.next_fire_at for r in page.rows[: len(DUE)]]
    assert due == [T0 + m * MINUTE_MS for m in sorted(m for _, _, m in DUE)]
    assert all(r.schedule.status is ScheduleStatus.PAUSED for r in page.rows[len(DUE) :])
    for row in page.rows:  # every field survives the trip through the read model
        assert row.schedule == engine.service.get(row.schedule.name, tenant=row.schedule.tenant)


def test_schedules_paged_across_the_boundary_return_each_schedule_once_in_order(
    engine: Engine, model: ReadModel
) -> None:
    expected = catalogue(engine)
    pages = read(every_page(model, ScheduleListQuery(limit=3)))
    assert [len(p.rows) for p in pages] == [3, 3, 3, 3]
    assert [p.offset for p in pages] == [0, 3, 6, 9]
    assert [p.more for p in pages] == [True, True, True, False]
    assert {p.total for p in pages} == {12}
    assert names(pages[2].rows) == DUE_ORDER[6:] + PAUSED_ORDER[:2]  # the page on the boundary
    assert [n for p in pages for n in names(p.rows)] == expected


@pytest.mark.parametrize("limit", [1, 2, 4, 5, 6, 7, 8, 11, 12, 13])
def test_schedules_paged_with_any_page_size_return_each_schedule_once_in_order(
    engine: Engine, model: ReadModel, limit: int
) -> None:
    expected = catalogue(engine)
    pages = read(every_page(model, ScheduleListQuery(limit=limit)))
    assert [n for p in pages for n in names(p.rows)] == expected
    assert all(len(p.rows) == limit for p in pages[:-1])
    assert [p.more for p in pages] == [True] * (len(pages) - 1) + [False]


def test_a_schedules_page_starting_inside_the_paused_part_skips_the_due_part(
    engine: Engine, model: ReadModel
) -> None:
    expected = catalogue(engine)
    page = read(model.schedules(ScheduleListQuery(offset=8, limit=3)))
    assert names(page.rows) == expected[8:11]
    assert page.more is True
    assert page.total == 12


def test_a_schedules_page_past_the_end_is_empty_with_no_more(
    engine: Engine, model: ReadModel
) -> None:
    catalogue(engine)
    for offset in (12, 13, 500):
        page = read(model.schedules(ScheduleListQuery(offset=offset, limit=3)))
        assert page.rows == ()
        assert page.total == 12
        assert page.more is False


def test_schedules_due_at_the_same_instant_are_each_listed_once_across_pages(
    engine: Engine, model: ReadModel
) -> None:
    created = {create(engine, f"same-{n}", first_at=T0 + MINUTE_MS) for n in range(8)}
    pages = read(every_page(model, ScheduleListQuery(limit=3)))
    listed = [r.schedule.id for p in pages for r in p.rows]
    assert sorted(listed) == sorted(created)


def test_active_schedules_without_a_next_fire_and_disabled_ones_are_listed_with_the_paused(
    engine: Engine, clock: ManualClock, model: ReadModel
) -> None:
    create(engine, "due-later", tenant="zeta", first_at=T0 + HOUR_MS)
    create(engine, "held", tenant="beta", paused=True)
    disable_static(engine, "gone", tenant="acme")
    finish_one_shot(engine, clock, "once", tenant="beta")
    page = read(model.schedules(ScheduleListQuery()))
    assert names(page.rows) == [
        ("zeta", "due-later"),
        ("acme", "gone"),
        ("beta", "held"),
        ("beta", "once"),
    ]
    assert [r.schedule.status for r in page.rows] == [
        ScheduleStatus.ACTIVE,
        ScheduleStatus.DISABLED,
        ScheduleStatus.PAUSED,
        ScheduleStatus.ACTIVE,
    ]


# -- 2. schedule filters ----------------------------------------------------------------------


@pytest.fixture
def reports(engine: Engine, clock: ManualClock) -> None:
    """Schedules for the filters: names with '_' (a LIKE wildcard) and look-alikes."""
    create(engine, "report_daily", first_at=T0 + 2 * MINUTE_MS)
    create(engine, "reportxdaily", first_at=T0 + 1 * MINUTE_MS)
    create(engine, "report-weekly", paused=True)
    create(engine, "report_daily", tenant="acme", paused=True)
    create(engine, "cleanup", tenant="acme", first_at=T0 + 3 * MINUTE_MS)
    disable_static(engine, "old-report")


def listed(model: ReadModel, **query: Any) -> tuple[list[tuple[str, str]], int | None]:
    page = read(model.schedules(ScheduleListQuery(**query)))
    return names(page.rows), page.total


@pytest.mark.usefixtures("reports")
def test_schedule_text_filter_matches_a_substring_of_the_name(model: ReadModel) -> None:
    assert listed(model, text="daily") == (
        [("default", "reportxdaily"), ("default", "report_daily"), ("acme", "report_daily")],
        3,
    )
    assert listed(model, text="week") == ([("default", "report-weekly")], 1)
    assert listed(model, text="nothing-like-it") == ([], 0)


@pytest.mark.usefixtures("reports")
def test_schedule_text_filter_matches_underscore_literally(model: ReadModel) -> None:
    # As a LIKE wildcard, '_' would also match the 'x' of reportxdaily.
    assert listed(model, text="t_d") == (
        [("default", "report_daily"), ("acme", "report_daily")],
        2,
    )


@pytest.mark.usefixtures("reports")
def test_schedule_text_filter_matches_percent_and_backslash_literally(model: ReadModel) -> None:
    # No name can hold '%' or '\': as wildcards or escapes they would match everything.
    for text in ("%", "report%daily", "\\", "\\%", "%_%"):
        assert listed(model, text=text) == ([], 0), text


@pytest.mark.usefixtures("reports")
def test_schedule_tenant_filter_lists_only_that_tenant(model: ReadModel) -> None:
    assert listed(model, tenant="acme") == (
        [("acme", "cleanup"), ("acme", "report_daily")],
        2,
    )
    assert listed(model, tenant="nobody") == ([], 0)


@pytest.mark.usefixtures("reports")
def test_schedule_status_filter_lists_only_that_status(model: ReadModel) -> None:
    assert listed(model, status=ScheduleStatus.ACTIVE) == (
        [("default", "reportxdaily"), ("default", "report_daily"), ("acme", "cleanup")],
        3,
    )
    assert listed(model, status=ScheduleStatus.PAUSED) == (
        [("acme", "report_daily"), ("default", "report-weekly")],
        2,
    )
    assert listed(model, status=ScheduleStatus.DISABLED) == ([("default", "old-report")], 1)


@pytest.mark.usefixtures("reports")
def test_schedule_filters_combine_every_given_field_must_match(model: ReadModel) -> None:
    assert listed(model, text="report", tenant=DEFAULT, status=ScheduleStatus.ACTIVE) == (
        [("default", "reportxdaily"), ("default", "report_daily")],
        2,
    )
    assert listed(model, text="t_d", tenant="acme") == ([("acme", "report_daily")], 1)
    assert listed(model, text="report", status=ScheduleStatus.PAUSED, tenant="acme") == (
        [("acme", "report_daily")],
        1,
    )
    assert listed(model, text="cleanup", status=ScheduleStatus.PAUSED) == ([], 0)


@pytest.mark.usefixtures("reports")
def test_filtered_schedules_page_with_total_and_more(model: ReadModel) -> None:
    pages = read(every_page(model, ScheduleListQuery(text="report", limit=2)))
    assert [names(p.rows) for p in pages] == [
        [("default", "reportxdaily"), ("default", "report_daily")],
        [("acme", "report_daily"), ("default", "old-report")],
        [("default", "report-weekly")],
    ]
    assert [p.more for p in pages] == [True, True, False]
    assert {p.total for p in pages} == {5}


@pytest.mark.usefixtures("reports")
def test_an_active_status_filter_lists_finished_active_schedules_after_the_due_ones(
    engine: Engine, clock: ManualClock, model: ReadModel
) -> None:
    finish_one_shot(engine, clock, "a-once", tenant="acme")
    assert listed(model, status=ScheduleStatus.ACTIVE) == (
        [
            ("default", "reportxdaily"),
            ("default", "report_daily"),
            ("acme", "cleanup"),
            ("acme", "a-once"),
        ],
        4,
    )


# -- 3. recent outcomes -----------------------------------------------------------------------

# What each run of `work` does, oldest first: (outcome, seconds it takes). "skip": a scheduled
# slot dispatched while active, then the schedule is paused before a consumer claims it.
PLAN: list[tuple[str, float]] = [
    ("ok", 1),
    ("ok", 2),
    ("fail", 3),
    ("ok", 4),
    ("error", 5),
    ("skip", 0),
    ("ok", 6),
    ("fail", 0),
    ("error", 7),
    ("ok", 8),
    ("skip", 0),
    ("ok", 9),
    ("ok", 10.5),
    ("error", 11),
]
PLANNED_STATE = {
    "ok": RunState.COMPLETED,
    "fail": RunState.FAILED,
    "error": RunState.DEAD_LETTERED,
    "skip": RunState.SKIPPED,
}


def play(
    engine: Engine, clock: ManualClock, script: Script, consumer: FireQueueConsumer
) -> list[RecentRun]:
    """Run PLAN through the daemon and a consumer; return what the sparkline should show."""
    create(
        engine,
        "work",
        command="scripted",
        paused=True,
        first_at=T0,
        every=MINUTE_MS,  # every whole minute is a slot
        retry=RetryPolicy(max_attempts=1),
    )
    for n, (outcome, seconds) in enumerate(PLAN):
        clock.set(T0 + (n + 1) * 5 * MINUTE_MS)  # slots in the order of the plan
        if outcome == "skip":
            engine.service.resume("work", actor="test")  # next slot: now (a whole minute)
            daemon = engine.daemon(node_id="dispatcher")
            settle(daemon)
            daemon.release()
            engine.service.pause("work", actor="test")
        else:
            script.plan.append((outcome, seconds))
            engine.service.trigger("work", actor="test")
        drive(consumer, all_settled(engine, consumer), f"run {n + 1}")
    return [RecentRun(PLANNED_STATE[o], None if o == "skip" else round(s * 1000)) for o, s in PLAN]


def test_recent_outcomes_are_the_newest_runs_oldest_first_with_their_real_states(
    engine: Engine,
    clock: ManualClock,
    script: Script,
    consumer: FireQueueConsumer,
    model: ReadModel,
) -> None:
    planned = play(engine, clock, script, consumer)
    assert [r.state for r in runs_of(engine)] == [r.state for r in planned]  # as played
    (row,) = read(model.schedules(ScheduleListQuery(text="work"))).rows
    assert len(row.recent) == RECENT_OUTCOMES
    assert [r.state for r in row.recent] == [r.state for r in planned[-RECENT_OUTCOMES:]]


def test_recent_durations_are_finished_at_minus_started_at(
    engine: Engine,
    clock: ManualClock,
    script: Script,
    consumer: FireQueueConsumer,
    model: ReadModel,
) -> None:
    planned = play(engine, clock, script, consumer)
    (row,) = read(model.schedules(ScheduleListQuery(text="work"))).rows
    assert list(row.recent) == planned[-RECENT_OUTCOMES:]
    ledger = runs_of(engine)[-RECENT_OUTCOMES:]
    assert [r.duration_ms for r in row.recent] == [
        None if r.started_at is None or r.finished_at is None else r.finished_at - r.started_at
        for r in ledger
    ]
    assert row.recent[-2].duration_ms == 10_500  # not rounded to seconds


def test_last_outcome_is_the_newest_runs_state(
    engine: Engine,
    clock: ManualClock,
    script: Script,
    consumer: FireQueueConsumer,
    model: ReadModel,
) -> None:
    play(engine, clock, script, consumer)
    (row,) = read(model.schedules(ScheduleListQuery(text="work"))).rows
    assert row.last_outcome is RunState.DEAD_LETTERED
    script.plan.append(("ok", 1))
    clock.advance(60)
    engine.service.trigger("work", actor="test")
    drive(consumer, all_settled(engine, consumer), "one more run")
    (row,) = read(model.schedules(ScheduleListQuery(text="work"))).rows
    assert row.last_outcome is RunState.COMPLETED
    assert row.recent[-1] == RecentRun(RunState.COMPLETED, 1_000)
    assert len(row.recent) == RECENT_OUTCOMES


def test_a_schedule_without_runs_has_no_recent_outcomes(engine: Engine, model: ReadModel) -> None:
    create(engine, "idle")
    (row,) = read(model.schedules(ScheduleListQuery())).rows
    assert row.recent == ()
    assert row.last_outcome is None


def test_a_run_still_waiting_shows_in_recent_without_a_duration(
    engine: Engine, clock: ManualClock, model: ReadModel
) -> None:
    create(engine, "waiting", paused=True)
    engine.service.trigger("waiting", actor="test")
    (row,) = read(model.schedules(ScheduleListQuery())).rows
    assert row.recent == (RecentRun(RunState.DISPATCHED, None),)
    assert row.last_outcome is RunState.DISPATCHED


# -- 4. the live fires list -------------------------------------------------------------------


@pytest.fixture
def fired(engine: Engine, clock: ManualClock, consumer: FireQueueConsumer) -> list[Run]:
    """12 runs, oldest first: three rounds of alpha (completes), a_b (dead-letters) and axb
    (tenant acme, completes), all settled; then a fourth round left waiting."""
    create(engine, "alpha", command="ok", paused=True)
    create(engine, "a_b", command="boom", paused=True, retry=RetryPolicy(max_attempts=1))
    create(engine, "axb", command="ok", tenant="acme", paused=True)

    def one_round() -> None:
        for name, tenant in (("alpha", DEFAULT), ("a_b", DEFAULT), ("axb", "acme")):
            clock.advance(1)
            engine.service.trigger(name, tenant=tenant, actor="test")

    for _ in range(3):
        one_round()
    drive(consumer, all_settled(engine, consumer), "nine settled runs")
    one_round()
    ledger = runs_of(engine)
    assert len(ledger) == 12
    return ledger


def fire_ids(model: ReadModel, **query: Any) -> list[int]:
    page = read(model.fires(FireListQuery(**query)))
    assert page.more is False, "use a page large enough for the whole answer"
    return [r.id for r in page.rows]


def newest_first(runs: list[Run], keep: Callable[[Run], bool] = lambda _: True) -> list[int]:
    return [r.id for r in sorted(runs, key=lambda r: -r.id) if keep(r)]


def test_fires_are_listed_newest_first_by_run_id(fired: list[Run], model: ReadModel) -> None:
    page = read(model.fires(FireListQuery()))
    assert [r.id for r in page.rows] == newest_first(fired)
    assert list(page.rows) == sorted(fired, key=lambda r: -r.id)  # whole runs, as stored
    assert page.total is None
    assert page.more is False


def test_fires_pages_say_whether_more_follow(fired: list[Run], model: ReadModel) -> None:
    everything = newest_first(fired)
    pages = [read(model.fires(FireListQuery(offset=o, limit=5))) for o in (0, 5, 10)]
    assert [[r.id for r in p.rows] for p in pages] == [
        everything[0:5],
        everything[5:10],
        everything[10:12],
    ]
    assert [p.more for p in pages] == [True, True, False]
    assert [p.offset for p in pages] == [0, 5, 10]
    exact = read(model.fires(FireListQuery(offset=8, limit=4)))  # ends on the last run
    assert [r.id for r in exact.rows] == everything[8:]
    assert exact.more is False
    past = read(model.fires(FireListQuery(offset=12, limit=4)))
    assert past.rows == ()
    assert past.more is False


def test_fires_filter_by_state(fired: list[Run], model: ReadModel) -> None:
    def in_state(state: RunState) -> Callable[[Run], bool]:
        return lambda r: r.state is state

    for state in (RunState.COMPLETED, RunState.DEAD_LETTERED, RunState.DISPATCHED):
        assert fire_ids(model, state=state) == newest_first(fired, in_state(state))
    assert len(fire_ids(model, state=RunState.COMPLETED)) == 6
    assert len(fire_ids(model, state=RunState.DEAD_LETTERED)) == 3
    assert fire_ids(model, state=RunState.CANCELLED) == []


def test_fires_filter_by_tenant(fired: list[Run], model: ReadModel) -> None:
    assert fire_ids(model, tenant="acme") == newest_first(fired, lambda r: r.tenant == "acme")
    assert len(fire_ids(model, tenant="acme")) == 4
    assert fire_ids(model, tenant="nobody") == []


def test_fires_text_filter_matches_a_substring_of_the_schedule_name_literally(
    fired: list[Run], model: ReadModel
) -> None:
    assert fire_ids(model, text="lph") == newest_first(fired, lambda r: r.schedule_name == "alpha")
    # As a LIKE wildcard, '_' would also match axb's 'x'.
    assert fire_ids(model, text="a_b") == newest_first(fired, lambda r: r.schedule_name == "a_b")
    for text in ("%", "a%b", "\\"):
        assert fire_ids(model, text=text) == [], text


def test_fires_filters_combine(fired: list[Run], model: ReadModel) -> None:
    assert fire_ids(model, tenant=DEFAULT, state=RunState.COMPLETED) == newest_first(
        fired, lambda r: r.schedule_name == "alpha" and r.state is RunState.COMPLETED
    )
    assert fire_ids(model, text="b", tenant="acme", state=RunState.DISPATCHED) == newest_first(
        fired, lambda r: r.schedule_name == "axb" and r.state is RunState.DISPATCHED
    )
    assert fire_ids(model, text="a_b", state=RunState.COMPLETED) == []


def test_filtered_fires_page_with_more(fired: list[Run], model: ReadModel) -> None:
    waiting = newest_first(fired, lambda r: r.state is RunState.DISPATCHED)
    first = read(model.fires(FireListQuery(state=RunState.DISPATCHED, limit=2)))
    second = read(model.fires(FireListQuery(state=RunState.DISPATCHED, offset=2, limit=2)))
    assert [r.id for r in first.rows] == waiting[:2]
    assert first.more is True
    assert [r.id for r in second.rows] == waiting[2:]
    assert second.more is False


def test_fires_filter_by_schedule(engine: Engine, fired: list[Run], model: ReadModel) -> None:
    sid = engine.service.get("axb", tenant="acme").id
    assert fire_ids(model, schedule_id=sid) == newest_first(fired, lambda r: r.schedule_id == sid)


def bulk_runs(db: PlainDatabase, schedule_id: str, name: str, count: int) -> None:
    """`count` completed runs of one schedule in one statement (the service would need
    seconds for a hundred thousand): real rows in the real ledger, only written faster."""
    if not isinstance(db, Path):
        with psycopg.connect(db) as pg:
            pg.execute(
                "INSERT INTO runs (tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, "
                "kind, state, dispatched_at, node_id, started_at, finished_at, attempts) "
                "SELECT 'default', %s, %s, %s || '@' || i, %s + i * 1000, %s + i * 1000, "
                "'backfill', 'completed', %s, 'bulk', %s, %s, 1 FROM generate_series(1, %s) AS i",
                (schedule_id, name, schedule_id, T0, T0, T0, T0, T0 + 5, count),
            )
        return
    conn = apsw.Connection(str(db))
    try:
        conn.set_busy_timeout(5000)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
            "INSERT INTO runs (tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, "
            "kind, state, dispatched_at, node_id, started_at, finished_at, attempts) "
            "SELECT 'default', ?, ?, ? || '@' || i, ? + i * 1000, ? + i * 1000, 'backfill', "
            "'completed', ?, 'bulk', ?, ?, 1 FROM n",
            (count, schedule_id, name, schedule_id, T0, T0, T0, T0, T0 + 5),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_a_filtered_fires_query_looks_only_within_the_newest_window(
    engine: Engine, clock: ManualClock, db: PlainDatabase, model: ReadModel
) -> None:
    create(engine, "old", tenant="legacy", paused=True)
    bulk_id = create(engine, "bulk", paused=True)
    old = [engine.service.trigger("old", tenant="legacy", actor="test").id for _ in range(3)]
    assert old == [1, 2, 3]
    # Runs 3 .. 100_002 are the newest FIRE_FILTER_WINDOW: run 3 is in, runs 1 and 2 are out.
    bulk_runs(db, bulk_id, "bulk", FIRE_FILTER_WINDOW - 1)
    assert fire_ids(model, text="old") == [3]
    assert fire_ids(model, tenant="legacy") == [3]
    assert fire_ids(model, state=RunState.DISPATCHED) == [3]
    # Unfiltered, and by schedule (not a filter in FireListQuery's sense), nothing is cut off.
    tail = read(model.fires(FireListQuery(offset=FIRE_FILTER_WINDOW, limit=10)))
    assert [r.id for r in tail.rows] == [2, 1]
    old_id = engine.service.get("old", tenant="legacy").id
    assert fire_ids(model, schedule_id=old_id) == [3, 2, 1]
    # One newer run moves the window past run 3.
    clock.advance(1)
    newest = engine.service.trigger("old", tenant="legacy", actor="test").id
    assert newest == FIRE_FILTER_WINDOW + 3
    assert fire_ids(model, text="old") == [newest]


# -- 5. the overview --------------------------------------------------------------------------


def test_the_overview_of_a_fresh_database_is_empty_and_leaderless(
    model: ReadModel, clock: ManualClock
) -> None:
    now = clock.now_ms()
    overview = read(model.overview(now))
    assert overview.read_at == now
    assert overview.leader is None
    assert (
        overview.schedules,
        overview.active,
        overview.paused,
        overview.open_fires,
        overview.running,
        overview.dead_letters,
    ) == (0, 0, 0, 0, 0, 0)


def test_the_overview_counts_schedules_open_fires_running_and_dead_letters(
    engine: Engine, clock: ManualClock, model: ReadModel
) -> None:
    for name in ("a1", "a2", "a3"):
        create(engine, name)
    create(engine, "p1", paused=True, overlap=OverlapPolicy.ALLOW)
    create(engine, "p2", paused=True)
    disable_static(engine, "gone")
    for _ in range(5):
        engine.service.trigger("p1", actor="test")
    overview = read(model.overview(clock.now_ms()))
    assert (overview.schedules, overview.active, overview.paused) == (6, 3, 2)
    assert (overview.open_fires, overview.running, overview.dead_letters) == (5, 0, 0)

    claim = engine.storage.fire_queue.claim(consumer="c1", ttl_ms=60_000, limit=2)
    assert len(claim.fires) == 2
    overview = read(model.overview(clock.now_ms()))
    assert (overview.open_fires, overview.running, overview.dead_letters) == (5, 2, 0)

    dead = claim.fires[0].run_id
    engine.storage.fire_queue.settle(
        claim.token,
        "c1",
        [Settlement(dead, Outcome.DISCARD, RunState.DEAD_LETTERED, error="given up")],
    )
    overview = read(model.overview(clock.now_ms()))
    assert (overview.open_fires, overview.running, overview.dead_letters) == (4, 1, 1)

    # A claim nobody renewed is no longer running, though its fire is still open.
    later = clock.now_ms() + 61_000
    overview = read(model.overview(later))
    assert overview.read_at == later
    assert (overview.open_fires, overview.running, overview.dead_letters) == (4, 0, 1)


def test_the_overview_shows_the_leader_while_a_daemon_leads_and_none_after_it_lets_go(
    engine: Engine, clock: ManualClock, model: ReadModel
) -> None:
    daemon = engine.daemon(node_id="node-a", lease_ttl_ms=30_000)
    daemon.step()
    assert leads(daemon)
    acquired = clock.now_ms()
    leader = read(model.overview(acquired)).leader
    assert leader == LeaderView("node-a", acquired, acquired, acquired + 30_000)

    clock.advance(15)  # past a third of the TTL: the next step renews
    daemon.step()
    renewed = clock.now_ms()
    leader = read(model.overview(renewed)).leader
    assert leader == LeaderView("node-a", acquired, renewed, renewed + 30_000)

    daemon.release()
    assert read(model.overview(clock.now_ms())).leader is None


# -- 6. one schedule, one run -----------------------------------------------------------------


def test_a_schedules_detail_lists_its_runs_newest_first_up_to_the_limit(
    engine: Engine, clock: ManualClock, model: ReadModel
) -> None:
    sid = create(engine, "work", paused=True)
    create(engine, "other", paused=True)
    for name in ("work", "other", "work", "work", "other", "work", "work"):
        clock.advance(60)
        engine.service.trigger(name, actor="test")
    mine = sorted(runs_of(engine, sid), key=lambda r: -r.slot_at)
    assert len(mine) == 5

    detail = read(model.schedule(sid))
    assert detail is not None
    assert detail.schedule == engine.service.get("work")
    assert list(detail.runs) == mine
    assert [r.slot_at for r in detail.runs] == sorted((r.slot_at for r in mine), reverse=True)

    limited = read(model.schedule(sid, runs=2))
    assert limited is not None
    assert list(limited.runs) == mine[:2]
    none = read(model.schedule(sid, runs=0))
    assert none is not None
    assert none.runs == ()


def test_a_schedule_without_runs_has_an_empty_history(engine: Engine, model: ReadModel) -> None:
    sid = create(engine, "quiet")
    detail = read(model.schedule(sid))
    assert detail is not None
    assert detail.schedule.name == "quiet"
    assert detail.runs == ()


def test_an_unknown_schedule_id_has_no_detail(engine: Engine, model: ReadModel) -> None:
    create(engine, "known")
    assert read(model.schedule("no-such-id")) is None


def test_a_runs_detail_carries_its_fire_with_attempts(
    engine: Engine,
    clock: ManualClock,
    script: Script,
    consumer: FireQueueConsumer,
    model: ReadModel,
) -> None:
    create(
        engine,
        "work",
        command="scripted",
        paused=True,
        retry=RetryPolicy(max_attempts=3, backoff_ms=1_000, backoff_cap_ms=10_000),
    )
    script.plan.extend([("error", 2), ("ok", 3)])
    run_id = engine.service.trigger("work", actor="test").id
    drive(consumer, lambda: consumer.busy == 0 and len(script.plan) == 1, "the first attempt")
    assert state_of(engine, run_id) is RunState.DISPATCHED  # waiting for its retry
    first = engine.storage.fire_queue.get(run_id)
    assert first is not None
    clock.set(first.available_at)  # the retry is due
    drive(consumer, all_settled(engine, consumer), "the retry")

    detail = read(model.run(run_id))
    assert detail is not None
    assert detail.run == engine.storage.runs.get(run_id)
    assert detail.run.state is RunState.COMPLETED
    assert detail.run.attempts == 2
    assert detail.run.duration_ms == 3_000
    assert detail.fire is not None
    assert detail.fire == engine.storage.fire_queue.get(run_id)
    assert detail.fire.run_id == run_id
    assert detail.fire.attempts == 2
    assert detail.fire.schedule_name == "work"
    assert detail.fire.command == "scripted"
    assert detail.fire.completed_at == detail.run.finished_at
    assert detail.fire.discarded_at is None


def test_a_runs_detail_has_no_fire_once_the_fire_is_gone(
    engine: Engine, consumer: FireQueueConsumer, model: ReadModel
) -> None:
    create(engine, "a_b", command="boom", paused=True, retry=RetryPolicy(max_attempts=1))
    run_id = engine.service.trigger("a_b", actor="test").id
    drive(consumer, all_settled(engine, consumer), "the dead letter")
    dead = read(model.run(run_id))
    assert dead is not None
    assert dead.fire is not None
    assert dead.fire.discarded_at is not None
    assert engine.service.purge([run_id], actor="test") == 1
    purged = read(model.run(run_id))
    assert purged is not None
    assert purged.run.state is RunState.DEAD_LETTERED
    assert purged.fire is None


def test_an_unknown_run_id_has_no_detail(engine: Engine, model: ReadModel) -> None:
    create(engine, "known", paused=True)
    engine.service.trigger("known", actor="test")
    assert read(model.run(999)) is None


# -- 7. failures ------------------------------------------------------------------------------


def every_read(model: ReadModel) -> list[Callable[[], Coroutine[Any, Any, object]]]:
    return [
        lambda: model.overview(T0),
        lambda: model.schedules(ScheduleListQuery()),
        lambda: model.fires(FireListQuery()),
        lambda: model.fires(FireListQuery(text="x")),
        lambda: model.schedule("some-id"),
        lambda: model.run(1),
    ]


def expect_storage_error(model: ReadModel, path: Path | str) -> list[str]:
    """Every read fails with StorageError naming `path` (or the URL); return the messages."""
    messages = []
    for call in every_read(model):
        with pytest.raises(StorageError) as caught:
            read(call())
        assert str(path) in str(caught.value)
        messages.append(str(caught.value))
    return messages


@sqlite_only
def test_reads_after_the_file_is_moved_away_fail_with_a_storage_error_naming_it(
    engine: Engine, db_path: Path, model: ReadModel
) -> None:
    create(engine, "kept")
    engine.close()
    db_path.rename(db_path.with_name("moved.db"))
    messages = expect_storage_error(model, db_path)
    assert all("moved or deleted" in m for m in messages)


@sqlite_only
def test_reads_succeed_again_once_the_file_is_back(
    engine: Engine, db_path: Path, model: ReadModel
) -> None:
    create(engine, "kept")
    engine.close()
    moved = db_path.with_name("moved.db")
    db_path.rename(moved)
    expect_storage_error(model, db_path)
    moved.rename(db_path)
    page = read(model.schedules(ScheduleListQuery()))
    assert names(page.rows) == [("default", "kept")]


@sqlite_only
def test_reads_of_a_file_replaced_by_junk_fail_then_recover_when_it_is_restored(
    engine: Engine, db_path: Path, model: ReadModel
) -> None:
    create(engine, "kept")
    engine.close()
    saved = db_path.with_name("saved.db")
    shutil.copyfile(db_path, saved)
    db_path.write_bytes(b"this is not a database at all" * 200)
    messages = expect_storage_error(model, db_path)
    assert all("not a SQLite database" in m for m in messages)
    shutil.copyfile(saved, db_path)
    assert read(model.overview(T0)).schedules == 1


@sqlite_only
def test_a_read_that_fails_to_open_leaves_no_worker_thread_to_fail_after_it(
    engine: Engine, db_path: Path, model: ReadModel
) -> None:
    engine.close()
    db_path.write_bytes(b"this is not a database at all" * 200)
    died: list[BaseException | None] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: died.append(args.exc_value)
    try:
        for _ in range(30):  # the thread races the loop's closing: give it many chances
            with pytest.raises(StorageError):
                read(model.overview(T0))
        for thread in threading.enumerate():
            if thread.name.endswith("(_connection_worker_thread)"):
                thread.join(5)
    finally:
        threading.excepthook = previous
    assert died == []


def empty_sqlite(path: Path) -> None:
    """A SQLite file (a valid header) without a single table."""
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE t (x); DROP TABLE t;")
    conn.close()


def foreign_sqlite(path: Path) -> None:
    """Another application's SQLite database."""
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.close()


@pytest.mark.parametrize("make", [empty_sqlite, foreign_sqlite], ids=["empty", "foreign"])
def test_reading_a_sqlite_file_that_is_not_a_vortos_database_raises_storage_error(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    path = tmp_path / "other.db"
    make(path)
    model = open_read_model(path)
    expect_storage_error(model, path)


@pytest.mark.parametrize("make", [empty_sqlite, foreign_sqlite], ids=["empty", "foreign"])
def test_the_error_for_a_file_that_is_not_a_vortos_database_says_so(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    path = tmp_path / "other.db"
    make(path)
    model = open_read_model(path)
    for message in expect_storage_error(model, path):
        said = message.replace(str(path), "<path>")
        assert "vortos" in said.lower() or "another application" in said


def test_opening_a_read_model_on_a_missing_path_raises_storage_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(StorageError, match="no database at") as caught:
        open_read_model(missing)
    assert str(missing) in str(caught.value)
    assert not missing.exists()  # opening never creates the file


def test_opening_a_read_model_on_a_directory_or_a_non_sqlite_file_raises_storage_error(
    tmp_path: Path,
) -> None:
    with pytest.raises(StorageError, match="directory"):
        open_read_model(tmp_path)
    junk = tmp_path / "notes.txt"
    junk.write_text("hello, not sqlite\n" * 10)
    with pytest.raises(StorageError, match="not a SQLite database"):
        open_read_model(junk)


# On PostgreSQL: a session killed, a schema gone, a server not there.

postgres_only = pytest.mark.parametrize("backend", ["postgres"])


def with_application_name(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


def sessions_named(url: str, name: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s ORDER BY pid", (name,)
        ).fetchall()
    return [int(r[0]) for r in found]


def terminate(url: str, pids: list[int]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


@postgres_only
def test_a_postgres_read_model_recovers_after_its_connection_is_killed(
    engine: Engine, db: PlainDatabase, clock: ManualClock
) -> None:
    assert isinstance(db, str)
    create(engine, "kept")
    name = f"vortos-test-{secrets.token_hex(4)}"
    model = open_read_model(with_application_name(db, name))
    try:
        assert read(model.overview(clock.now_ms())).schedules == 1
        killed = sessions_named(db, name)
        assert len(killed) == 1  # the read model keeps its session for the next call
        terminate(db, killed)

        # The next call notices the dead session and reads on a new one.
        page = read(model.schedules(ScheduleListQuery()))
        assert names(page.rows) == [("default", "kept")]
        now = sessions_named(db, name)
        assert len(now) == 1
        assert now != killed
        assert read(model.overview(clock.now_ms())).schedules == 1
    finally:
        read(model.close())
    assert sessions_named(db, name) == []  # closing it closes its sessions


@postgres_only
def test_a_postgres_read_model_recovers_when_every_session_was_killed_mid_use(
    engine: Engine, db: PlainDatabase, clock: ManualClock
) -> None:
    assert isinstance(db, str)
    create(engine, "kept")
    name = f"vortos-test-{secrets.token_hex(4)}"
    model = open_read_model(with_application_name(db, name))

    async def several_at_once() -> list[int]:
        found = await asyncio.gather(*(model.overview(clock.now_ms()) for _ in range(4)))
        return [o.schedules for o in found]

    try:
        for _ in range(3):
            assert read(several_at_once()) == [1, 1, 1, 1]
            terminate(db, sessions_named(db, name))
        assert read(several_at_once()) == [1, 1, 1, 1]
    finally:
        read(model.close())


def schema_of(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SELECT current_schema()").fetchone()
    assert found is not None
    return str(found[0])


@postgres_only
def test_reads_of_a_schema_gone_fail_then_recover_when_it_is_back(
    engine: Engine, db: PlainDatabase, model: ReadModel
) -> None:
    assert isinstance(db, str)
    create(engine, "kept")
    assert read(model.overview(T0)).schedules == 1
    schema = schema_of(db)
    with psycopg.connect(db, autocommit=True) as admin:
        admin.execute(f"ALTER SCHEMA {schema} RENAME TO {schema}_moved")
        try:
            messages = expect_storage_error(model, db)
            assert all("no Vortos schema" in m for m in messages)
        finally:
            admin.execute(f"ALTER SCHEMA {schema}_moved RENAME TO {schema}")
    page = read(model.schedules(ScheduleListQuery()))
    assert names(page.rows) == [("default", "kept")]


def test_reads_of_a_postgres_server_that_is_not_there_fail_naming_it_without_its_password() -> None:
    url = "postgresql://vortos:s3cret-pw@127.0.0.1:9/nowhere"  # port 9: discard, never open
    model = open_read_model(url)
    messages = expect_storage_error(model, "postgresql://vortos:***@127.0.0.1:9/nowhere")
    assert all("cannot connect" in m and "s3cret-pw" not in m for m in messages)


def foreign_schema(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE users (id BIGINT PRIMARY KEY, name TEXT)")


@pytest.mark.parametrize("make", [None, foreign_schema], ids=["empty", "foreign"])
def test_reading_a_postgres_schema_that_is_not_vortos_raises_storage_error_saying_so(
    make: Callable[[str], None] | None,
) -> None:
    with fresh_schema(migrated=False) as url:
        if make is not None:
            make(url)
        model = open_read_model(url)
        try:
            for message in expect_storage_error(model, url):
                assert "no Vortos schema" in message
                assert "vortos --db URL db migrate" in message
        finally:
            read(model.close())


def test_opening_a_read_model_on_a_malformed_postgres_url_raises_storage_error() -> None:
    with pytest.raises(StorageError, match="invalid PostgreSQL URL"):
        open_read_model("postgresql://host:notaport/db")
    with pytest.raises(StorageError, match="names no database"):
        open_read_model("postgresql://127.0.0.1:5432")


# -- 8. reads never write ---------------------------------------------------------------------


@sqlite_only
def test_reads_leave_the_database_file_byte_for_byte_unchanged(
    engine: Engine,
    clock: ManualClock,
    consumer: FireQueueConsumer,
    db_path: Path,
    model: ReadModel,
) -> None:
    sid = create(engine, "alpha", command="ok", paused=True)
    run_id = engine.service.trigger("alpha", actor="test").id
    drive(consumer, all_settled(engine, consumer), "one run")
    engine.service.trigger("alpha", actor="test")
    consumer.close()
    engine.close()
    checkpoint = apsw.Connection(str(db_path))
    checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    checkpoint.close()
    before = db_path.read_bytes()
    mtime = db_path.stat().st_mtime_ns
    time.sleep(0.01)  # a write now would show in the mtime

    async def reads() -> None:
        for _ in range(3):
            await model.overview(clock.now_ms())
            await model.schedules(ScheduleListQuery())
            await model.schedules(ScheduleListQuery(text="alp", status=ScheduleStatus.PAUSED))
            await model.fires(FireListQuery())
            await model.fires(FireListQuery(state=RunState.COMPLETED, tenant=DEFAULT))
            await model.schedule(sid)
            await model.run(run_id)
            await model.run(12345)
        await model.close()

    read(reads())
    assert db_path.read_bytes() == before
    assert db_path.stat().st_mtime_ns == mtime
    wal = db_path.with_name(db_path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # nothing waiting to be written back


# -- 9. reads beside a writer -----------------------------------------------------------------


class Writer:
    """A write transaction of another process's connection, left open until `commit`."""

    def __init__(self, db: PlainDatabase) -> None:
        self._sqlite = apsw.Connection(str(db)) if isinstance(db, Path) else None
        self._pg = None if isinstance(db, Path) else psycopg.connect(db)
        if self._sqlite is not None:
            self._sqlite.execute("BEGIN IMMEDIATE")

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        if self._sqlite is not None:
            self._sqlite.execute(sql, args)
        else:
            assert self._pg is not None  # its transaction begins with the first statement
            self._pg.execute(sql.replace("?", "%s"), args)

    def commit(self) -> None:
        if self._sqlite is not None:
            self._sqlite.execute("COMMIT")
        else:
            assert self._pg is not None
            self._pg.commit()

    def close(self) -> None:
        if self._sqlite is not None:
            if not self._sqlite.get_autocommit():
                self._sqlite.execute("ROLLBACK")
            self._sqlite.close()
        elif self._pg is not None:
            self._pg.close()  # rolls back what was not committed


def test_a_read_beside_an_open_write_transaction_neither_waits_nor_sees_it(
    engine: Engine, clock: ManualClock, db: PlainDatabase, model: ReadModel
) -> None:
    sid = create(engine, "alpha", paused=True)
    create(engine, "beta")
    run_id = engine.service.trigger("alpha", actor="test").id
    before = read(model.overview(clock.now_ms()))
    writer = Writer(db)
    try:
        writer.execute(
            "INSERT INTO runs (tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, "
            "kind, state, dispatched_at, node_id) SELECT tenant, schedule_id, schedule_name, "
            "slot_key || '-uncommitted', slot_at + 1, due_at, kind, state, dispatched_at, "
            "node_id FROM runs WHERE id = ?",
            (run_id,),
        )
        writer.execute("UPDATE schedules SET status = 'paused' WHERE name = 'beta'")

        started = time.monotonic()
        overview = read(model.overview(clock.now_ms()))
        fires = read(model.fires(FireListQuery()))
        page = read(model.schedules(ScheduleListQuery(status=ScheduleStatus.PAUSED)))
        detail = read(model.schedule(sid))
        elapsed = time.monotonic() - started

        assert elapsed < 1.0  # the read busy timeout is 2 s: nothing waited for the writer
        assert overview == before
        assert [r.id for r in fires.rows] == [run_id]
        assert names(page.rows) == [("default", "alpha")]
        assert detail is not None
        assert [r.id for r in detail.runs] == [run_id]
        writer.commit()
    finally:
        writer.close()
    # Committed, the same read model sees it at its next call.
    assert len(read(model.fires(FireListQuery())).rows) == 2
    assert read(model.overview(clock.now_ms())).paused == 2

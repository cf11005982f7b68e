"""What one dispatched fire costs the store, counted rather than timed, so a regression in the
writes per fire fails here and not months later in a benchmark.

N schedules each have one slot due; one daemon step dispatches them all in one transaction on a
real SQLite file. Counted: rows written per table (an update hook on the rowid tables, counts
on audit_entries, which has no rowid), SQL statements the engine executed (apsw's exec trace,
called once per statement and once per row of an executemany), and pages written to the WAL.
Two sizes are dispatched so the fixed cost of a transaction and the cost of each fire come
apart: per fire = (cost(N2) - cost(N1)) / (N2 - N1).
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import apsw
import pytest

from engine import (
    Engine,
    IntervalTrigger,
    ManualClock,
    MisfirePolicy,
    SchedulerDaemon,
    open_engine,
)
from engine.backends.codec import SCHEDULE_COLUMNS, schedule_values
from engine.domain.schedule import OverlapPolicy, Schedule, ScheduleStatus
from engine.domain.timeutil import HOUR_MS, MINUTE_MS, SECOND_MS
from engine.ports.dispatch import DispatchReport
from tests.conftest import T0
from tests.helpers import settle, sqlite_pool

N1, N2 = 250, 500
# Every slot is due a minute after T0; the dispatching step runs a second after that.
SLOT = T0 + MINUTE_MS


@dataclass
class Cost:
    """What one daemon step wrote."""

    fires: int
    statements: int
    writes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (table, op) -> rows
    audit_rows: int = 0
    pages: int = 0
    transactions: int = 0
    by_statement: Counter[str] = field(default_factory=Counter)


def add_schedules(engine: Engine, count: int) -> None:
    """`count` schedules every hour from SLOT, inserted in one transaction with the engine's
    own codec (one service call each would be a transaction and an audit entry each)."""
    template = Schedule(
        id="",
        tenant="default",
        name="",
        trigger=IntervalTrigger(60 * MINUTE_MS, SLOT),
        timezone="UTC",
        command="noop",
        payload={"n": 1},
        misfire=MisfirePolicy(),
        overlap=OverlapPolicy.SKIP,
        jitter_ms=0,
        status=ScheduleStatus.ACTIVE,
        sensitive=False,
        metadata={},
        version=1,
        next_slot_at=SLOT,
        next_fire_at=SLOT,
        created_at=T0,
        updated_at=T0,
    )
    marks = ", ".join("?" * len(SCHEDULE_COLUMNS.split(",")))
    rows = []
    for i in range(count):
        sid = uuid.uuid4().hex
        rows.append(
            schedule_values(Schedule(**{**_fields(template), "id": sid, "name": f"s-{i:05d}"}))
        )
    with sqlite_pool(engine).transaction() as conn:
        conn.executemany(f"INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES ({marks})", rows)


def _fields(schedule: Schedule) -> dict[str, Any]:
    return {name: getattr(schedule, name) for name in schedule.__slots__}


def count_of(conn: apsw.Connection, sql: str) -> int:
    value = conn.execute(sql).fetchall()[0][0]
    assert isinstance(value, int)
    return value


def measured_step(
    engine: Engine, daemon: SchedulerDaemon, reports: list[DispatchReport], at: int, expect: int
) -> Cost:
    """One daemon step at `at`, on the test's thread, which dispatches `expect` fires, counted
    (`reports`: where the daemon puts what it dispatched)."""
    conn = sqlite_pool(engine).get()  # the daemon's connection: this thread's
    statements: Counter[str] = Counter()
    writes: Counter[tuple[str, str]] = Counter()
    commits = 0
    reports.clear()

    def traced(_cursor: apsw.Cursor, sql: str, _bindings: Any) -> bool:
        statements[" ".join(sql.split()[:3])] += 1
        return True

    def updated(op: int, _db: str, table: str, _rowid: int) -> None:
        writes[table, _OPS.get(op, "delete")] += 1

    def committed() -> bool:
        nonlocal commits
        commits += 1
        return False  # go ahead

    audit_before = count_of(conn, "SELECT count(*) FROM audit_entries")
    clock = engine.clock
    assert isinstance(clock, ManualClock)
    clock.set(at)
    pages_before = conn.status(apsw.SQLITE_DBSTATUS_CACHE_WRITE)[0]
    conn.exec_trace = traced
    conn.set_update_hook(updated)
    conn.set_commit_hook(committed)
    try:
        daemon.step()
    finally:
        conn.exec_trace = None
        conn.set_update_hook(None)
        conn.set_commit_hook(None)
    pages = conn.status(apsw.SQLITE_DBSTATUS_CACHE_WRITE)[0] - pages_before
    fires = sum(len(r.dispatched) for r in reports)
    assert fires == expect, f"one step dispatched {fires} of {expect} due fires"
    return Cost(
        fires=fires,
        statements=sum(statements.values()),
        writes=writes,
        audit_rows=count_of(conn, "SELECT count(*) FROM audit_entries") - audit_before,
        pages=pages,
        transactions=commits,
        by_statement=statements,
    )


_OPS = {apsw.SQLITE_INSERT: "insert", apsw.SQLITE_UPDATE: "update"}


@dataclass(frozen=True)
class Costs:
    """Dispatching N1 and N2 due slots: `cold` by a daemon just started (no definition read
    yet), `warm` an hour later, the next slot of the same schedules by the same daemon."""

    cold: tuple[Cost, Cost]
    warm: tuple[Cost, Cost]


@pytest.fixture(scope="module")
def costs(tmp_path_factory: pytest.TempPathFactory) -> Costs:
    folder = tmp_path_factory.mktemp("cost")
    cold, warm = [], []
    for n in (N1, N2):
        clock = ManualClock(T0)
        with open_engine(folder / f"cost-{n}.db", clock=clock) as engine:
            add_schedules(engine, n)
            reports: list[DispatchReport] = []
            daemon = engine.daemon(
                node_id="cost", lease_ttl_ms=86_400_000, tenant_cap=None, on_dispatch=reports.append
            )
            settle(daemon)  # leads; nothing is due yet
            cold.append(measured_step(engine, daemon, reports, SLOT + SECOND_MS, n))
            warm.append(measured_step(engine, daemon, reports, SLOT + HOUR_MS + SECOND_MS, n))
    return Costs((cold[0], cold[1]), (warm[0], warm[1]))


def per_fire(small: float, large: float) -> float:
    """The cost of each fire; a statement now and then per transaction (an audit checkpoint
    every so many entries, written in one run and not the other) adds a few thousandths."""
    return round((large - small) / (N2 - N1), 1)


def test_each_dispatched_fire_writes_one_run_one_fire_and_one_cursor_move(costs: Costs) -> None:
    for cost in (*costs.cold, *costs.warm):
        assert cost.transactions == 1, f"{cost.fires} fires took {cost.transactions} commits"
        assert cost.writes["runs", "insert"] == cost.fires
        assert cost.writes["fire_queue", "insert"] == cost.fires
        assert cost.writes["schedules", "update"] == cost.fires  # its cursor, once
        # Nothing else is written by a dispatch: no update of a run or fire just inserted,
        # no delete, no other table.
        others = {k: v for k, v in cost.writes.items() if k not in _EXPECTED_WRITES}
        assert others == {}, f"unexpected writes per dispatch: {others}"
        assert cost.audit_rows <= cost.fires + 2


_EXPECTED_WRITES = {("runs", "insert"), ("fire_queue", "insert"), ("schedules", "update")}


def test_a_dispatched_fire_costs_a_bounded_number_of_statements_and_pages(costs: Costs) -> None:
    for (small, large), cached, most in ((costs.cold, "cold", 5), (costs.warm, "warm", 4)):
        statements = per_fire(small.statements, large.statements)
        # Today, per fire: its run, its fire, its cursor move and its audit entry; and, the
        # daemon's definition cache being cold, the read of its schedule's definition.
        assert statements <= most, (
            f"{statements:.2f} statements per fire ({cached}): {dict(large.by_statement)}"
        )
        fixed = small.statements - statements * N1
        # Per transaction: the lease fence, the due scan, the run ids, the audit key's epoch
        # (a sealed or rotated key is noticed at the next write), whether the chain is
        # opened, its head, the batch entry, the commit, and the daemon's next-due reads;
        # cold, the chain's opening too (its database id, the entry, its row).
        bound = 15 if cached == "cold" else 12
        assert fixed <= bound, (
            f"{fixed:.0f} statements per transaction besides the fires' ({cached}): "
            f"{dict(small.by_statement)}"
        )
        # Pages written to the WAL: rows of a few hundred bytes in four tables and their
        # indexes (0.34 per fire when this was written).
        pages = per_fire(small.pages, large.pages)
        assert pages <= 0.45, f"{pages:.2f} WAL pages per fire ({cached})"


def test_a_dispatch_transaction_appends_at_most_two_audit_entries_whatever_its_size(
    costs: Costs,
) -> None:
    for small, large in (costs.cold, costs.warm):
        assert small.audit_rows <= 2
        assert large.audit_rows <= 2
    # One audit entry per transaction, not per fire: per fire its run, its fire, its cursor
    # move, and (cold) its definition.
    assert per_fire(costs.cold[0].statements, costs.cold[1].statements) <= 4
    assert per_fire(costs.warm[0].statements, costs.warm[1].statements) <= 3

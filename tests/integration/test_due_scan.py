"""The due scan's cost follows the number due, not the number stored (acceptance 4)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from engine import CronTrigger, ManualClock, ScheduleSpec, open_engine
from engine.backends.sqlite.dispatch import _DUE
from engine.domain.timeutil import DAY_MS
from engine.ports.lease import LEADER_LEASE
from tests.conftest import T0
from tests.helpers import resolver_at, sqlite_pool

DUE = 100
FAR = T0 + 365 * DAY_MS


def fill(db: Path, clock: ManualClock, stored: int) -> None:
    """`stored` schedules, of which DUE are due now, by cloning one real row in SQL."""
    with open_engine(db, clock=clock) as engine:
        engine.service.create(
            ScheduleSpec(name="template", trigger=CronTrigger("0 3 * * *"), command="noop"),
            actor="test",
        )
    conn = apsw.Connection(str(db))
    columns = [r[1] for r in conn.execute("PRAGMA table_info(schedules)")]
    copied = ", ".join(
        {
            "id": "printf('%032x', x)",
            "name": "'s' || x",
            "next_fire_at": "?",
            "next_slot_at": "?",
        }.get(c, c)
        for c in columns
    )
    conn.execute("BEGIN")
    conn.execute(
        f"WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?) "
        f"INSERT INTO schedules ({', '.join(columns)}) SELECT {copied} "
        "FROM n, (SELECT * FROM schedules WHERE name = 'template')",
        (stored - 1, FAR, FAR),
    )
    conn.execute(
        "UPDATE schedules SET next_fire_at = ?, next_slot_at = ? WHERE rowid IN "
        "(SELECT rowid FROM schedules ORDER BY random() LIMIT ?)",
        (T0, T0, DUE),
    )
    conn.execute("COMMIT")
    conn.close()


def dispatch_steps(db: Path, clock: ManualClock) -> tuple[int, int]:
    """(VM steps / 100, fires) for one dispatch transaction of everything due."""
    with open_engine(db, clock=clock) as engine:
        storage = engine.storage
        assert storage.leases.acquire(LEADER_LEASE, "t", "test", 60_000) is not None
        conn = sqlite_pool(engine).get()
        ticks = [0]

        def count() -> bool:
            ticks[0] += 1
            return False

        conn.set_progress_handler(count, 100)
        report = storage.dispatcher.dispatch_due(
            lease_key=LEADER_LEASE,
            token="t",
            node_id="test",
            now_ms=clock.now_ms(),
            limit=10_000,
            resolve=resolver_at(clock.now_ms()),
        )
        conn.set_progress_handler(None)
        return ticks[0], len(report.dispatched)


def test_the_due_scan_reads_the_due_index_only(tmp_path: Path, clock: ManualClock) -> None:
    db = tmp_path / "plan.db"
    fill(db, clock, 1000)
    conn = apsw.Connection(str(db))
    plan = " | ".join(str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {_DUE}", (T0, 10)))
    conn.close()
    assert "USING INDEX schedules_due" in plan
    assert "SCAN" not in plan.replace("SCAN schedules USING INDEX", "")


@pytest.mark.slow
def test_work_for_100_due_is_the_same_with_1000_or_1000000_stored(
    tmp_path: Path, clock: ManualClock
) -> None:
    small, large = tmp_path / "small.db", tmp_path / "large.db"
    fill(small, clock, 1_000)
    fill(large, clock, 1_000_000)
    small_steps, small_fires = dispatch_steps(small, clock)
    large_steps, large_fires = dispatch_steps(large, clock)
    assert small_fires == large_fires == DUE
    # B-tree depth grows with the log of the table size; a scan would grow 1000-fold.
    assert large_steps < small_steps * 1.5, (small_steps, large_steps)

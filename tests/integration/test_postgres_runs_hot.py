"""A run's writes after its dispatch (claimed: running; settled: finished) are HOT updates on
PostgreSQL: the runs table leaves room on its pages (fillfactor), and neither write changes an
indexed column, so most of them write no index entry. Counted by the server's own per-
transaction counters around each claim and settle, in the transaction that makes them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import IntervalTrigger, OverlapPolicy, RunState, ScheduleSpec
from engine.api import Engine
from engine.ports.fire_queue import Outcome, Settlement
from tests.pg import fresh_schema, pg_engine

FIRES, BATCH = 1500, 125
# Measured on a fresh backlog in batches of 125: fillfactor 100 made 6 % of these writes HOT,
# 60 makes 79 % (a batch claims every run of its pages at once, so some pages still fill up).
LEAST_HOT_SHARE = 0.6
_COUNTS = (
    "SELECT pg_stat_get_xact_tuples_updated('runs'::regclass), "
    "pg_stat_get_xact_tuples_hot_updated('runs'::regclass)"
)


@pytest.fixture
def engine() -> Iterator[Engine]:
    with fresh_schema() as url:
        engine = pg_engine(url)
        try:
            engine.service.create(
                ScheduleSpec(
                    name="backlog",
                    trigger=IntervalTrigger(every_ms=1000, anchor_ms=0),
                    command="noop",
                    overlap=OverlapPolicy.ALLOW,
                ),
                actor="test",
            )
            end = engine.clock.now_ms() // 1000 * 1000 - 1000
            report = engine.service.backfill(
                "backlog", start_ms=end - FIRES * 1000, end_ms=end, actor="test", confirmed=True
            )
            assert report.dispatched == FIRES
            yield engine
        finally:
            engine.close()


def test_the_runs_table_leaves_room_on_its_pages(engine: Engine) -> None:
    pool = engine.storage.fire_queue._pool  # type: ignore[attr-defined]
    with pool.transaction() as conn:
        (options,) = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'runs'::regclass"
        ).fetchone()
    assert options == ["fillfactor=60"]


def test_most_run_writes_of_a_claim_and_a_settle_are_hot(engine: Engine) -> None:
    queue = engine.storage.fire_queue
    pool = queue._pool  # type: ignore[attr-defined]
    updated = hot = done = 0
    while done < FIRES:
        with pool.transaction() as conn:
            before = conn.execute(_COUNTS).fetchone()
            claim = queue._claim_in(conn, "c1", 60_000, BATCH, None)  # type: ignore[attr-defined]
            after = conn.execute(_COUNTS).fetchone()
        updated, hot = updated + after[0] - before[0], hot + after[1] - before[1]
        settlements = [
            Settlement(f.run_id, Outcome.COMPLETE, RunState.COMPLETED) for f in claim.fires
        ]
        with pool.transaction() as conn:
            before = conn.execute(_COUNTS).fetchone()
            queue._settle_in(conn, claim.token, "c1", settlements)  # type: ignore[attr-defined]
            after = conn.execute(_COUNTS).fetchone()
        updated, hot = updated + after[0] - before[0], hot + after[1] - before[1]
        assert claim.fires, "the backlog must drain"
        done += len(claim.fires)
    assert updated == 2 * FIRES, "each run written once by its claim and once by its settle"
    assert hot / updated >= LEAST_HOT_SHARE, f"{hot} of {updated} run writes HOT"

"""The claim's fast path on PostgreSQL (fires of allow schedules taken straight from the index)
still takes each schedule's shared lock: a consumer that saw the schedule's policy change to one
that needs a decision holds it exclusively while it decides, and meanwhile no claim takes that
schedule's fires, on either path."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from engine import IntervalTrigger, OverlapPolicy, ScheduleSpec
from engine.api import Engine
from engine.backends.postgres.fire_queue import _schedule_lock
from tests.pg import fresh_schema, pg_engine

FIRES = 20


@pytest.fixture
def backlog() -> Iterator[tuple[Engine, str]]:
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
            yield engine, url
        finally:
            engine.close()


def test_no_claim_takes_an_allow_schedules_fires_while_another_holds_it_exclusively(
    backlog: tuple[Engine, str],
) -> None:
    engine, url = backlog
    queue = engine.storage.fire_queue
    schedule_id = queue.pending(limit=1)[0].schedule_id
    with psycopg.connect(url) as deciding, deciding.transaction():
        deciding.execute("SELECT pg_advisory_xact_lock(%s)", (_schedule_lock(schedule_id),))

        held_back = queue.claim(consumer="c1", ttl_ms=60_000, limit=10)

        assert held_back.fires == [], "a schedule locked exclusively elsewhere is left alone"
    after = queue.claim(consumer="c1", ttl_ms=60_000, limit=10)
    assert [f.run_id for f in after.fires] == [f.run_id for f in queue.pending(limit=FIRES)][:10]

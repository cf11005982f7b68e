"""A PostgreSQL consumer with as many workers as the pool has connections, every attempt
failing at once: each failure is settled with its schedule's retry policy, promptly.

Each thread that reads the store keeps a pooled connection from then on. Workers that read
their schedule's retry policy themselves ran the pool (16) dry beside the loop thread: the
last ones waited out the pool's 30 s timeout and then settled with the default policy, which
retried fires the schedule said must not be retried.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from engine import IntervalTrigger, OverlapPolicy, RunState, ScheduleSpec
from engine.api import Engine
from engine.backends.postgres.connection import POOL_MAX, POOL_TIMEOUT_S
from engine.domain.retry import RetryPolicy
from engine.ports import RunQuery
from tests.pg import fresh_schema, pg_engine

FIRES = 3 * POOL_MAX


def always_fails() -> None:
    raise RuntimeError("boom")


@pytest.fixture
def engine() -> Iterator[Engine]:
    with fresh_schema() as url:
        engine = pg_engine(url)
        try:
            engine.commands.register("always-fails", always_fails)
            engine.service.create(
                ScheduleSpec(
                    name="fails",
                    trigger=IntervalTrigger(every_ms=1000, anchor_ms=0),
                    command="always-fails",
                    overlap=OverlapPolicy.ALLOW,
                    # No second attempt: the default policy would retry each fire twice more.
                    retry=RetryPolicy(max_attempts=1, backoff_ms=0, backoff_cap_ms=0),
                ),
                actor="test",
            )
            end = engine.clock.now_ms() // 1000 * 1000 - 1000
            report = engine.service.backfill(
                "fails", start_ms=end - FIRES * 1000, end_ms=end, actor="test", confirmed=True
            )
            assert report.dispatched == FIRES
            yield engine
        finally:
            engine.close()


def test_as_many_failing_workers_as_pooled_connections_settle_with_their_policy_promptly(
    engine: Engine,
) -> None:
    consumer = engine.consumer(consumer_id="c", concurrency=POOL_MAX)
    started = time.monotonic()
    deadline = started + POOL_TIMEOUT_S * 0.8
    loop = threading.Thread(target=consumer.run, name="consumer-loop")
    loop.start()
    try:
        while time.monotonic() < deadline:
            runs = engine.storage.runs.query(RunQuery(limit=FIRES + 10))
            if sum(1 for r in runs if r.state is RunState.DEAD_LETTERED) == FIRES:
                break
            time.sleep(0.1)
    finally:
        consumer.stop()
        loop.join(timeout=60)
    assert not loop.is_alive()
    runs = engine.storage.runs.query(RunQuery(limit=FIRES + 10))
    states = {r.state for r in runs}
    # Every fire failed once and was not retried: the schedule's policy, not the default.
    assert states == {RunState.DEAD_LETTERED}, states
    assert max(r.attempts for r in runs) == 1, sorted({r.attempts for r in runs})
    assert len(runs) == FIRES

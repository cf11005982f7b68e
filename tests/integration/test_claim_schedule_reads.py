"""What a consumer reads of the schedules to run a claim, counted (not timed): the time limits
and retry policies of a claim's fires cost one narrow read (execution_limits: no definition
decoded) for the whole claim, however many schedules its fires belong to, and none while they
were read lately.

A read per schedule put a round trip per fire on the consume path as soon as fires came from
many schedules (the benches' one-schedule backlog hid it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine import IntervalTrigger, OverlapPolicy, ScheduleSpec, open_engine
from engine.api import Engine
from engine.domain.clock import ManualClock
from engine.domain.timeutil import SECOND_MS
from engine.ports import RunQuery
from engine.ports.schedules import ScheduleStore

SCHEDULES = 40


class CountingReads:
    """The real schedule store, with its reads counted."""

    def __init__(self, store: ScheduleStore) -> None:
        self._store = store
        self.gets = 0
        self.queries: list[frozenset[str]] = []

    def get(self, schedule_id: str, tenant: str | None = None) -> Any:
        self.gets += 1
        return self._store.get(schedule_id, tenant)

    def execution_limits(self, ids: Any) -> Any:
        self.queries.append(frozenset(ids))
        return self._store.execution_limits(ids)


def due_fires(engine: Engine, clock: ManualClock) -> None:
    """One due fire in each of SCHEDULES schedules, two of them with a time limit."""
    for i in range(SCHEDULES):
        engine.service.create(
            ScheduleSpec(
                name=f"job-{i:02d}",
                trigger=IntervalTrigger(every_ms=60 * SECOND_MS, anchor_ms=0),
                command="noop",
                overlap=OverlapPolicy.ALLOW,
                timeout_ms=30 * SECOND_MS if i < 2 else None,
            ),
            actor="test",
        )
    clock.advance(61 * SECOND_MS)
    dispatch(engine, SCHEDULES)


def dispatch(engine: Engine, runs: int) -> None:
    daemon = engine.daemon(node_id="n1")
    for _ in range(10):
        daemon.step()
        if len(engine.storage.runs.query(RunQuery(limit=1000))) >= runs:
            break
    assert len(engine.storage.runs.query(RunQuery(limit=1000))) == runs


def test_a_claim_of_fires_of_many_schedules_reads_the_schedules_once(
    tmp_path: Path, clock: ManualClock
) -> None:
    with open_engine(tmp_path / "vortos.db", clock=clock) as engine:
        due_fires(engine, clock)
        consumer = engine.consumer(consumer_id="c", concurrency=SCHEDULES)
        reads = CountingReads(engine.storage.schedules)
        consumer.time_limits._schedules = reads  # type: ignore[assignment]
        try:
            consumer.step()
            assert len(consumer._inflight) == SCHEDULES
            assert reads.gets == 0
            assert len(reads.queries) == 1
            assert len(reads.queries[0]) == SCHEDULES
            # Their limits were read with them: the two limited runs are watched.
            limits = [item.limit_ms for item in consumer._inflight.values()]
            assert sorted(limits, key=str) == [30 * SECOND_MS] * 2 + [None] * (SCHEDULES - 2)

            # The next slot of each, claimed moments later: nothing is read again.
            clock.advance(60 * SECOND_MS)
            dispatch(engine, 2 * SCHEDULES)
            for _ in range(500):
                consumer.step()
                if consumer.stats.claimed == 2 * SCHEDULES and not consumer._inflight:
                    break
            assert consumer.stats.claimed == 2 * SCHEDULES
            assert reads.gets == 0
            assert len(reads.queries) == 1
        finally:
            consumer.stop()
        runs = engine.storage.runs.query(RunQuery(limit=1000))
        assert len(runs) == 2 * SCHEDULES

"""What a batch claim and a batch settle cost on PostgreSQL, counted (not timed) from the
client's side of the wire (libpq's protocol trace): the statements and the round trips of a
batch do not grow with the number of fires in it. A regression to a statement per fire (the
settle's executemany) or a round trip per fire fails here, not in a benchmark."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine import IntervalTrigger, OverlapPolicy, RunState, ScheduleSpec
from engine.api import Engine
from engine.ports.fire_queue import Claim, Outcome, Settlement
from tests.pg import fresh_schema, pg_engine

SMALL, LARGE = 10, 200
# What a claim of an allow schedule's backlog costs (the fast path): begin; the fires locked
# from the index; in one round trip the schedules' shared locks and their definitions again;
# the update; commit.
FAST_CLAIM_STATEMENTS, FAST_CLAIM_ROUND_TRIPS = 6, 5
# And with a fire to decide about at the head (a skip schedule's), after the fast path the
# general one: the live claims, the fires, the schedule locks, what it reads again under them
# (one round trip), the fires' row locks, the update.
MOST_MIXED_CLAIM_STATEMENTS = 14


@dataclass(frozen=True)
class Wire:
    statements: int  # Execute (extended protocol) and Query (simple) messages sent
    round_trips: int  # ReadyForQuery messages received: each a wait for the server


@contextmanager
def traced(engine: Engine) -> Iterator[list[Wire]]:
    """Trace the protocol of this thread's connection for the block; the counts are appended
    to the list yielded when it ends."""
    from psycopg import pq  # noqa: PLC0415

    pool = engine.storage.fire_queue._pool  # type: ignore[attr-defined]
    pgconn = pool.get().pgconn
    found: list[Wire] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace"
        with path.open("w") as out:
            pgconn.trace(out.fileno())
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                yield found
            finally:
                pgconn.untrace()
        messages = [line.split("\t") for line in path.read_text().splitlines()]
    found.append(
        Wire(
            statements=sum(1 for m in messages if m[0] == "F" and m[2] in ("Execute", "Query")),
            round_trips=sum(1 for m in messages if m[0] == "B" and m[2] == "ReadyForQuery"),
        )
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
            fires = 2 * (SMALL + LARGE)
            report = engine.service.backfill(
                "backlog", start_ms=end - fires * 1000, end_ms=end, actor="test", confirmed=True
            )
            assert report.dispatched == fires
            yield engine
        finally:
            engine.close()


def claim(engine: Engine, limit: int) -> tuple[Claim, Wire]:
    with traced(engine) as wire:
        _, taken = engine.storage.fire_queue.settle_and_claim(
            {}, consumer="c1", ttl_ms=60_000, limit=limit
        )
    assert len(taken.fires) == limit
    return taken, wire[0]


def settle(engine: Engine, taken: Claim, outcomes: list[Outcome]) -> Wire:
    states = {Outcome.COMPLETE: RunState.COMPLETED, Outcome.FAIL: RunState.DISPATCHED}
    settlements = [
        Settlement(
            f.run_id,
            outcome,
            states[outcome],
            error=None if outcome is Outcome.COMPLETE else f"boom {i}",
            available_at=None if outcome is Outcome.COMPLETE else f.available_at + 60_000,
        )
        for i, (f, outcome) in enumerate(zip(taken.fires, outcomes, strict=True))
    ]
    with traced(engine) as wire:
        reports, _ = engine.storage.fire_queue.settle_and_claim(
            {taken.token: settlements}, consumer="c1", ttl_ms=60_000, limit=0
        )
    assert sorted(reports[taken.token].acked) == sorted(f.run_id for f in taken.fires)
    return wire[0]


def test_a_claim_costs_the_same_statements_and_round_trips_for_10_fires_as_for_200(
    engine: Engine,
) -> None:
    small = claim(engine, SMALL)[1]
    large = claim(engine, LARGE)[1]
    assert large == small, f"{SMALL} fires: {small}; {LARGE} fires: {large}"
    assert small == Wire(FAST_CLAIM_STATEMENTS, FAST_CLAIM_ROUND_TRIPS), small


@pytest.fixture
def mixed() -> Iterator[Engine]:
    """An allow schedule's backlog with, inside each claim's range (10 fires, then 200), one
    fire of a skip schedule: fires become available in the order they are backfilled."""
    with fresh_schema() as url:
        engine = pg_engine(url)
        try:
            for name, overlap in (("backlog", OverlapPolicy.ALLOW), ("alone", OverlapPolicy.SKIP)):
                engine.service.create(
                    ScheduleSpec(
                        name=name,
                        trigger=IntervalTrigger(every_ms=1000, anchor_ms=0),
                        command="noop",
                        overlap=overlap,
                    ),
                    actor="test",
                )
            start = engine.clock.now_ms() // 1000 * 1000 - 10_000_000
            chunks = [("backlog", SMALL // 2), ("alone", 1), ("backlog", SMALL + LARGE // 2)]
            chunks += [("alone", 1), ("backlog", LARGE)]
            for name, count in chunks:
                end = start + count * 1000 - 1
                engine.service.backfill(
                    name, start_ms=start, end_ms=end, actor="test", confirmed=True
                )
                start = end + 1
            yield engine
        finally:
            engine.close()


def test_a_claim_with_a_fire_to_decide_about_costs_the_same_for_10_fires_as_for_200(
    mixed: Engine,
) -> None:
    """The claim takes the allow fires before the skip schedule's fire on the fast path, and
    that fire and the rest on the general one: still a fixed number of statements, and the
    order of availability kept."""
    order = [f.run_id for f in mixed.storage.fire_queue.pending(limit=SMALL + LARGE)]
    small_claim, small = claim(mixed, SMALL)
    settle(mixed, small_claim, [Outcome.COMPLETE] * SMALL)  # the skip schedule idle again
    large_claim, large = claim(mixed, LARGE)
    assert large == small, f"{SMALL} fires: {small}; {LARGE} fires: {large}"
    assert small.statements <= MOST_MIXED_CLAIM_STATEMENTS, small
    assert [f.run_id for f in small_claim.fires + large_claim.fires] == order
    assert [f.schedule_name for f in small_claim.fires].count("alone") == 1
    assert [f.schedule_name for f in large_claim.fires].count("alone") == 1


def test_a_settle_is_one_statement_per_kind_of_change_and_one_round_trip_for_them(
    engine: Engine,
) -> None:
    small_claim, large_claim = claim(engine, SMALL)[0], claim(engine, LARGE)[0]
    small = settle(engine, small_claim, [Outcome.COMPLETE] * SMALL)
    large = settle(engine, large_claim, [Outcome.COMPLETE] * LARGE)
    assert large == small, f"{SMALL} fires: {small}; {LARGE} fires: {large}"
    # begin, the fires still held (locked), then in one round trip the fires' update and the
    # runs' update; commit.
    assert small == Wire(statements=5, round_trips=4), small
    # Two outcomes: one statement more (the failed fires' update), no round trip more.
    mixed_claim = claim(engine, LARGE)[0]
    half = LARGE // 2
    mixed = settle(engine, mixed_claim, [Outcome.COMPLETE] * half + [Outcome.FAIL] * half)
    assert mixed == Wire(statements=6, round_trips=4), mixed
    runs = [engine.service.run(f.run_id) for f in mixed_claim.fires]
    assert {r.state for r in runs[:half]} == {RunState.COMPLETED}
    assert {r.state for r in runs[half:]} == {RunState.DISPATCHED}  # to be tried again
    assert [r.error for r in runs[half:]] == [f"boom {i}" for i in range(half, LARGE)]
    fires = [engine.storage.fire_queue.get(f.run_id) for f in mixed_claim.fires[half:]]
    assert all(f is not None and f.consecutive_failures == 1 for f in fires)


def test_text_of_any_kind_survives_the_array_literals(engine: Engine) -> None:
    """Errors and outputs travel in array literals: quotes, backslashes, braces, commas,
    the word NULL, empty and multi-line text and other scripts come back as they went."""
    texts = ['say "hi"', "back\\slash\\", "{a,b}", "NULL", "", " padded ", "two\nlines", "ü€😀"]
    taken = claim(engine, len(texts))[0]
    settlements = [
        Settlement(f.run_id, Outcome.COMPLETE, RunState.COMPLETED, output=text)
        for f, text in zip(taken.fires, texts, strict=True)
    ]
    reports, _ = engine.storage.fire_queue.settle_and_claim(
        {taken.token: settlements}, consumer="c1", ttl_ms=60_000, limit=0
    )
    assert len(reports[taken.token].acked) == len(texts)
    assert [engine.service.run(f.run_id).output for f in taken.fires] == texts

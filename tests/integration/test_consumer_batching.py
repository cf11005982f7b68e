"""The consumer's writes per fire, counted on a real SQLite file (not timed): a regression in
group commit or prefetch (a transaction per fire again) fails here, not in a benchmark months
later. Also what prefetch must not do: hold back fires the workers cannot start soon."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import apsw
import pytest

from engine import (
    CommandRegistry,
    Engine,
    IntervalTrigger,
    OverlapPolicy,
    RunState,
    ScheduleSpec,
    SystemClock,
    builtin_commands,
    open_engine,
)
from engine.ports import RunQuery
from engine.ports.fire_queue import Settlement, SettleReport
from engine.runtime.consumer import PREFETCH_AFTER_RUNS, FireQueueConsumer

FIRES = 500
CONSUMER_THREADS = ("vortos-consumer", "vortos-worker-")
# Bounds with room for a slow machine's thread timing; what this code does on two cores:
# about 0.03 transactions, 0.1 statements and 4 row writes per fire.
MAX_TRANSACTIONS_PER_FIRE = 0.1
MAX_STATEMENTS_PER_FIRE = 0.5
MAX_ROWS_PER_FIRE = 4  # claim and settle each write the fire's row and its run's


@dataclass
class Counts:
    """What the consumer's threads did to the file, from SQLite's own hooks."""

    commits: int = 0
    statements: int = 0
    rows: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str) -> None:
        if threading.current_thread().name.startswith(CONSUMER_THREADS):
            with self.lock:
                setattr(self, what, getattr(self, what) + 1)

    def watch(self, conn: apsw.Connection) -> None:
        def committed() -> bool:
            self.add("commits")
            return False  # let it commit

        def executed(_cursor: apsw.Cursor, _sql: str, _bindings: object) -> bool:
            self.add("statements")
            return True  # let it run

        conn.set_commit_hook(committed)
        conn.set_exec_trace(executed)
        conn.set_update_hook(lambda *_: self.add("rows"))


@pytest.fixture
def counts() -> Iterator[Counts]:
    found = Counts()
    apsw.connection_hooks.append(found.watch)
    try:
        yield found
    finally:
        apsw.connection_hooks.remove(found.watch)


def backlog(
    db: Path, fires: int, command: str = "noop", commands: CommandRegistry | None = None
) -> None:
    """`fires` past slots of one schedule (overlap allow: they may all run side by side)."""
    with open_engine(db, commands=commands) as engine:
        engine.service.create(
            ScheduleSpec(
                name="backlog",
                trigger=IntervalTrigger(every_ms=1000, anchor_ms=0),
                command=command,
                overlap=OverlapPolicy.ALLOW,
            ),
            actor="test",
        )
        end = engine.clock.now_ms() // 1000 * 1000 - 1000
        report = engine.service.backfill(
            "backlog", start_ms=end - fires * 1000, end_ms=end, actor="test", confirmed=True
        )
        assert report.dispatched == fires


def consume(engine: Engine, fires: int, **config: object) -> FireQueueConsumer:
    """Run a consumer (default settings unless `config`) until `fires` runs completed."""
    done = threading.Event()
    settled = [0]

    def on_settle(settlements: list[Settlement], report: SettleReport) -> None:
        settled[0] += len(report.acked)
        if settled[0] >= fires:
            done.set()

    consumer = engine.consumer(consumer_id="c1", on_settle=on_settle, **config)  # type: ignore[arg-type]
    loop = threading.Thread(target=consumer.run, name="vortos-consumer")
    loop.start()
    try:
        assert done.wait(60), f"only {settled[0]} of {fires} fires settled"
    finally:
        consumer.stop()
        loop.join(30)
    return consumer


def test_a_backlog_of_no_op_fires_costs_a_small_constant_of_writes_per_fire(
    tmp_path: Path, counts: Counts
) -> None:
    """Promise: the default consumer settles many fires per transaction (group commit) and
    claims many per transaction (prefetch), so transactions per fire stay far below one."""
    db = tmp_path / "vortos.db"
    backlog(db, FIRES)
    with open_engine(db, clock=SystemClock()) as engine:
        counts.commits = counts.statements = counts.rows = 0
        consume(engine, FIRES)
        (completed,) = {r.state for r in engine.service.runs(RunQuery(limit=FIRES + 1))}
        assert completed is RunState.COMPLETED
        assert all(r.attempts == 1 for r in engine.service.runs(RunQuery(limit=FIRES + 1)))
    per_fire = {
        "transactions": counts.commits / FIRES,
        "statements": counts.statements / FIRES,
        "rows": counts.rows / FIRES,
    }
    assert per_fire["transactions"] <= MAX_TRANSACTIONS_PER_FIRE, per_fire
    assert per_fire["statements"] <= MAX_STATEMENTS_PER_FIRE, per_fire
    assert per_fire["rows"] <= MAX_ROWS_PER_FIRE, per_fire


@dataclass
class Slow:
    """A command that takes `seconds`; counts how many run at once."""

    seconds: float
    running: int = 0
    most: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1


def test_fires_are_not_claimed_ahead_of_workers_that_cannot_start_them_soon(
    tmp_path: Path,
) -> None:
    """Promise: prefetch holds only what the workers are expected to start within
    PREFETCH_WAIT_MS; commands slower than that are claimed one per free worker, so another
    consumer can take the rest."""
    slow = Slow(0.15)
    commands = builtin_commands()
    commands.register("slow", slow.run)
    db = tmp_path / "vortos.db"
    fires = PREFETCH_AFTER_RUNS + 8
    backlog(db, fires, "slow", commands)
    most_held = [0]
    with open_engine(db, clock=SystemClock(), commands=commands) as engine:
        consumer = engine.consumer(consumer_id="c1", concurrency=8)
        loop = threading.Thread(target=consumer.run, name="vortos-consumer")
        loop.start()
        try:
            deadline = time.monotonic() + 60
            while len(engine.service.runs(RunQuery(state=RunState.COMPLETED, limit=fires))) < fires:
                most_held[0] = max(most_held[0], consumer.busy)
                assert time.monotonic() < deadline, "the slow fires did not all complete"
                time.sleep(0.005)
        finally:
            consumer.stop()
            loop.join(30)
    assert most_held[0] <= 8 + 8 * 100 // 150, most_held  # the workers, and what they start soon

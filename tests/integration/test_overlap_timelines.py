"""Each overlap policy, on a manual clock, with a command that outlives its period.

A schedule fires every minute; every run takes 150 s (the test opens its gate then). Time moves
in 30 s ticks; at each tick finished runs settle, the daemon dispatches, the consumer claims.
The timelines asserted here are the ones documented in the README ("Overlap policies").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine import (
    CommandRegistry,
    Engine,
    FireContext,
    FireQueueConsumer,
    IntervalTrigger,
    ManualClock,
    OverlapPolicy,
    RunState,
    ScheduleSpec,
    builtin_commands,
    open_engine,
)
from engine.ports import RunQuery
from tests.conftest import T0
from tests.helpers import settle

PERIOD_S = 60
RUN_S = 150
TICK_S = 30


@dataclass
class Gates:
    """The held command: it runs until the test opens its gate, or until it is cancelled."""

    clock: ManualClock
    opened: dict[int, threading.Event] = field(default_factory=dict)
    started: dict[int, int] = field(default_factory=dict)  # slot -> clock when it started
    exited: set[int] = field(default_factory=set)  # slots whose command returned or raised
    lock: threading.Lock = field(default_factory=threading.Lock)

    def gate(self, slot_at: int) -> threading.Event:
        with self.lock:
            return self.opened.setdefault(slot_at, threading.Event())

    def hold(self, *, fire: FireContext) -> str:
        with self.lock:
            self.started[fire.slot_at] = self.clock.now_ms()
        gate = self.gate(fire.slot_at)
        try:
            while not gate.wait(0.005):
                fire.check_cancelled()
            return "done"
        finally:
            with self.lock:
                self.exited.add(fire.slot_at)


@dataclass
class Harness:
    engine: Engine
    clock: ManualClock
    gates: Gates
    consumer: FireQueueConsumer

    def slot(self, n: int) -> int:
        return T0 + n * PERIOD_S * 1000

    def runs(self) -> dict[int, RunState]:
        """Slot number -> state of its run."""
        found = self.engine.service.runs(RunQuery(limit=1000))
        return {(r.slot_at - T0) // (PERIOD_S * 1000): r.state for r in found}

    def started(self) -> dict[int, int]:
        """Slot number -> second (since T0) its run started."""
        return {
            (slot - T0) // (PERIOD_S * 1000): (at - T0) // 1000
            for slot, at in self.gates.started.items()
        }

    def play(self, until_s: int) -> None:
        daemon = self.engine.daemon(node_id="n1", lease_ttl_ms=86_400_000)
        settle(daemon)
        for tick in range(0, until_s + 1, TICK_S):
            self.clock.set(T0 + tick * 1000)
            self._finish_due(tick)
            daemon.step()
            self.consumer.step()
            # Every claimed fire's command has started (so its start is read at this tick).
            self._settle_until(lambda: self.consumer.busy == self._still_held())
            self._settle_cancelled()

    def _finish_due(self, now_s: int) -> None:
        """Open the gates of runs that have run RUN_S seconds, and settle them."""
        due = [
            slot
            for slot, at in self.gates.started.items()
            if (at - T0) // 1000 + RUN_S <= now_s and not self.gates.gate(slot).is_set()
        ]
        for slot in due:
            self.gates.gate(slot).set()
        self._settle_until(
            lambda: self.gates.exited.issuperset(due) and self.consumer.busy == self._still_held()
        )

    def _settle_cancelled(self) -> None:
        # A cancel-other request reaches the running command at the consumer's next step.
        self.consumer.step()
        self._settle_until(
            lambda: self.consumer.busy == self._still_held() and not self._cancel_pending()
        )

    def _cancel_pending(self) -> bool:
        """A fire asked to stop whose command has not stopped yet."""
        asked = self.engine.storage.fire_queue.cancel_requested(
            [r.id for r in self.engine.service.runs(RunQuery(state=RunState.RUNNING))]
        )
        return bool(asked)

    def _still_held(self) -> int:
        """Commands still inside `hold`: every other claimed fire must be settled first."""
        with self.gates.lock:
            return len(set(self.gates.started) - self.gates.exited)

    def _settle_until(self, done: object) -> None:
        assert callable(done)
        deadline = time.monotonic() + 5
        while True:
            self.consumer.settle_finished()
            if done():
                return
            if time.monotonic() > deadline:
                raise AssertionError("runs did not finish")
            time.sleep(0.005)


@pytest.fixture
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    policy: OverlapPolicy = request.param
    clock = ManualClock(T0)
    gates = Gates(clock)
    commands: CommandRegistry = builtin_commands()
    commands.register("hold", gates.hold)
    with open_engine(tmp_path / "overlap.db", clock=clock, commands=commands) as engine:
        engine.service.create(
            ScheduleSpec(
                name="slow",
                trigger=IntervalTrigger(PERIOD_S * 1000, T0),
                command="hold",
                overlap=policy,
            ),
            actor="test",
        )
        consumer = engine.consumer(consumer_id="c1", concurrency=4, claim_ttl_ms=3_600_000)
        consumer.start()
        yield Harness(engine, clock, gates, consumer)
        for event in list(gates.opened.values()):
            event.set()
        consumer.close()


def by_policy(policy: OverlapPolicy) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("harness", [policy], indirect=True)


@by_policy(OverlapPolicy.SKIP)
def test_skip_drops_every_slot_that_comes_while_a_run_is_running(harness: Harness) -> None:
    harness.play(until_s=330)
    assert harness.started() == {0: 0, 3: 180}
    assert harness.runs() == {
        0: RunState.COMPLETED,
        1: RunState.SKIPPED,
        2: RunState.SKIPPED,
        3: RunState.COMPLETED,
        4: RunState.SKIPPED,
        5: RunState.SKIPPED,
    }


@by_policy(OverlapPolicy.BUFFER_ONE)
def test_buffer_one_keeps_the_first_waiting_slot_and_skips_the_others(harness: Harness) -> None:
    harness.play(until_s=330)
    assert harness.started() == {0: 0, 1: 150, 3: 300}
    assert harness.runs() == {
        0: RunState.COMPLETED,
        1: RunState.COMPLETED,
        2: RunState.SKIPPED,
        3: RunState.RUNNING,
        4: RunState.SKIPPED,
        5: RunState.DISPATCHED,  # waiting behind slot 3
    }


@by_policy(OverlapPolicy.BUFFER_ALL)
def test_buffer_all_runs_every_slot_one_after_another(harness: Harness) -> None:
    harness.play(until_s=600)
    assert harness.started() == {0: 0, 1: 150, 2: 300, 3: 450, 4: 600}
    states = harness.runs()
    assert [states[n] for n in range(4)] == [RunState.COMPLETED] * 4
    assert states[4] is RunState.RUNNING
    assert all(states[n] is RunState.DISPATCHED for n in range(5, 11))
    assert RunState.SKIPPED not in states.values()


@by_policy(OverlapPolicy.ALLOW)
def test_allow_starts_every_slot_on_time_beside_the_running_ones(harness: Harness) -> None:
    harness.play(until_s=330)
    assert harness.started() == {n: n * PERIOD_S for n in range(6)}
    states = harness.runs()
    assert [states[n] for n in range(4)] == [RunState.COMPLETED] * 4  # each after 150 s
    assert [states[n] for n in range(4, 6)] == [RunState.RUNNING] * 2


@by_policy(OverlapPolicy.CANCEL_OTHER)
def test_cancel_other_starts_each_slot_and_stops_the_one_before(harness: Harness) -> None:
    harness.play(until_s=330)
    assert harness.started() == {n: n * PERIOD_S for n in range(6)}
    states = harness.runs()
    assert [states[n] for n in range(5)] == [RunState.CANCELLED] * 5
    assert states[5] is RunState.RUNNING
    run = harness.engine.service.runs(RunQuery(state=RunState.CANCELLED, limit=1))[0]
    assert run.error is not None
    assert "cancel-other" in run.error

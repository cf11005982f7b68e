"""The dispatch circuit breaker with the database really locked: another connection (another
process, in the second test) holds the write lock longer than the daemon's busy timeout."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from engine import (
    Engine,
    IntervalTrigger,
    ManualClock,
    MisfireKind,
    MisfirePolicy,
    SchedulerDaemon,
    ScheduleSpec,
    open_engine,
)
from engine.domain.timeutil import SECOND_MS, iso_local, parse_instant
from engine.observability import PrometheusMetrics
from engine.runtime.breaker import BreakerState
from tests.conftest import T0
from tests.helpers import fired_slots, settle
from tests.integration.processes import wait_for

BUSY_TIMEOUT_MS = 50
EVERY = 10  # seconds
POLICIES = {
    "catch-up": MisfirePolicy(MisfireKind.EACH, grace_ms=SECOND_MS),
    "latest": MisfirePolicy(MisfireKind.LATEST, grace_ms=SECOND_MS),
    "skip": MisfirePolicy(MisfireKind.SKIP, grace_ms=SECOND_MS),
}


@pytest.fixture
def engine(db_path: Path, clock: ManualClock) -> Iterator[Engine]:
    with open_engine(db_path, clock=clock, busy_timeout_ms=BUSY_TIMEOUT_MS) as opened:
        yield opened


@pytest.fixture
def metrics() -> PrometheusMetrics:
    return PrometheusMetrics()


class WriteLock:
    """A connection holding the database's write lock (BEGIN IMMEDIATE) until released."""

    def __init__(self, db: Path) -> None:
        self._conn = apsw.Connection(str(db))
        self._conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self._conn.execute("ROLLBACK")
        self._conn.close()


def value(metrics: PrometheusMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def state_of(daemon: SchedulerDaemon) -> BreakerState:
    """The breaker's state (a call, so type narrowing does not stick between reads)."""
    return daemon.breaker_state


def slots_every(seconds: int, start_ms: int, end_ms: int) -> list[str]:
    step = seconds * SECOND_MS
    return [iso_local(at, "UTC") for at in range(start_ms, end_ms + 1, step)]


def test_the_breaker_opens_after_n_failures_and_every_missed_slot_fires_once_per_policy(
    engine: Engine, clock: ManualClock, db_path: Path, metrics: PrometheusMetrics
) -> None:
    for name, policy in POLICIES.items():
        spec = ScheduleSpec(
            name=name,
            trigger=IntervalTrigger(EVERY * SECOND_MS, T0),
            command="noop",
            misfire=policy,
        )
        engine.service.create(spec, actor="t")
    daemon = engine.daemon(
        node_id="n1",
        lease_ttl_ms=600_000,  # the lease outlives the outage: only the breaker is at work
        observer=metrics,
        breaker_failures=3,
        breaker_recovery_ms=30_000,
    )
    settle(daemon)  # T0 fires on time
    cursors = {n: engine.service.get(n).next_slot_at for n in POLICIES}
    lock = WriteLock(db_path)
    try:
        for failure in range(1, 4):
            clock.advance(EVERY)
            started = time.monotonic()
            assert daemon.step() > 0  # no exception: the daemon carries on
            assert time.monotonic() - started >= BUSY_TIMEOUT_MS / 1000  # it really tried
            assert daemon.breaker.consecutive_failures == failure
        assert state_of(daemon) is BreakerState.OPEN
        failures = value(metrics, "vortos_dispatch_failures_total", error="storage")
        assert failures == 3
        # Open: nothing is attempted, so nothing fails and nothing is written.
        for _ in range(2):
            clock.advance(EVERY)
            daemon.step()
        assert value(metrics, "vortos_dispatch_failures_total", error="storage") == failures
        assert {n: engine.service.get(n).next_slot_at for n in POLICIES} == cursors
        held = value(
            metrics, "vortos_fires_total", result="circuit_open", schedule="skip", tenant="default"
        )
        assert held == 1
    finally:
        lock.release()
    clock.advance(EVERY)  # T0 + 60 s: the window has passed
    settle(daemon)
    assert state_of(daemon) is BreakerState.CLOSED
    now = clock.now_ms()
    assert now == T0 + 6 * EVERY * SECOND_MS
    assert fired_slots(engine, "catch-up") == slots_every(EVERY, T0, now)
    assert fired_slots(engine, "latest") == slots_every(EVERY, T0, T0) + slots_every(
        EVERY, now, now
    )
    assert fired_slots(engine, "skip") == slots_every(EVERY, T0, T0) + slots_every(
        EVERY, now, now
    )  # the slot due now is on time; the five missed are skipped
    # Exactly once: one run per slot key.
    for name in POLICIES:
        slots = fired_slots(engine, name)
        assert len(slots) == len(set(slots))
    transitions = "vortos_breaker_transitions_total"
    for state in ("open", "half_open", "closed"):
        assert value(metrics, transitions, breaker="dispatch", state=state) == 1
    assert value(metrics, "vortos_breaker_state", breaker="dispatch") == 0
    skipped = {"policy": "skip", "action": "skipped", "schedule": "skip", "tenant": "default"}
    assert value(metrics, "vortos_misfires_total", **skipped) == 5


LOCKER = """
import sys, apsw
conn = apsw.Connection(sys.argv[1])
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


def test_the_daemon_loop_survives_another_process_locking_the_database(
    db_path: Path, tmp_path: Path
) -> None:
    metrics = PrometheusMetrics()
    with open_engine(db_path, busy_timeout_ms=100) as engine:
        now = engine.clock.now_ms() // 1000 * 1000
        spec = ScheduleSpec(
            name="tick",
            trigger=IntervalTrigger(SECOND_MS, now),
            command="noop",
            misfire=MisfirePolicy(MisfireKind.EACH, grace_ms=0),
        )
        engine.service.create(spec, actor="t")
        daemon = engine.daemon(
            node_id="n1",
            lease_ttl_ms=60_000,
            observer=metrics,
            breaker_failures=2,
            breaker_recovery_ms=1_000,
        )
        loop = threading.Thread(target=daemon.run, name="daemon-under-test")
        loop.start()
        locker: subprocess.Popen[str] | None = None
        try:
            wait_for(lambda: len(fired_slots(engine, "tick")) >= 2, 10, "the first fires")
            locker = subprocess.Popen(
                [sys.executable, "-c", LOCKER, str(db_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert locker.stdout is not None
            assert locker.stdout.readline().strip() == "locked"
            wait_for(lambda: state_of(daemon) is BreakerState.OPEN, 10, "the breaker to open")
            opened_at = time.monotonic()
            wait_for(lambda: time.monotonic() - opened_at > 1.5, 5, "slots to be missed")
            assert loop.is_alive()
            locker.communicate("\n", timeout=10)
            locker = None
            wait_for(lambda: state_of(daemon) is BreakerState.CLOSED, 10, "the breaker to close")
            after = len(fired_slots(engine, "tick"))
            wait_for(lambda: len(fired_slots(engine, "tick")) >= after + 2, 10, "fires again")
        finally:
            if locker is not None:
                locker.kill()
                locker.wait(10)
            daemon.stop()
            loop.join(20)
        assert not loop.is_alive()
        slots = fired_slots(engine, "tick")
        # Catch-up: every slot from the first to the last, each exactly once, none skipped.
        assert slots == slots_every(1, parse_instant(slots[0]), parse_instant(slots[-1]))
    assert value(metrics, "vortos_breaker_transitions_total", breaker="dispatch", state="open") >= 1
    assert value(metrics, "vortos_dispatch_failures_total", error="storage") >= 2

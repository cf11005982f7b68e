"""Plug-ins inside one process: the enqueuer's hand-over, the audit shipper's positions, the
guard around secondary plug-ins, and a plug-in lease mirrored into the fenced row."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from engine import (
    Engine,
    FireQueueConsumer,
    IntervalTrigger,
    LeaseNotOwned,
    ManualClock,
    RetryPolicy,
    RunState,
    ScheduleSpec,
    builtin_commands,
    open_engine,
)
from engine.backends.mirrored_lease import MirroredLease
from engine.backends.sqlite import SqliteBackend
from engine.domain.audit import AuditEntry
from engine.domain.timeutil import MINUTE_MS
from engine.observability.observer import Observer
from engine.ports import RunQuery
from engine.ports.fire_queue import Fire
from engine.ports.lease import LEADER_LEASE
from engine.runtime.audit_shipper import AuditShipper, ShippedSink
from engine.runtime.isolation import ERROR, TIMEOUT, Guard, IsolatedObserver
from engine.runtime.plugin_health import HealthReporter
from tests.conftest import T0


def drive(consumer: FireQueueConsumer, until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        consumer.step()
        consumer.drain(0.05)


def a_fire(engine: Engine, name: str = "job", command: str = "remote.job", **extra: object) -> None:
    """A manual fire of `command`, created by a process that knows it (`engine` need not)."""
    commands = builtin_commands()
    commands.register("remote.job", lambda **_: None)
    with open_engine(
        engine.storage.describe()["path"], clock=engine.clock, commands=commands
    ) as producer:
        _create_and_trigger(producer, name, command, **extra)


def _create_and_trigger(engine: Engine, name: str, command: str, **extra: object) -> None:
    spec = ScheduleSpec(
        name=name,
        trigger=IntervalTrigger(MINUTE_MS, T0),
        command=command,
        **extra,  # type: ignore[arg-type]
    )
    engine.service.create(spec, actor="t")
    engine.service.pause(name, actor="t")
    engine.service.trigger(name, actor="t")


def only_run(engine: Engine) -> tuple[RunState, int, str | None]:
    (run,) = engine.service.runs(RunQuery())
    return run.state, run.attempts, run.output


class Broker:
    """An enqueuer that keeps what it was given, or refuses while `down`."""

    def __init__(self) -> None:
        self.sent: list[Fire] = []
        self.down = False
        self.closed = False

    def enqueue(self, fire: Fire) -> None:
        if self.down:
            raise ConnectionError("broker unreachable")
        self.sent.append(fire)

    def close(self) -> None:
        self.closed = True


# -- the enqueuer ------------------------------------------------------------------------------


def test_an_enqueuer_gets_fires_of_commands_this_process_does_not_know(engine: Engine) -> None:
    a_fire(engine, payload={"to": "ops"})
    broker = Broker()
    consumer = engine.consumer(consumer_id="c1", concurrency=1, enqueuer=broker)

    drive(consumer, lambda: only_run(engine)[0] is RunState.COMPLETED, "the hand-over")

    (fire,) = broker.sent
    assert (fire.command, fire.payload) == ("remote.job", {"to": "ops"})
    assert "handed to enqueuer Broker" in (only_run(engine)[2] or "")


def test_a_refusing_enqueuer_is_retried_then_dead_lettered(
    engine: Engine, clock: ManualClock
) -> None:
    a_fire(engine, retry=RetryPolicy(max_attempts=2, backoff_ms=1_000))
    broker = Broker()
    broker.down = True
    consumer = engine.consumer(consumer_id="c1", concurrency=1, enqueuer=broker)

    drive(consumer, lambda: only_run(engine)[1] == 1 and consumer.busy == 0, "attempt 1")
    assert only_run(engine)[0] is RunState.DISPATCHED  # waiting for its retry
    clock.advance(2)
    drive(consumer, lambda: only_run(engine)[0] is RunState.DEAD_LETTERED, "the dead letter")

    (run,) = engine.service.runs(RunQuery())
    assert "the enqueuer refused it: ConnectionError: broker unreachable" in (run.error or "")
    assert broker.sent == []


# -- the audit shipper -------------------------------------------------------------------------


class Copy:
    """A sink that keeps its copy in memory; raises while `down`, blocks while `stuck`."""

    def __init__(self) -> None:
        self.entries: list[AuditEntry] = []
        self.down = False
        self.stuck = threading.Event()
        self.release = threading.Event()

    def deliver(self, entries: Sequence[AuditEntry]) -> None:
        if self.stuck.is_set():
            self.release.wait(10)
        if self.down:
            raise OSError("SIEM unreachable")
        self.entries.extend(entries)

    def close(self) -> None:
        return None


def shipper(engine: Engine, copy: Copy, guard: Guard) -> tuple[AuditShipper, ShippedSink]:
    shipped = ShippedSink("siem", copy, guard)
    return AuditShipper(engine.storage, engine.clock, [shipped], lambda: True), shipped


def entries_by_chain(engine: Engine) -> dict[str, list[int]]:
    audit = engine.storage.audit
    return {chain: [e.seq for e in audit.entries(chain)] for chain in audit.chains()}


def copied_by_chain(copy: Copy) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for entry in copy.entries:
        found.setdefault(entry.chain, []).append(entry.seq)
    return found


def test_the_shipper_copies_every_chain_in_order_and_stores_its_position(
    engine: Engine, clock: ManualClock
) -> None:
    a_fire(engine)
    copy = Copy()
    ship, shipped = shipper(engine, copy, Guard("audit_sinks", "siem", clock, 1_000))

    assert ship.ship_once(shipped) > 0

    assert copied_by_chain(copy) == entries_by_chain(engine)
    positions = engine.storage.plugin_state.sink_positions("siem")
    assert positions == {c: seqs[-1] for c, seqs in entries_by_chain(engine).items()}
    assert ship.ship_once(shipped) == 0, "nothing is delivered twice once the position is stored"


def test_a_failing_sink_keeps_its_position_and_resumes_without_a_gap(
    engine: Engine, clock: ManualClock
) -> None:
    a_fire(engine)
    copy = Copy()
    guard = Guard("audit_sinks", "siem", clock, 1_000)
    ship, shipped = shipper(engine, copy, guard)
    copy.down = True

    assert ship.ship_once(shipped) == -1
    assert engine.storage.plugin_state.sink_positions("siem") == {}
    assert (guard.failures, guard.last_error) == (1, "OSError: SIEM unreachable")
    assert shipped.backlog > 0

    a_fire(engine, "second")  # more entries while the sink is down
    copy.down = False
    while ship.ship_once(shipped) > 0:
        pass

    assert copied_by_chain(copy) == entries_by_chain(engine)
    assert shipped.backlog == 0


def test_a_new_shipper_resumes_where_the_stored_position_ends(
    engine: Engine, clock: ManualClock
) -> None:
    a_fire(engine)
    first = Copy()
    ship, shipped = shipper(engine, first, Guard("audit_sinks", "siem", clock, 1_000))
    ship.ship_once(shipped)
    a_fire(engine, "second")

    resumed = Copy()  # a new leader's shipper, after a failover
    ship, shipped = shipper(engine, resumed, Guard("audit_sinks", "siem", clock, 1_000))
    ship.ship_once(shipped)

    assert first.entries, "the first shipper delivered something"
    whole = entries_by_chain(engine)
    for chain, seqs in copied_by_chain(resumed).items():
        before = copied_by_chain(first).get(chain, [])
        assert before + seqs == whole[chain], f"{chain}: resumed right after the position"


def test_a_shipper_does_not_ship_while_its_node_does_not_lead(
    engine: Engine, clock: ManualClock
) -> None:
    a_fire(engine)
    copy = Copy()
    shipped = ShippedSink("siem", copy, Guard("audit_sinks", "siem", clock, 1_000))
    leading = threading.Event()
    ship = AuditShipper(engine.storage, clock, [shipped], leading.is_set, idle_s=0.01).start()
    try:
        time.sleep(0.1)  # several rounds of not leading
        assert copy.entries == []
        leading.set()
        deadline = time.monotonic() + 5
        while copied_by_chain(copy) != entries_by_chain(engine):
            assert time.monotonic() < deadline, "the leader did not ship"
            time.sleep(0.01)
    finally:
        ship.stop(1)


# -- the guard and the health report -----------------------------------------------------------


def test_a_hung_call_is_counted_once_and_reported_busy(engine: Engine, clock: ManualClock) -> None:
    failures: list[tuple[str, str, str]] = []
    guard = Guard("audit_sinks", "siem", clock, 100, lambda *f: failures.append(f))
    release = threading.Event()
    worker = threading.Thread(target=guard.call, args=(release.wait, 10))
    worker.start()
    reporter = HealthReporter(engine.storage, "node-a", [(guard, lambda: 7)])
    try:
        deadline = time.monotonic() + 5
        while guard.timeouts == 0:
            assert time.monotonic() < deadline, "the hang was never counted"
            reporter.reports()  # what the reporter does every few seconds
            time.sleep(0.02)
        reporter.reports()
        reporter.report()
    finally:
        release.set()
        worker.join()
    assert guard.timeouts == 1, "one hung call is one timeout, however often it is checked"
    assert failures == [("audit_sinks", "siem", TIMEOUT)]
    (stored,) = engine.storage.plugin_state.health(0)
    assert (stored.node_id, stored.timeouts, stored.backlog) == ("node-a", 1, 7)
    assert stored.busy_since == clock.now_ms()
    assert guard.calls == 1  # it returned in the end


class Exploding(Observer):
    def dispatched(self, report: object, facts: object) -> None:
        raise RuntimeError("statsd down")


class Hanging(Observer):
    def __init__(self) -> None:
        self.release = threading.Event()

    def tick(self, seconds: float) -> None:
        self.release.wait(10)


def test_a_raising_metrics_plugin_is_counted_and_never_raises_into_the_runtime(
    clock: ManualClock,
) -> None:
    failures: list[tuple[str, str, str]] = []
    guard = Guard("metrics", "statsd", clock, 1_000, lambda *f: failures.append(f))
    observer = IsolatedObserver(Exploding(), guard)

    observer.dispatched(object(), object())
    observer.close(5)

    assert failures == [("metrics", "statsd", ERROR)]
    assert guard.last_error == "RuntimeError: statsd down"


def test_a_hanging_metrics_plugin_never_blocks_a_hook(clock: ManualClock) -> None:
    plugin = Hanging()
    guard = Guard("metrics", "statsd", clock, 1_000)
    observer = IsolatedObserver(plugin, guard)
    try:
        started = time.perf_counter()
        for _ in range(20_000):  # more than the queue holds
            observer.tick(0.001)
        took = time.perf_counter() - started
    finally:
        plugin.release.set()
        observer.close(5)
    assert took < 2, "hooks return at once while the plug-in hangs"
    assert guard.dropped > 0, "what the queue cannot hold is dropped and counted"


# -- a plug-in lease, mirrored -----------------------------------------------------------------


class DictLease:
    """A minimal in-memory lease: never expires, enough to watch the mirroring."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.held: dict[str, object] = {}

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> object:
        from engine.ports.lease import Lease  # noqa: PLC0415

        if key in self.held and self.held[key].token != token:  # type: ignore[attr-defined]
            return None
        now = self.clock.now_ms()
        self.held[key] = Lease(key, token, holder, now, now, now + ttl_ms)
        return self.held[key]

    def renew(self, key: str, token: str, ttl_ms: int) -> object:
        return self.acquire(key, token, "again", ttl_ms)

    def release(self, key: str, token: str) -> None:
        self.held.pop(key, None)

    def current(self, key: str) -> object:
        return self.held.get(key)


def test_a_plugin_lease_is_mirrored_into_the_row_and_a_deposed_holder_cannot_renew(
    tmp_path: Path, clock: ManualClock
) -> None:
    storage = SqliteBackend(tmp_path / "v.db", clock)
    try:
        driver = DictLease(clock)
        lease = MirroredLease(driver, storage.leases)  # type: ignore[arg-type]
        held = lease.acquire(LEADER_LEASE, "t1", "node-a", 10_000)
        assert held is not None
        assert storage.leases.current(LEADER_LEASE) == held, "the row names the plug-in's holder"

        storage.leases.mirror(
            type(held)(
                LEADER_LEASE, "t2", "node-b", held.acquired_at, held.renewed_at, held.expires_at
            )
        )
        with pytest.raises(LeaseNotOwned):
            lease.renew(LEADER_LEASE, "t1", 10_000)
        assert driver.current(LEADER_LEASE) is None, "a holder the row no longer names gives up"

        lease.release(LEADER_LEASE, "t1")
        assert storage.leases.current(LEADER_LEASE) is not None, "another holder's row stays"
    finally:
        storage.close()

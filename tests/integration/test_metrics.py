"""Every metric family is emitted where its event happens: the real daemon and consumer on a
manual clock and a real database, read back from the metrics' own registry."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine import (
    CommandRegistry,
    Engine,
    FireQueueConsumer,
    IntervalTrigger,
    ManualClock,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    ScheduleSpec,
    builtin_commands,
    open_engine,
    open_read_model,
)
from engine.domain.timeutil import MINUTE_MS, SECOND_MS
from engine.observability import (
    OVERFLOW,
    DeadmanVerdict,
    Observers,
    PrometheusMetrics,
    PruneTrigger,
    ScheduleVerdict,
    StoreGauges,
)
from engine.retention import SWEEP_SCHEDULE, SWEEP_TENANT, retention_schedule
from tests.conftest import T0
from tests.helpers import settle
from vortos_tui.cli.workers import Telemetry


@pytest.fixture
def metrics() -> PrometheusMetrics:
    return PrometheusMetrics()


class Commands:
    """Commands whose behaviour the test switches."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.release.set()

    def ok(self) -> str:
        return "ok"

    def fails(self) -> None:
        raise RuntimeError("planned failure")

    def waits(self) -> str:
        self.release.wait(10)
        return "waited"


@pytest.fixture
def commands() -> Commands:
    return Commands()


@pytest.fixture
def engine(db_path: Path, clock: ManualClock, commands: Commands) -> Iterator[Engine]:
    registry: CommandRegistry = builtin_commands()
    registry.register("ok", commands.ok)
    registry.register("fails", commands.fails)
    registry.register("waits", commands.waits)
    with open_engine(db_path, clock=clock, commands=registry) as opened:
        yield opened


def value(metrics: PrometheusMetrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def every(seconds: int, name: str, command: str = "ok", **extra: object) -> ScheduleSpec:
    return ScheduleSpec(
        name=name,
        trigger=IntervalTrigger(seconds * SECOND_MS, T0),
        command=command,
        **extra,  # type: ignore[arg-type]
    )


def drive(consumer: FireQueueConsumer, until: Callable[[], bool], what: str) -> None:
    """Step the consumer (real time, the clock still) until `until` holds."""
    deadline = time.monotonic() + 10
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        consumer.step()
        time.sleep(0.002)


# -- the daemon -----------------------------------------------------------------------------


def test_each_dispatched_fire_counts_by_schedule_and_its_lateness_is_observed(
    engine: Engine, clock: ManualClock, metrics: PrometheusMetrics
) -> None:
    engine.service.create(every(60, "a"), actor="t")
    engine.service.create(every(60, "b", tenant="acme"), actor="t")
    daemon = engine.daemon(node_id="n1", observer=metrics)
    settle(daemon)
    clock.advance(62)  # the 00:01 slots are 2 s late
    settle(daemon)
    fires = "vortos_fires_total"
    assert value(metrics, fires, result="dispatched", schedule="a", tenant="default") == 2
    assert value(metrics, fires, result="dispatched", schedule="b", tenant="acme") == 2
    lateness = "vortos_dispatch_lateness_seconds"
    assert value(metrics, f"{lateness}_count", tenant="default") == 2
    assert value(metrics, f"{lateness}_bucket", tenant="default", le="1.0") == 1
    assert value(metrics, f"{lateness}_bucket", tenant="default", le="2.5") == 2
    assert value(metrics, "vortos_tick_duration_seconds_count") >= 4


@pytest.mark.parametrize(
    ("policy", "fired", "skipped"),
    [(MisfireKind.SKIP, 0, 5), (MisfireKind.LATEST, 1, 4), (MisfireKind.EACH, 5, 0)],
)
def test_missed_slots_count_as_misfires_by_policy_and_what_it_did_with_them(
    engine: Engine,
    clock: ManualClock,
    metrics: PrometheusMetrics,
    policy: MisfireKind,
    fired: int,
    skipped: int,
) -> None:
    grace = MisfirePolicy(policy, grace_ms=10 * SECOND_MS)
    engine.service.create(every(60, "late", misfire=grace), actor="t")
    daemon = engine.daemon(node_id="n1", lease_ttl_ms=600_000, observer=metrics)
    settle(daemon)  # 00:00, on time
    clock.set(T0 + 5 * MINUTE_MS + 30 * SECOND_MS)  # 00:01 .. 00:05 missed their grace
    settle(daemon)
    labels = {"policy": policy.value, "schedule": "late", "tenant": "default"}
    assert value(metrics, "vortos_misfires_total", action="fired", **labels) == fired
    assert value(metrics, "vortos_misfires_total", action="skipped", **labels) == skipped


def test_slots_older_than_the_catch_up_age_count_as_dropped(
    engine: Engine, clock: ManualClock, metrics: PrometheusMetrics
) -> None:
    aged = MisfirePolicy(MisfireKind.EACH, max_age_ms=3 * MINUTE_MS, grace_ms=SECOND_MS)
    engine.service.create(every(60, "aged", misfire=aged), actor="t")
    daemon = engine.daemon(node_id="n1", lease_ttl_ms=600_000, observer=metrics)
    settle(daemon)
    clock.set(T0 + 10 * MINUTE_MS)  # 00:01 .. 00:06 are older than 3 minutes
    settle(daemon)
    dropped = {"result": "dropped_catchup_age", "schedule": "aged", "tenant": "default"}
    assert value(metrics, "vortos_fires_total", **dropped) == 6


def test_a_slot_held_back_by_its_jitter_counts_as_deferred(
    engine: Engine, clock: ManualClock, metrics: PrometheusMetrics
) -> None:
    engine.service.create(every(3600, "spread", jitter_ms=600 * SECOND_MS), actor="t")
    daemon = engine.daemon(node_id="n1", observer=metrics)
    for hour in range(1, 4):  # each slot is due within 10 minutes after its hour
        clock.set(T0 + hour * 3600 * SECOND_MS + 600 * SECOND_MS)
        settle(daemon)
    labels = {"schedule": "spread", "tenant": "default"}
    dispatched = value(metrics, "vortos_fires_total", result="dispatched", **labels)
    assert dispatched >= 3
    assert value(metrics, "vortos_fires_total", result="deferred_jitter", **labels) == dispatched


def test_a_slot_the_ledger_already_holds_counts_as_already_dispatched(
    engine: Engine, clock: ManualClock, metrics: PrometheusMetrics
) -> None:
    catch_up = MisfirePolicy(MisfireKind.EACH, grace_ms=SECOND_MS)
    engine.service.create(every(60, "twice", misfire=catch_up), actor="t")
    clock.set(T0 + 3 * MINUTE_MS + SECOND_MS)
    # A backfill takes the slots' own keys before the daemon gets to them.
    engine.service.backfill("twice", start_ms=T0, end_ms=T0 + 2 * MINUTE_MS, actor="t")
    daemon = engine.daemon(node_id="n1", observer=metrics)
    settle(daemon)
    labels = {"schedule": "twice", "tenant": "default"}
    assert value(metrics, "vortos_fires_total", result="already_dispatched", **labels) == 2
    assert value(metrics, "vortos_fires_total", result="dispatched", **labels) == 2


def test_taking_losing_and_releasing_the_lease_are_counted_and_contention_too(
    engine: Engine, clock: ManualClock, metrics: PrometheusMetrics
) -> None:
    other = PrometheusMetrics()
    first = engine.daemon(node_id="n1", lease_ttl_ms=10_000, observer=metrics)
    second = engine.daemon(node_id="n2", lease_ttl_ms=10_000, observer=other)
    first.step()
    second.step()  # n1 holds it
    lease = {"lease": "scheduler:leader"}
    assert value(metrics, "vortos_leader", **lease) == 1
    assert value(other, "vortos_lease_contention_total", **lease) == 1
    clock.advance(11)  # n1 never renewed: n2 takes over, n1 finds out at its renewal
    second.step()
    first.step()
    assert value(other, "vortos_leader_changes_total", change="acquired", **lease) == 1
    assert value(metrics, "vortos_leader_changes_total", change="lost", **lease) == 1
    assert value(metrics, "vortos_leader", **lease) == 0
    second.release()
    assert value(other, "vortos_leader_changes_total", change="released", **lease) == 1
    assert value(other, "vortos_leader", **lease) == 0


def test_a_lease_change_that_cannot_be_audited_is_counted(
    db_path: Path, clock: ManualClock, metrics: PrometheusMetrics
) -> None:
    with open_engine(db_path, clock=clock) as engine:
        # The chain has an entry, and the key file exists.
        engine.service.create(every(60, "a", command="noop"), actor="t")
    for key in db_path.parent.glob("*.audit-key"):
        key.unlink()  # the key went missing: appends are refused
    with open_engine(db_path, clock=clock) as engine:
        daemon = engine.daemon(node_id="n1", observer=metrics)
        daemon.step()
        assert daemon.leading  # the lease change stands
    failures = "vortos_audit_append_failures_total"
    assert value(metrics, failures, event="leader.acquired") == 1


# -- the consumer ---------------------------------------------------------------------------


def test_runs_count_by_outcome_with_their_duration_retries_and_dead_letters(
    engine: Engine, metrics: PrometheusMetrics
) -> None:
    engine.service.create(every(60, "good"), actor="t")
    once = RetryPolicy(max_attempts=2, backoff_ms=0)
    engine.service.create(every(60, "bad", command="fails", retry=once), actor="t")
    daemon = engine.daemon(node_id="n1", observer=metrics)
    settle(daemon)
    consumer = engine.consumer(consumer_id="c1", observer=metrics)
    runs = "vortos_runs_total"
    drive(
        consumer,
        lambda: (
            value(metrics, runs, outcome="dead_lettered", schedule="bad", tenant="default") == 1
        ),
        "the dead letter",
    )
    drive(consumer, lambda: consumer.busy == 0, "the rest")
    assert value(metrics, runs, outcome="completed", schedule="good", tenant="default") == 1
    assert value(metrics, "vortos_retries_total", schedule="bad", tenant="default") == 1
    dead = {"reason": "retries_exhausted", "schedule": "bad", "tenant": "default"}
    assert value(metrics, "vortos_dead_letters_total", **dead) == 1
    duration = "vortos_run_duration_seconds_count"
    assert value(metrics, duration, schedule="good", tenant="default") == 1
    assert value(metrics, duration, schedule="bad", tenant="default") == 2  # both attempts


def test_a_fire_skipped_for_overlap_counts_as_a_fire_result_and_a_skipped_run(
    engine: Engine, clock: ManualClock, metrics: PrometheusMetrics, commands: Commands
) -> None:
    commands.release.clear()
    engine.service.create(every(60, "busy", command="waits"), actor="t")  # overlap skip
    daemon = engine.daemon(node_id="n1", observer=metrics)
    settle(daemon)
    consumer = engine.consumer(consumer_id="c1", concurrency=2, observer=metrics)
    consumer.step()
    assert consumer.busy == 1  # 00:00 runs and waits
    clock.advance(60)
    settle(daemon)
    consumer.step()  # 00:01 is skipped: 00:00 still runs
    commands.release.set()
    drive(consumer, lambda: consumer.busy == 0, "the run")
    labels = {"schedule": "busy", "tenant": "default"}
    assert value(metrics, "vortos_fires_total", result="skipped_overlap", **labels) == 1
    assert value(metrics, "vortos_runs_total", outcome="skipped", **labels) == 1
    assert value(metrics, "vortos_runs_total", outcome="completed", **labels) == 1


def test_a_takeover_counts_an_abandoned_claim_and_the_late_settle_a_stale_one(
    engine: Engine, clock: ManualClock, metrics: PrometheusMetrics, commands: Commands
) -> None:
    commands.release.clear()
    engine.service.create(
        every(60, "slow", command="waits", overlap=OverlapPolicy.ALLOW), actor="t"
    )
    engine.service.pause("slow", actor="t")
    engine.service.trigger("slow", actor="t")
    first = engine.consumer(consumer_id="first", claim_ttl_ms=5_000, observer=metrics)
    first.step()
    assert first.busy == 1
    clock.advance(6)  # the first claim runs out unrenewed
    other = PrometheusMetrics()
    second = engine.consumer(consumer_id="second", claim_ttl_ms=60_000, observer=other)
    second.step()
    assert value(other, "vortos_abandoned_claims_total") == 1
    commands.release.set()
    drive(first, lambda: first.busy == 0, "the first consumer's late settlement")
    assert value(metrics, "vortos_stale_settles_total") == 1
    drive(second, lambda: second.busy == 0, "the second consumer's settlement")
    assert value(other, "vortos_stale_settles_total") == 0
    assert value(other, "vortos_abandoned_claims_total") == 1  # its own settle is no takeover


def test_a_fire_abandoned_too_often_is_dead_lettered_for_that_reason(
    engine: Engine, clock: ManualClock, metrics: PrometheusMetrics
) -> None:
    engine.service.create(every(60, "lost", retry=RetryPolicy(max_attempts=1)), actor="t")
    engine.service.pause("lost", actor="t")
    engine.service.trigger("lost", actor="t")
    for n in range(2):  # two consumers die holding it: more than consumer_deaths=1
        gone = engine.storage.fire_queue.claim(consumer=f"gone{n}", ttl_ms=5_000, limit=1)
        assert len(gone.fires) == 1
        clock.advance(6)
    consumer = engine.consumer(consumer_id="c1", observer=metrics, consumer_deaths=1)
    consumer.step()
    dead = {"reason": "abandoned", "schedule": "lost", "tenant": "default"}
    assert value(metrics, "vortos_dead_letters_total", **dead) == 1
    assert value(metrics, "vortos_abandoned_claims_total") == 1
    deaths = {"schedule": "lost", "tenant": "default"}
    assert value(metrics, "vortos_consumer_deaths_total", **deaths) == 1
    assert (
        value(metrics, "vortos_run_duration_seconds_count", schedule="lost", tenant="default") == 0
    )


# -- fed by other parts: retention and the dead-man detector ---------------------------------


def test_a_sweep_run_by_a_consumer_reports_its_prunes_through_the_cli_telemetry(
    engine: Engine, clock: ManualClock, db_path: Path, metrics: PrometheusMetrics
) -> None:
    engine.service.sync_static([retention_schedule()], actor="deploy")
    engine.service.create(every(60, "old", tenant="acme"), actor="t")
    engine.service.pause("old", tenant="acme", actor="t")
    for _ in range(3):
        engine.service.trigger("old", tenant="acme", actor="t")
    consumer = engine.consumer(consumer_id="c1", observer=metrics)
    completed = {"outcome": "completed", "schedule": "old", "tenant": "acme"}
    drive(consumer, lambda: value(metrics, "vortos_runs_total", **completed) == 3, "old runs")
    clock.advance(31 * 24 * 3600)  # past the default 30 days
    Telemetry(observer=metrics).watch(engine, db_path)  # what vortos run and consume do
    engine.service.trigger(SWEEP_SCHEDULE, tenant=SWEEP_TENANT, actor="ops")
    swept = {"trigger": "scheduled"}
    drive(
        consumer,
        lambda: value(metrics, "vortos_prune_duration_seconds_count", **swept) == 1,
        "the sweep",
    )
    assert value(metrics, "vortos_runs_pruned_total", tenant="acme") == 3


def test_prunes_are_counted_per_tenant_and_timed_per_trigger(metrics: PrometheusMetrics) -> None:
    metrics.runs_pruned("acme", 5000)
    metrics.runs_pruned("acme", 120)
    metrics.runs_pruned("default", 0)
    metrics.prune_finished(2.5, PruneTrigger.SCHEDULED)
    assert value(metrics, "vortos_runs_pruned_total", tenant="acme") == 5120
    assert (
        metrics.registry.get_sample_value("vortos_runs_pruned_total", {"tenant": "default"}) is None
    )
    count = "vortos_prune_duration_seconds_count"
    assert value(metrics, count, trigger="scheduled") == 1
    assert value(metrics, count, trigger="manual") == 0


def test_dead_man_verdicts_are_one_hot_per_schedule_and_replace_the_previous_set(
    metrics: PrometheusMetrics,
) -> None:
    metrics.deadman_verdicts(
        [
            ScheduleVerdict("default", "a", DeadmanVerdict.FIRED),
            ScheduleVerdict("default", "b", DeadmanVerdict.OVERDUE),
        ]
    )
    name = "vortos_deadman_verdict"
    assert value(metrics, name, schedule="b", tenant="default", verdict="overdue") == 1
    assert value(metrics, name, schedule="b", tenant="default", verdict="fired") == 0
    metrics.deadman_verdicts([ScheduleVerdict("default", "b", DeadmanVerdict.FIRED)])
    assert value(metrics, name, schedule="b", tenant="default", verdict="fired") == 1
    assert value(metrics, name, schedule="b", tenant="default", verdict="overdue") == 0
    gone = {"schedule": "a", "tenant": "default", "verdict": "fired"}
    assert metrics.registry.get_sample_value(name, gone) is None  # deleted: not reported


# -- the guard and the gauges ---------------------------------------------------------------


def test_schedules_past_the_cardinality_cap_share_the_overflow_label_and_are_counted(
    engine: Engine, clock: ManualClock
) -> None:
    metrics = PrometheusMetrics(max_schedules=2)
    for name in ("a", "b", "c", "d"):
        engine.service.create(every(60, name), actor="t")
    settle(engine.daemon(node_id="n1", observer=metrics))
    fires = "vortos_fires_total"
    kept = [
        value(metrics, fires, result="dispatched", schedule=s, tenant="default") for s in "abcd"
    ]
    assert sorted(kept) == [0, 0, 1, 1]
    overflow = {"result": "dispatched", "schedule": OVERFLOW, "tenant": "default"}
    assert value(metrics, fires, **overflow) == 2
    assert value(metrics, "vortos_metric_label_overflow_total", label="schedule") >= 2


def test_the_store_gauges_read_active_schedules_queue_depth_and_the_oldest_wait(
    engine: Engine, clock: ManualClock, db_path: Path
) -> None:
    for name in ("a", "b"):
        engine.service.create(every(60, name), actor="t")
    engine.service.create(every(60, "off"), actor="t")
    engine.service.pause("off", actor="t")
    settle(engine.daemon(node_id="n1"))
    clock.advance(30)
    gauges = StoreGauges(engine.storage, open_read_model(db_path), clock)
    try:
        reading = gauges.read()
        families = {f.name: f.samples[0].value for f in gauges.collect()}
    finally:
        gauges.close()
    assert reading.active_schedules == 2
    assert reading.open_fires == 2
    assert reading.oldest_pending_age_s == 30
    assert reading.dead_letters == 0
    assert families["vortos_active_schedules"] == 2
    assert families["vortos_fire_queue_oldest_pending_age_seconds"] == 30


def test_one_observer_can_feed_two_registries(engine: Engine, clock: ManualClock) -> None:
    one, two = PrometheusMetrics(), PrometheusMetrics()
    engine.service.create(every(60, "a"), actor="t")
    settle(engine.daemon(node_id="n1", observer=Observers(one, two)))
    for metrics in (one, two):
        labels = {"result": "dispatched", "schedule": "a", "tenant": "default"}
        assert value(metrics, "vortos_fires_total", **labels) == 1

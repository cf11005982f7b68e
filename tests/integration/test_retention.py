"""Retention on a manual clock: what goes when, overrides and legal holds, dry runs, budgets,
the audit of every prune, and the built-in sweeper run by a real consumer."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import (
    Engine,
    InvalidInput,
    ManualClock,
    NotFound,
    PermanentFailure,
    RunKind,
    RunState,
    builtin_commands,
    open_engine,
)
from engine.commands.context import FireContext
from engine.domain.access import PermissionDenied, Role
from engine.domain.audit import tenant_chain
from engine.domain.schedule import OverlapPolicy, Schedule, ScheduleSpec
from engine.domain.triggers import CronTrigger
from engine.governance.audit import verify
from engine.retention import (
    SWEEP_ACTOR,
    SWEEP_COMMAND,
    SWEEP_SCHEDULE,
    SWEEP_TENANT,
    PruneReport,
    RetentionSettings,
    RetentionSweeper,
    attach_sweeper,
    retention_schedule,
)
from engine.runtime.consumer import FireQueueConsumer
from tests.cli.support import db_state
from tests.conformance._builders import stored_schedule
from tests.conformance._fire_builders import claim, complete, discard, enqueue, slot
from tests.conftest import T0

DAY_S = 86_400


def schedule_in(engine: Engine, tenant: str, name: str = "job") -> Schedule:
    found = engine.storage.schedules.find_by_name(tenant, name)
    if found is not None:
        return found
    # Overlap allowed: a test's fires of one schedule are claimed and settled together.
    return stored_schedule(engine.storage, name, tenant=tenant, overlap=OverlapPolicy.ALLOW)


_next_slot = iter(range(1, 1_000_000))


def open_runs(engine: Engine, tenant: str, count: int) -> list[int]:
    """`count` runs of `tenant` dispatched now and never run."""
    schedule = schedule_in(engine, tenant)
    now = engine.clock.now_ms()
    return [
        enqueue(engine.storage, schedule, slot(next(_next_slot)), available_at=now)
        for _ in range(count)
    ]


def history(
    engine: Engine, tenant: str, count: int, *, state: RunState = RunState.COMPLETED
) -> list[int]:
    """`count` runs of `tenant`, run and settled now (`dead_lettered`: discarded)."""
    ids = open_runs(engine, tenant, count)
    taken = claim(engine.storage, limit=count)
    assert sorted(f.run_id for f in taken.fires) == ids
    settle = discard if state is RunState.DEAD_LETTERED else complete
    report = engine.storage.fire_queue.settle(taken.token, "w", [settle(i) for i in ids])
    assert sorted(report.acked) == ids
    return ids


def fresh_run(engine: Engine) -> int:
    """One more run, now: the ledger's newest (always kept), in a tenant of its own."""
    return open_runs(engine, "fresh", 1)[0]


def present(engine: Engine, run_ids: list[int]) -> list[int]:
    return [r for r in run_ids if engine.storage.runs.get(r) is not None]


def with_fires(engine: Engine, run_ids: list[int]) -> list[int]:
    return [r for r in run_ids if engine.storage.fire_queue.get(r) is not None]


def prune(engine: Engine, **settings: Any) -> PruneReport:
    return engine.service.prune(actor="ops", settings=RetentionSettings(**settings))


def pruned_entries(engine: Engine, tenant: str) -> list[dict[str, object]]:
    return [
        dict(e.data)
        for e in engine.storage.audit.entries(tenant_chain(tenant))
        if e.event == "runs.pruned"
    ]


# --- what goes, and when -------------------------------------------------------------------


def test_terminal_runs_past_the_retention_go_with_their_fires(
    engine: Engine, clock: ManualClock
) -> None:
    done = history(engine, "acme", 5)
    clock.advance(31 * DAY_S)
    fresh_run(engine)

    report = prune(engine)

    assert present(engine, done) == []
    assert with_fires(engine, done) == []
    assert (report.runs, report.fires, report.dead_letters) == (5, 5, 0)
    assert report.tenants["acme"].runs == 5
    assert not report.truncated


def test_runs_within_the_retention_stay(engine: Engine, clock: ManualClock) -> None:
    done = history(engine, "acme", 3)
    clock.advance(29 * DAY_S)
    fresh_run(engine)

    assert prune(engine).runs == 0
    assert present(engine, done) == done


@pytest.mark.parametrize("state", [RunState.SKIPPED, RunState.CANCELLED])
def test_skipped_and_cancelled_runs_are_history_too(
    engine: Engine, clock: ManualClock, state: RunState
) -> None:
    ended = history(engine, "acme", 2, state=state)
    clock.advance(31 * DAY_S)
    fresh_run(engine)

    prune(engine)

    assert present(engine, ended) == []


def test_a_runs_age_counts_from_its_finish_not_its_dispatch(
    engine: Engine, clock: ManualClock
) -> None:
    (run_id,) = open_runs(engine, "acme", 1)
    taken = claim(engine.storage, limit=1)
    clock.advance(20 * DAY_S)  # a long run
    engine.storage.fire_queue.settle(taken.token, "w", [complete(run_id)])
    clock.advance(15 * DAY_S)  # dispatched 35 days ago, finished 15 days ago
    fresh_run(engine)

    prune(engine)
    assert present(engine, [run_id]) == [run_id]

    clock.advance(16 * DAY_S)
    prune(engine)
    assert present(engine, [run_id]) == []


def test_open_runs_are_never_pruned_however_old(engine: Engine, clock: ManualClock) -> None:
    running = open_runs(engine, "acme", 2)
    assert len(claim(engine.storage, limit=2).fires) == 2
    dispatched = open_runs(engine, "acme", 2)
    clock.advance(3650 * DAY_S)
    fresh_run(engine)

    assert prune(engine).runs == 0
    assert present(engine, running + dispatched) == running + dispatched
    assert with_fires(engine, running + dispatched) == running + dispatched


def test_dead_letters_stay_until_the_longer_dead_letter_retention(
    engine: Engine, clock: ManualClock
) -> None:
    dead = history(engine, "acme", 2, state=RunState.DEAD_LETTERED)
    clock.advance(31 * DAY_S)
    fresh_run(engine)

    prune(engine)
    assert present(engine, dead) == dead
    assert [f.run_id for f in engine.service.dead_letters()] == dead

    clock.advance(60 * DAY_S)  # 91 days
    report = prune(engine)
    assert present(engine, dead) == []
    assert with_fires(engine, dead) == []
    assert (report.runs, report.fires, report.dead_letters) == (2, 2, 2)


def test_a_purged_dead_letters_run_goes_at_the_run_retention(
    engine: Engine, clock: ManualClock
) -> None:
    dead = history(engine, "acme", 1, state=RunState.DEAD_LETTERED)
    engine.service.purge(dead, actor="ops")
    clock.advance(31 * DAY_S)
    fresh_run(engine)

    report = prune(engine)

    assert present(engine, dead) == []
    assert (report.runs, report.fires) == (1, 0)


def test_a_requeued_dead_letter_is_never_pruned(engine: Engine, clock: ManualClock) -> None:
    dead = history(engine, "acme", 1, state=RunState.DEAD_LETTERED)
    engine.service.requeue(dead, actor="ops")
    clock.advance(365 * DAY_S)
    fresh_run(engine)

    prune(engine)

    assert present(engine, dead) == dead


def test_the_newest_run_is_kept_so_no_run_id_is_handed_out_twice(
    engine: Engine, clock: ManualClock
) -> None:
    done = history(engine, "acme", 3)
    clock.advance(31 * DAY_S)

    prune(engine)

    assert present(engine, done) == [done[-1]]
    assert fresh_run(engine) > done[-1]


# --- overrides and legal holds -------------------------------------------------------------


def test_a_shorter_override_prunes_its_tenant_sooner(engine: Engine, clock: ManualClock) -> None:
    engine.service.set_retention("acme", 7, actor="ops")
    acme, other = history(engine, "acme", 2), history(engine, "other", 2)
    clock.advance(8 * DAY_S)
    fresh_run(engine)

    prune(engine)

    assert present(engine, acme + other) == other


def test_a_longer_override_keeps_its_tenant_longer(engine: Engine, clock: ManualClock) -> None:
    engine.service.set_retention("acme", 60, actor="ops")
    acme, other = history(engine, "acme", 2), history(engine, "other", 2)
    clock.advance(31 * DAY_S)
    fresh_run(engine)

    prune(engine)
    assert present(engine, acme + other) == acme

    clock.advance(30 * DAY_S)
    prune(engine)
    assert present(engine, acme) == []


def test_a_dead_letter_is_kept_at_least_as_long_as_its_tenants_retention(
    engine: Engine, clock: ManualClock
) -> None:
    engine.service.set_retention("acme", 120, actor="ops")
    dead = history(engine, "acme", 1, state=RunState.DEAD_LETTERED)
    clock.advance(91 * DAY_S)
    fresh_run(engine)

    prune(engine)
    assert present(engine, dead) == dead

    clock.advance(30 * DAY_S)
    prune(engine)
    assert present(engine, dead) == []


def test_a_legal_hold_keeps_everything_of_its_tenant(engine: Engine, clock: ManualClock) -> None:
    engine.service.set_retention("held", 0, actor="ops", reason="litigation 2026-17")
    kept = history(engine, "held", 3) + history(engine, "held", 2, state=RunState.DEAD_LETTERED)
    other = history(engine, "other", 3)
    clock.advance(3650 * DAY_S)
    fresh_run(engine)

    report = prune(engine)

    assert present(engine, kept) == kept
    assert with_fires(engine, kept) == kept
    assert present(engine, other) == []
    assert "held" not in report.tenants


def test_a_legal_hold_placed_during_a_sweep_holds_from_the_next_batch(
    engine: Engine, clock: ManualClock
) -> None:
    runs = history(engine, "acme", 10)
    clock.advance(31 * DAY_S)
    fresh_run(engine)
    holds: list[int] = []

    def hold_after_the_first_batch(seconds: float) -> bool:
        if seconds > 0 and not holds:
            engine.service.set_retention("acme", 0, actor="ops", reason="subpoena")
            holds.append(1)
        return False

    report = RetentionSweeper(engine.storage, engine.clock).sweep(
        RetentionSettings(batch_size=4),
        actor="ops",
        wait=hold_after_the_first_batch,
    )

    assert report.runs == 4
    assert present(engine, runs) == runs[4:]


def test_removing_a_hold_lets_the_default_apply_again(engine: Engine, clock: ManualClock) -> None:
    engine.service.set_retention("held", 0, actor="ops")
    kept = history(engine, "held", 2)
    clock.advance(31 * DAY_S)
    fresh_run(engine)
    prune(engine)
    assert present(engine, kept) == kept

    engine.service.remove_retention("held", actor="ops")
    prune(engine)

    assert present(engine, kept) == []


def test_a_default_of_zero_days_keeps_every_tenants_history(
    engine: Engine, clock: ManualClock
) -> None:
    done = history(engine, "acme", 2) + history(engine, "acme", 1, state=RunState.DEAD_LETTERED)
    clock.advance(3650 * DAY_S)
    fresh_run(engine)

    report = prune(engine, days=0)

    assert present(engine, done) == done
    assert report.examined == 0  # nothing can go: the ledger is not even read


# --- dry runs, budgets, stopping -----------------------------------------------------------


def test_a_dry_run_changes_nothing_and_counts_what_a_prune_removes(
    engine: Engine, clock: ManualClock, db_path: Path
) -> None:
    history(engine, "acme", 4)
    history(engine, "other", 2, state=RunState.DEAD_LETTERED)
    clock.advance(100 * DAY_S)
    fresh_run(engine)
    before = db_state(db_path)

    dry = engine.service.prune(actor="ops", dry_run=True)

    assert db_state(db_path) == before
    real = engine.service.prune(actor="ops")
    assert dry.dry_run
    assert not real.dry_run
    assert {t: c.to_json() for t, c in dry.tenants.items()} == {
        t: c.to_json() for t, c in real.tenants.items()
    }
    assert (real.runs, real.fires, real.dead_letters) == (6, 6, 2)


def test_a_sweep_past_its_budget_is_truncated_and_the_next_goes_on(
    engine: Engine, clock: ManualClock
) -> None:
    runs = history(engine, "acme", 35)
    clock.advance(31 * DAY_S)
    fresh_run(engine)
    settings = {"batch_size": 10, "budget_s": 0}  # a budget spent by the first batch

    reports = [prune(engine, **settings) for _ in range(4)]

    assert [r.runs for r in reports] == [10, 10, 10, 5]
    assert [(r.truncated, r.stopped_by) for r in reports] == [(True, "budget")] * 3 + [
        (False, None)
    ]
    assert present(engine, runs) == []


def test_a_sweep_asked_to_stop_stops_between_batches(engine: Engine, clock: ManualClock) -> None:
    runs = history(engine, "acme", 12)
    clock.advance(31 * DAY_S)
    fresh_run(engine)

    report = engine.service.prune(
        actor="ops", settings=RetentionSettings(batch_size=5), wait=lambda seconds: seconds > 0
    )

    assert (report.runs, report.truncated, report.stopped_by) == (5, True, "cancelled")
    assert present(engine, runs) == runs[5:]


def test_batches_pause_so_other_writers_get_the_lock(engine: Engine, clock: ManualClock) -> None:
    history(engine, "acme", 10)
    clock.advance(31 * DAY_S)
    fresh_run(engine)
    pauses: list[float] = []

    def wait(seconds: float) -> bool:
        pauses.append(seconds)
        return False

    RetentionSweeper(engine.storage, engine.clock, pause_s=0.05).sweep(
        RetentionSettings(batch_size=3), actor="ops", wait=wait
    )

    # A look (0 s) before each page, a pause after each batch of 3 but the last (of 1).
    assert [p for p in pauses if p > 0] == [0.05, 0.05, 0.05]


# --- the audit of every prune --------------------------------------------------------------


def test_every_batch_is_audited_in_each_tenants_chain(engine: Engine, clock: ManualClock) -> None:
    acme = history(engine, "acme", 5)
    history(engine, "other", 2, state=RunState.DEAD_LETTERED)
    clock.advance(100 * DAY_S)
    fresh_run(engine)

    report = prune(engine, batch_size=4)

    acme_entries = pruned_entries(engine, "acme")
    assert [e["runs"] for e in acme_entries] == [4, 1]
    assert acme_entries[0]["first_run"] == acme[0]
    assert {e["sweep"] for e in acme_entries} == {report.sweep_id}
    assert {e["trigger"] for e in acme_entries} == {"manual"}
    (other,) = pruned_entries(engine, "other")
    assert (other["runs"], other["fires"], other["dead_letters"]) == (2, 2, 2)
    assert other["retention_days"] == 30
    assert other["dead_letter_days"] == 90
    # The runs were made straight in the ledger, unaudited, for the sweep to prune; only the
    # chains the prune wrote to are judged (a full verify of every chain would rightly name
    # tenant 'fresh', whose runs no chain records).
    chains = verify(
        engine.storage.audit,
        engine.storage.audit.keys(),
        chains=engine.storage.audit.chains(),
        full=True,
        record=False,
    )
    assert all(c.intact for c in chains.chains), [(c.chain, c.problem) for c in chains.chains]


def test_a_prune_that_removes_nothing_records_nothing(engine: Engine, clock: ManualClock) -> None:
    history(engine, "acme", 2)
    fresh_run(engine)
    before = engine.storage.audit.head(tenant_chain("acme"))

    prune(engine)

    assert engine.storage.audit.head(tenant_chain("acme")) == before


def test_setting_and_removing_an_override_is_audited_in_the_tenants_chain(
    engine: Engine,
) -> None:
    engine.service.set_retention("acme", 0, actor="alice", reason="litigation")
    engine.service.set_retention("acme", 45, actor="bob")
    engine.service.remove_retention("acme", actor="carol")

    entries = [
        e
        for e in engine.storage.audit.entries(tenant_chain("acme"))
        if e.event.startswith("retention.")
    ]
    assert [(e.event, e.actor) for e in entries] == [
        ("retention.override_set", "alice"),
        ("retention.override_set", "bob"),
        ("retention.override_removed", "carol"),
    ]
    assert entries[0].data["legal_hold"] is True
    assert entries[1].data["before"]["days"] == 0
    assert entries[2].data["before"]["days"] == 45


def test_setting_the_same_override_again_changes_and_records_nothing(engine: Engine) -> None:
    first = engine.service.set_retention("acme", 10, actor="alice", reason="why")
    head = engine.storage.audit.head(tenant_chain("acme"))

    again = engine.service.set_retention("acme", 10, actor="bob", reason="why")

    assert again == first
    assert engine.storage.audit.head(tenant_chain("acme")) == head


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tenant", "days", "reason", "says"),
    [
        ("acme", -1, None, "negative"),
        ("acme", 40_000, None, "a century"),
        ("Not A Tenant!", 5, None, "tenant"),
        ("", 5, None, "tenant"),
        ("acme", 5, "x" * 1001, "reason"),
    ],
)
def test_a_bad_override_is_refused_and_changes_nothing(
    engine: Engine, tenant: str, days: int, reason: str | None, says: str
) -> None:
    engine.service.set_retention("acme", 10, actor="ops")
    chains = {c: engine.storage.audit.head(c) for c in engine.storage.audit.chains()}

    with pytest.raises(InvalidInput, match=says):
        engine.service.set_retention(tenant, days, actor="ops", reason=reason)

    assert [(o.tenant, o.days) for o in engine.storage.retention.overrides()] == [("acme", 10)]
    assert {c: engine.storage.audit.head(c) for c in engine.storage.audit.chains()} == chains


def test_removing_an_override_that_does_not_exist_is_not_found(engine: Engine) -> None:
    with pytest.raises(NotFound, match="no retention override"):
        engine.service.remove_retention("acme", actor="ops")


@pytest.mark.parametrize(
    "settings",
    [{"days": -3}, {"dead_letter_days": -1}, {"batch_size": 0}, {"budget_s": -1}],
)
def test_bad_sweeper_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        RetentionSettings(**settings)


def test_a_sweeper_schedule_with_a_bad_payload_is_refused(engine: Engine) -> None:
    with pytest.raises(InvalidInput, match="negative"):
        engine.service.create(
            ScheduleSpec(
                name="my-prune",
                trigger=CronTrigger("0 4 * * *"),
                command=SWEEP_COMMAND,
                payload={"days": -5},
            ),
            actor="ops",
        )
    assert engine.storage.schedules.find_by_name("default", "my-prune") is None


# --- who may ---------------------------------------------------------------------------------


@pytest.fixture
def governed(db_path: Path, clock: ManualClock) -> Iterator[Engine]:
    """An engine that checks access: root is admin everywhere, ada admin of acme only, olga an
    operator of acme."""
    with open_engine(db_path, clock=clock, enforce=True) as opened:
        opened.service.grant_role("root", Role.ADMIN, actor="root")
        opened.service.grant_role("ada", Role.ADMIN, actor="root", tenant="acme")
        opened.service.grant_role("olga", Role.OPERATOR, actor="root", tenant="acme")
        yield opened


def test_an_operator_may_not_set_retention(governed: Engine) -> None:
    with pytest.raises(PermissionDenied, match="manage-retention"):
        governed.service.set_retention("acme", 0, actor="olga")
    assert governed.storage.retention.overrides() == []


def test_a_tenants_admin_manages_only_that_tenants_retention(governed: Engine) -> None:
    governed.service.set_retention("acme", 0, actor="ada")

    with pytest.raises(PermissionDenied):
        governed.service.set_retention("other", 0, actor="ada")
    with pytest.raises(PermissionDenied):
        governed.service.remove_retention("acme", actor="olga")
    assert [o.tenant for o in governed.storage.retention.overrides()] == ["acme"]


def test_pruning_needs_an_admin_of_every_tenant(governed: Engine, clock: ManualClock) -> None:
    done = history(governed, "acme", 2)
    clock.advance(31 * DAY_S)
    fresh_run(governed)

    with pytest.raises(PermissionDenied):
        governed.service.prune(actor="ada")
    assert present(governed, done) == done

    assert governed.service.prune(actor="root").runs == 2


def test_a_dry_run_shows_only_the_tenants_the_reader_may_view(
    governed: Engine, clock: ManualClock
) -> None:
    history(governed, "acme", 2)
    history(governed, "other", 3)
    clock.advance(31 * DAY_S)
    fresh_run(governed)

    report = governed.service.prune(actor="olga", dry_run=True)

    assert list(report.tenants) == ["acme"]


def test_retention_show_lists_only_the_overrides_the_reader_may_view(governed: Engine) -> None:
    governed.service.set_retention("acme", 5, actor="root")
    governed.service.set_retention("other", 0, actor="root")

    assert [o.tenant for o in governed.service.retention(actor="olga").overrides] == ["acme"]
    assert len(governed.service.retention(actor="root").overrides) == 2


# --- the built-in sweeper ----------------------------------------------------------------------


def test_the_sweeper_is_a_daily_static_schedule_of_the_system_tenant() -> None:
    static = retention_schedule()
    spec = static.spec

    assert (spec.tenant, spec.name, spec.command) == (SWEEP_TENANT, SWEEP_SCHEDULE, SWEEP_COMMAND)
    assert spec.trigger == CronTrigger("17 3 * * *")
    assert spec.timezone == "UTC"
    assert spec.overlap is OverlapPolicy.SKIP
    assert spec.payload == RetentionSettings().to_payload()


def test_vortos_prune_uses_the_sweeper_schedules_settings(
    engine: Engine, clock: ManualClock
) -> None:
    report = engine.service.sync_static([retention_schedule(RetentionSettings(days=7))], actor="x")
    assert report.created == [f"{SWEEP_TENANT}/{SWEEP_SCHEDULE}"]
    done = history(engine, "acme", 2)
    clock.advance(8 * DAY_S)
    fresh_run(engine)

    settings, source = engine.service.retention_settings()
    pruned = engine.service.prune(actor="ops")

    assert settings.days == 7
    assert SWEEP_SCHEDULE in source
    assert pruned.runs == 2
    assert present(engine, done) == []


def test_a_changed_sweeper_setting_is_a_recorded_schedule_change(engine: Engine) -> None:
    engine.service.sync_static([retention_schedule()], actor="deploy-1")
    report = engine.service.sync_static(
        [retention_schedule(RetentionSettings(days=14))], actor="deploy-2"
    )

    assert report.updated == [f"{SWEEP_TENANT}/{SWEEP_SCHEDULE}"]
    (latest,) = engine.storage.audit.latest(tenant_chain(SWEEP_TENANT), limit=1)
    assert latest.event == "schedule.updated"
    assert latest.data["definition"]["payload"]["days"] == 14


def drive(consumer: FireQueueConsumer, until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        consumer.step()
        time.sleep(0.005)


def test_the_sweeper_command_prunes_on_a_consumer_thread(
    engine: Engine, clock: ManualClock
) -> None:
    engine.service.sync_static([retention_schedule(RetentionSettings(batch_size=3))], actor="x")
    engine.service.set_retention("held", 0, actor="ops")
    gone, held = history(engine, "acme", 7), history(engine, "held", 2)
    clock.advance(31 * DAY_S)
    run = engine.service.trigger(SWEEP_SCHEDULE, tenant=SWEEP_TENANT, actor="ops")
    consumer = engine.consumer(consumer_id="c1", concurrency=2)

    drive(
        consumer,
        lambda: (
            (found := engine.storage.runs.get(run.id)) is not None
            and found.state is RunState.COMPLETED
        ),
        "the sweep's run",
    )

    assert present(engine, gone + held) == held
    done = engine.storage.runs.get(run.id)
    assert done is not None
    assert done.output is not None
    assert '"runs": 7' in done.output
    entries = engine.storage.audit.entries(tenant_chain("acme"))
    assert [e.actor for e in entries if e.event == "runs.pruned"] == [SWEEP_ACTOR] * 3


def _context(run_id: int, slot_key: str) -> FireContext:
    return FireContext(
        run_id=run_id,
        tenant=SWEEP_TENANT,
        schedule_id="s",
        schedule_name=SWEEP_SCHEDULE,
        slot_key=slot_key,
        slot_at=T0,
        kind=RunKind.MANUAL,
        attempt=1,
    )


def test_the_sweeper_command_refuses_to_run_unattached() -> None:
    command = builtin_commands().get(SWEEP_COMMAND)

    with pytest.raises(PermanentFailure, match="not attached"):
        command.run(fire=_context(1, "k"))


def test_the_sweeper_command_never_prunes_another_database_than_its_fires(
    tmp_path: Path, clock: ManualClock
) -> None:
    commands = builtin_commands()
    with open_engine(tmp_path / "a.db", clock=clock, commands=commands) as first:
        first.service.sync_static([retention_schedule()], actor="x")
        run = first.service.trigger(SWEEP_SCHEDULE, tenant=SWEEP_TENANT, actor="ops")
        # The same registry, attached since to another file.
        with (
            open_engine(tmp_path / "b.db", clock=clock, commands=commands),
            pytest.raises(PermanentFailure, match="another database"),
        ):
            commands.get(SWEEP_COMMAND).run(fire=_context(run.id, run.slot_key))


def test_the_sweeper_hands_its_report_to_a_listener(engine: Engine, clock: ManualClock) -> None:
    engine.service.sync_static([retention_schedule()], actor="x")
    history(engine, "acme", 3)
    clock.advance(31 * DAY_S)
    run = engine.service.trigger(SWEEP_SCHEDULE, tenant=SWEEP_TENANT, actor="ops")
    reports: list[PruneReport] = []
    attach_sweeper(engine.commands, engine.storage, engine.clock, on_report=reports.append)

    engine.commands.get(SWEEP_COMMAND).run(fire=_context(run.id, run.slot_key))

    (report,) = reports
    assert (report.trigger, report.tenants["acme"].runs, report.truncated) == (
        "scheduled",
        3,
        False,
    )


def test_a_read_only_engine_leaves_the_sweeper_attached_where_it_was(
    db_path: Path, clock: ManualClock
) -> None:
    commands = builtin_commands()
    with open_engine(db_path, clock=clock, commands=commands) as writer:
        writer.service.sync_static([retention_schedule()], actor="x")
        run = writer.service.trigger(SWEEP_SCHEDULE, tenant=SWEEP_TENANT, actor="ops")
        with open_engine(db_path, clock=clock, commands=commands, readonly=True):
            pass
        report = commands.get(SWEEP_COMMAND).run(fire=_context(run.id, run.slot_key))
    assert report["trigger"] == "scheduled"

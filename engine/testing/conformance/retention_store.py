"""The retention store's contract (engine.ports.retention): overrides, and the ledger as the
sweeper reads it (how each run stands, from when its age counts) and prunes it (never an open
run, never the newest run, a run always with its fire)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from engine import ManualClock, RunState
from engine.domain.schedule import OverlapPolicy, Schedule
from engine.ports.retention import RetentionOverride, RunAge, RunStanding
from engine.ports.storage import Storage
from engine.testing.conformance.builders import stored_schedule
from engine.testing.conformance.fire_builders import claim, complete, discard, enqueue, fail, slot
from engine.testing.conformance.storage import T0, StorageConformance


def override(tenant: str, days: int, reason: str | None = None) -> RetentionOverride:
    """The override of `tenant`, set by alice at T0."""
    return RetentionOverride(tenant, days, reason, set_by="alice", set_at=T0)


def schedule_of(storage: Storage, tenant: str = "default", name: str = "nightly") -> Schedule:
    """A stored schedule of `tenant` whose fires never hold each other back."""
    # Overlap allowed: several fires of one schedule are claimed and settled together.
    return stored_schedule(storage, name, tenant=tenant, overlap=OverlapPolicy.ALLOW)


def settled(
    storage: Storage,
    schedule: Schedule,
    n: int,
    *,
    state: RunState = RunState.COMPLETED,
) -> int:
    """The run of `schedule`'s n-th slot, claimed and settled (`dead_lettered`: discarded)."""
    run_id = enqueue(storage, schedule, slot(n))
    taken = claim(storage, limit=1)
    assert [f.run_id for f in taken.fires] == [run_id]
    settlement = (
        discard(run_id) if state is RunState.DEAD_LETTERED else complete(run_id, state=state)
    )
    report = storage.fire_queue.settle(taken.token, "worker-a", [settlement])
    assert report.acked == [run_id]
    return run_id


def newest(storage: Storage, schedule: Schedule) -> int:
    """One more run, dispatched last: the ledger's newest, which is never offered."""
    return enqueue(storage, schedule, slot(999))


def by_id(ages: list[RunAge]) -> dict[int, RunAge]:
    """The runs' ages by run id."""
    return {a.run_id: a for a in ages}


def fails_after(storage: Storage, change: Callable[[], object]) -> None:
    """`change` inside a transaction that then fails (as when its audit entry cannot be written)."""
    with storage.atomic():
        change()
        raise RuntimeError("the audit entry could not be written")


class RetentionStoreConformance(StorageConformance):
    """Checks `Storage.retention` (RetentionStore), with the fire queue and the run ledger
    it prunes.

    Guarantees:
    - overrides read back whole, one per tenant, listed by tenant; 0 days is a legal hold;
      a change rolls back with its transaction (`Storage.atomic`);
    - `examine` reads runs in id order and says how each stands: open (dispatched, running,
      waiting for a retry, requeued), settled history, or a dead letter; and from when its
      age counts;
    - `delete` removes a run together with its fire, all or nothing with its transaction,
      and never an open run, a run whose fire is open, the ledger's newest run (ids are
      never handed out twice), or a run its judge no longer accepts once it holds the lock.

    Subclass it and implement `open_storage` (see StorageConformance):

        class TestMyStore(RetentionStoreConformance):
            def open_storage(self, clock, directory):
                return closing(MyStore(directory / "store.db", clock))
    """

    # --- overrides -----------------------------------------------------------------------------

    def test_a_new_store_has_no_overrides(self, storage: Storage) -> None:
        assert storage.retention.overrides() == []
        assert storage.retention.override("acme") is None

    def test_a_set_override_reads_back_whole(self, storage: Storage) -> None:
        storage.retention.set_override(override("acme", 7, "contract says a week"))

        assert storage.retention.override("acme") == override("acme", 7, "contract says a week")

    def test_setting_an_override_again_replaces_it(self, storage: Storage) -> None:
        storage.retention.set_override(override("acme", 7))
        storage.retention.set_override(override("acme", 0, "litigation"))

        assert storage.retention.overrides() == [override("acme", 0, "litigation")]

    def test_overrides_are_listed_by_tenant(self, storage: Storage) -> None:
        for tenant in ("zeta", "acme", "mid"):
            storage.retention.set_override(override(tenant, 10))

        assert [o.tenant for o in storage.retention.overrides()] == ["acme", "mid", "zeta"]

    def test_zero_days_is_a_legal_hold(self, storage: Storage) -> None:
        storage.retention.set_override(override("acme", 0))

        found = storage.retention.override("acme")
        assert found is not None
        assert found.legal_hold

    def test_removing_an_override_says_whether_there_was_one(self, storage: Storage) -> None:
        storage.retention.set_override(override("acme", 7))

        assert storage.retention.remove_override("acme") is True
        assert storage.retention.remove_override("acme") is False
        assert storage.retention.overrides() == []

    def test_an_override_change_rolls_back_with_its_transaction(self, storage: Storage) -> None:
        storage.retention.set_override(override("acme", 7))

        def change() -> None:
            storage.retention.set_override(override("acme", 0))
            storage.retention.remove_override("acme")
            storage.retention.set_override(override("other", 3))

        with pytest.raises(RuntimeError):
            fails_after(storage, change)

        assert storage.retention.overrides() == [override("acme", 7)], (
            "atomicity: override changes made in a transaction that fails must all roll back"
        )

    # --- examine -------------------------------------------------------------------------------

    def test_examine_reads_runs_in_id_order_after_the_given_id(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        ids = [settled(storage, schedule, n) for n in range(5)]
        newest(storage, schedule)

        assert [a.run_id for a in storage.retention.examine(0, 100)] == ids
        assert [a.run_id for a in storage.retention.examine(ids[1], 2)] == ids[2:4]

    def test_examine_never_offers_the_newest_run(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        only = settled(storage, schedule, 0)

        newest_kept = "examine must never offer the ledger's newest run (its id seeds the next)"
        assert storage.retention.examine(0, 100) == [], newest_kept
        later = newest(storage, schedule)
        assert [a.run_id for a in storage.retention.examine(0, 100)] == [only]
        assert later not in by_id(storage.retention.examine(0, 100)), newest_kept

    def test_dispatched_and_running_runs_are_open(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        running = enqueue(storage, schedule, slot(0))
        assert claim(storage, limit=1).fires
        dispatched = enqueue(storage, schedule, slot(1))
        newest(storage, schedule)

        ages = by_id(storage.retention.examine(0, 100))

        open_run = "a dispatched or running run is open: retention must never offer it as history"
        assert ages[running].standing is RunStanding.OPEN, open_run
        assert ages[dispatched].standing is RunStanding.OPEN, open_run

    def test_a_run_waiting_for_its_retry_is_open(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = schedule_of(storage)
        run_id = enqueue(storage, schedule, slot(0))
        taken = claim(storage, limit=1)
        storage.fire_queue.settle(taken.token, "worker-a", [fail(run_id, T0 + 60_000)])
        newest(storage, schedule)

        assert by_id(storage.retention.examine(0, 100))[run_id].standing is RunStanding.OPEN, (
            "a run whose fire waits for its retry is open: retention must not treat it as history"
        )

    @pytest.mark.parametrize("state", [RunState.COMPLETED, RunState.SKIPPED, RunState.CANCELLED])
    def test_a_finished_run_with_a_settled_fire_is_settled_history(
        self, storage: Storage, clock: ManualClock, state: RunState
    ) -> None:
        schedule = schedule_of(storage)
        clock.advance(90)
        run_id = settled(storage, schedule, 0, state=state)
        newest(storage, schedule)

        age = by_id(storage.retention.examine(0, 100))[run_id]

        assert age.standing is RunStanding.SETTLED
        assert age.has_fire is True
        assert age.aged_from == T0 + 90_000  # its finish
        assert age.tenant == schedule.tenant

    def test_a_dead_letter_ages_from_when_it_was_dead_lettered(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = schedule_of(storage)
        clock.advance(30)
        run_id = settled(storage, schedule, 0, state=RunState.DEAD_LETTERED)
        newest(storage, schedule)

        age = by_id(storage.retention.examine(0, 100))[run_id]

        assert age.standing is RunStanding.DEAD_LETTER
        assert age.has_fire is True
        assert age.aged_from == T0 + 30_000

    def test_a_purged_dead_letters_run_is_settled_history_without_a_fire(
        self,
        storage: Storage,
    ) -> None:
        schedule = schedule_of(storage)
        run_id = settled(storage, schedule, 0, state=RunState.DEAD_LETTERED)
        assert storage.fire_queue.purge([run_id]) == 1
        newest(storage, schedule)

        age = by_id(storage.retention.examine(0, 100))[run_id]

        assert (age.standing, age.has_fire) == (RunStanding.SETTLED, False)

    def test_a_requeued_dead_letter_is_open_again(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        run_id = settled(storage, schedule, 0, state=RunState.DEAD_LETTERED)
        assert storage.fire_queue.requeue([run_id], at=T0) == 1
        newest(storage, schedule)

        assert by_id(storage.retention.examine(0, 100))[run_id].standing is RunStanding.OPEN, (
            "a requeued dead letter is open again: retention must not prune it"
        )

    # --- delete --------------------------------------------------------------------------------

    def test_delete_removes_the_run_and_its_fire(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        gone, kept = settled(storage, schedule, 0), settled(storage, schedule, 1)
        newest(storage, schedule)

        removed = storage.retention.delete([gone])

        assert [(r.run_id, r.has_fire) for r in removed] == [(gone, True)]
        assert storage.runs.get(gone) is None
        assert storage.fire_queue.get(gone) is None, (
            "delete must remove a run together with its fire: never a fire without its run"
        )
        assert storage.runs.get(kept) is not None
        assert storage.fire_queue.get(kept) is not None

    def test_delete_reports_what_it_removed_as_it_stood(self, storage: Storage) -> None:
        schedule = schedule_of(storage, tenant="acme")
        done = settled(storage, schedule, 0)
        dead = settled(storage, schedule, 1, state=RunState.DEAD_LETTERED)
        purged = settled(storage, schedule, 2, state=RunState.DEAD_LETTERED)
        storage.fire_queue.purge([purged])
        newest(storage, schedule)

        removed = storage.retention.delete([purged, dead, done])

        assert [(r.run_id, r.tenant, r.standing, r.has_fire) for r in removed] == [
            (done, "acme", RunStanding.SETTLED, True),
            (dead, "acme", RunStanding.DEAD_LETTER, True),
            (purged, "acme", RunStanding.SETTLED, False),
        ]
        assert all(storage.runs.get(r) is None for r in (done, dead, purged))

    def test_delete_removes_only_what_its_judge_still_accepts(self, storage: Storage) -> None:
        acme, other = schedule_of(storage, tenant="acme"), schedule_of(storage, tenant="other")
        mine, theirs = settled(storage, acme, 0), settled(storage, other, 0)
        newest(storage, acme)
        judged: list[RunAge] = []

        def still(age: RunAge) -> bool:
            judged.append(age)
            return age.tenant == "acme"

        removed = storage.retention.delete([mine, theirs], still=still)

        assert [r.run_id for r in removed] == [mine], (
            "delete must remove only the runs its judge (`still`) accepts"
        )
        assert sorted(a.run_id for a in judged) == sorted([mine, theirs])
        assert storage.runs.get(theirs) is not None

    def test_delete_never_removes_an_open_run_or_its_fire(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        running = enqueue(storage, schedule, slot(0))
        assert claim(storage, limit=1).fires
        dispatched = enqueue(storage, schedule, slot(1))
        newest(storage, schedule)

        assert storage.retention.delete([running, dispatched]) == [], (
            "delete must never remove an open (dispatched or running) run, whatever ids it is given"
        )

        for run_id in (running, dispatched):
            assert storage.runs.get(run_id) is not None
            assert storage.fire_queue.get(run_id) is not None

    def test_delete_never_removes_the_newest_run(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        older = settled(storage, schedule, 0)
        last = settled(storage, schedule, 1)

        removed = storage.retention.delete([older, last])

        assert [r.run_id for r in removed] == [older], (
            "delete must never remove the ledger's newest run (run ids would be handed out twice)"
        )
        assert storage.runs.get(last) is not None

    def test_delete_skips_unknown_ids_and_accepts_none(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        settled(storage, schedule, 0)
        newest(storage, schedule)

        assert storage.retention.delete([]) == []
        assert storage.retention.delete([424_242]) == []
        assert storage.runs.count() == 2

    def test_a_delete_rolls_back_with_its_transaction(self, storage: Storage) -> None:
        schedule = schedule_of(storage)
        run_id = settled(storage, schedule, 0)
        newest(storage, schedule)

        removed: list[RunAge] = []
        with pytest.raises(RuntimeError):
            fails_after(storage, lambda: removed.extend(storage.retention.delete([run_id])))

        assert len(removed) == 1

        rolled_back = "atomicity: a delete in a transaction that fails must leave run and fire be"
        assert storage.runs.get(run_id) is not None, rolled_back
        assert storage.fire_queue.get(run_id) is not None, rolled_back

    def test_delete_touches_only_the_runs_it_is_given(self, storage: Storage) -> None:
        acme, other = schedule_of(storage, tenant="acme"), schedule_of(storage, tenant="other")
        mine = [settled(storage, acme, n) for n in range(3)]
        theirs = [settled(storage, other, n) for n in range(3)]
        newest(storage, acme)

        storage.retention.delete(mine[:2])

        assert [r for r in mine + theirs if storage.runs.get(r) is not None] == [
            mine[2],
            *theirs,
        ], "delete must touch only the runs it is given"

    def test_a_delete_that_waits_for_a_requeue_judges_the_run_as_the_requeue_left_it(
        self,
        storage: Storage,
    ) -> None:
        schedule = schedule_of(storage)
        run_id = settled(storage, schedule, 0, state=RunState.DEAD_LETTERED)
        newest(storage, schedule)
        requeued, go_on = threading.Event(), threading.Event()

        def requeue() -> None:
            with storage.atomic():  # an operator's requeue, not yet committed
                assert storage.fire_queue.requeue([run_id], at=T0) == 1
                requeued.set()
                go_on.wait(10)

        removed: list[RunAge] = []
        operator = threading.Thread(target=requeue)
        sweeper = threading.Thread(
            target=lambda: removed.extend(storage.retention.delete([run_id]))
        )
        operator.start()
        assert requeued.wait(10)
        sweeper.start()
        time.sleep(0.3)  # the sweeper's delete now waits for the requeue to finish
        go_on.set()
        operator.join(10)
        sweeper.join(10)

        assert removed == [], (
            "delete must judge a run as the concurrent transaction it waited for left it: "
            "a requeued dead letter is open and is not removed"
        )
        assert by_id(storage.retention.examine(0, 10))[run_id].standing is RunStanding.OPEN
        assert storage.fire_queue.get(run_id) is not None

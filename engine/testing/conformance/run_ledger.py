"""The run ledger's conformance suite."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from engine import DuplicateSlot, RunKind, RunState
from engine.domain.timeutil import MINUTE_MS
from engine.ports.runs import RunQuery
from engine.ports.storage import Storage
from engine.testing.conformance.builders import FIRST_SLOT, make_run, must_raise, stored_schedule
from engine.testing.conformance.storage import StorageConformance

DISPATCHED_AT = FIRST_SLOT + 40
SLOT_2 = FIRST_SLOT + 5 * MINUTE_MS
SLOT_3 = FIRST_SLOT + 10 * MINUTE_MS

# Threads recording one slot at once.
RECORDERS = 8

# The guarantees more than one test checks, as a failure names them.
CLAIM_ONCE = (
    "claim-once: recording a second run of the same tenant and slot key must raise DuplicateSlot"
)
TENANT_ISOLATION = "tenant isolation: "


class RunLedgerConformance(StorageConformance):
    """The run ledger (`Storage.runs`, engine.ports.runs.RunLedger): the record of every
    dispatched slot, whose unique slot key per tenant is what makes a fire happen once.

    Guarantees checked:
    - claim-once: the first record of a tenant's slot key lands as DISPATCHED; a second one
      raises DuplicateSlot (carrying the slot key) and changes nothing, and of threads racing
      to record one slot exactly one succeeds;
    - the key is per tenant: the same slot key in another tenant is another run;
    - last slots: the newest slot recorded per schedule, whatever the recording order;
    - tenant isolation: look-ups, queries and counts in one tenant never see another's runs;
    - queries order runs newest first, filter by schedule, state and instant, and keep the
      runs of a deleted schedule.

    Subclass it and implement `open_storage`:

        class TestMyLedger(RunLedgerConformance):
            def open_storage(self, clock, directory):
                return closing(MyStorage(directory / "store.db", clock))
    """

    # --- record ----------------------------------------------------------------------------

    def test_first_record_of_a_slot_is_dispatched(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)

        run = storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        assert run.state is RunState.DISPATCHED, (
            "claim-once: the first record of a slot must land as DISPATCHED"
        )
        assert run.dispatched_at == DISPATCHED_AT
        assert storage.runs.count() == 1

    def test_record_returns_the_new_runs_fields(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, "hourly-sync", tenant="acme")
        new = make_run(schedule, FIRST_SLOT, node_id="node-7", kind=RunKind.BACKFILL)

        run = storage.runs.record(new, DISPATCHED_AT)

        assert (run.tenant, run.schedule_id, run.schedule_name) == (
            "acme",
            schedule.id,
            "hourly-sync",
        )
        assert (run.slot_key, run.slot_at, run.due_at) == (new.slot_key, FIRST_SLOT, new.due_at)
        assert (run.kind, run.node_id) == (RunKind.BACKFILL, "node-7")
        assert (run.attempts, run.finished_at, run.error) == (0, None, None)

    def test_duplicate_slot_raises_duplicate_slot(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        with must_raise(DuplicateSlot, CLAIM_ONCE):
            storage.runs.record(make_run(schedule, FIRST_SLOT, node_id="node-b"), DISPATCHED_AT + 1)

    def test_duplicate_slot_error_carries_the_slot_key(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        new = make_run(schedule, FIRST_SLOT)
        storage.runs.record(new, DISPATCHED_AT)

        with must_raise(DuplicateSlot, CLAIM_ONCE) as raised:
            storage.runs.record(new, DISPATCHED_AT + 1)

        assert raised.value.slot_key == new.slot_key, (
            "claim-once: DuplicateSlot must carry the slot key that was already recorded"
        )

    def test_duplicate_slot_changes_nothing(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        first = storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        with must_raise(DuplicateSlot, CLAIM_ONCE):
            storage.runs.record(
                make_run(schedule, FIRST_SLOT, node_id="node-b", kind=RunKind.MANUAL),
                DISPATCHED_AT + 1,
            )

        assert storage.runs.count() == 1, "claim-once: a refused duplicate must not be recorded"
        assert storage.runs.find_by_slot(schedule.tenant, first.slot_key) == first, (
            "claim-once: a refused duplicate must leave the first run as it was"
        )

    def test_another_slot_of_the_same_schedule_is_recorded(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        second = storage.runs.record(make_run(schedule, SLOT_2), SLOT_2)

        assert second.state is RunState.DISPATCHED
        assert storage.runs.count() == 2, "claim-once: each slot of a schedule is a run of its own"

    def test_the_same_slot_instant_of_another_schedule_is_recorded(self, storage: Storage) -> None:
        first = stored_schedule(storage, "job-a")
        other = stored_schedule(storage, "job-b")
        storage.runs.record(make_run(first, FIRST_SLOT), DISPATCHED_AT)

        run = storage.runs.record(make_run(other, FIRST_SLOT), DISPATCHED_AT)

        assert run.schedule_id == other.id
        assert storage.runs.count() == 2, (
            "claim-once: the slot key names the schedule, so two schedules' slots at one instant "
            "are two runs"
        )

    def test_the_same_slot_key_in_another_tenant_is_recorded(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")
        storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        run = storage.runs.record(make_run(schedule, FIRST_SLOT, tenant="globex"), DISPATCHED_AT)

        assert run.tenant == "globex"
        assert storage.runs.count("acme") == 1
        assert storage.runs.count("globex") == 1, (
            "claim-once is per tenant: the same slot key in another tenant is another run"
        )

    def test_the_same_slot_key_in_another_tenant_is_a_duplicate_there_too(
        self, storage: Storage
    ) -> None:
        schedule = stored_schedule(storage, tenant="acme")
        storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)
        storage.runs.record(make_run(schedule, FIRST_SLOT, tenant="globex"), DISPATCHED_AT)

        with must_raise(DuplicateSlot, CLAIM_ONCE):
            storage.runs.record(make_run(schedule, FIRST_SLOT, tenant="globex"), DISPATCHED_AT)

    # --- last slots ------------------------------------------------------------------------

    def test_last_slots_of_no_schedules_is_empty(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        assert storage.runs.last_slots([]) == {}

    def test_last_slots_leaves_out_a_schedule_that_never_fired(self, storage: Storage) -> None:
        fired = stored_schedule(storage, "fired")
        never = stored_schedule(storage, "never")
        storage.runs.record(make_run(fired, FIRST_SLOT), DISPATCHED_AT)

        assert storage.runs.last_slots([fired.id, never.id]) == {fired.id: FIRST_SLOT}

    def test_last_slots_leaves_out_an_unknown_schedule_id(self, storage: Storage) -> None:
        assert storage.runs.last_slots(["0" * 32]) == {}

    def test_last_slots_is_the_newest_slot_whatever_the_recording_order(
        self, storage: Storage
    ) -> None:
        schedule = stored_schedule(storage)
        for slot in (SLOT_2, SLOT_3, FIRST_SLOT):  # a backfilled older slot comes last
            storage.runs.record(make_run(schedule, slot), SLOT_3 + 1)

        assert storage.runs.last_slots([schedule.id]) == {schedule.id: SLOT_3}, (
            "last_slots: the newest slot recorded, not the last one recorded"
        )

    def test_last_slots_answers_for_several_schedules_at_once(self, storage: Storage) -> None:
        schedules = [stored_schedule(storage, f"job-{n}") for n in range(3)]
        for n, schedule in enumerate(schedules):
            for k in range(n + 1):
                slot = FIRST_SLOT + k * 5 * MINUTE_MS
                storage.runs.record(make_run(schedule, slot), slot)

        last = storage.runs.last_slots([s.id for s in schedules])

        assert last == {s.id: FIRST_SLOT + n * 5 * MINUTE_MS for n, s in enumerate(schedules)}

    def test_last_slots_in_a_tenant_never_sees_another_tenants_runs(self, storage: Storage) -> None:
        acme = stored_schedule(storage, "job", tenant="acme")
        globex = stored_schedule(storage, "job", tenant="globex")
        storage.runs.record(make_run(acme, FIRST_SLOT), DISPATCHED_AT)
        storage.runs.record(make_run(globex, SLOT_2), SLOT_2)

        assert storage.runs.last_slots([acme.id, globex.id], tenant="acme") == {
            acme.id: FIRST_SLOT
        }, TENANT_ISOLATION + "last_slots in a tenant must leave out other tenants' runs"
        assert storage.runs.last_slots([acme.id], tenant="globex") == {}, (
            TENANT_ISOLATION + "last_slots in a tenant must leave out other tenants' runs"
        )

    def test_last_slots_without_a_tenant_sees_every_tenant(self, storage: Storage) -> None:
        acme = stored_schedule(storage, "job", tenant="acme")
        globex = stored_schedule(storage, "job", tenant="globex")
        storage.runs.record(make_run(acme, FIRST_SLOT), DISPATCHED_AT)
        storage.runs.record(make_run(globex, SLOT_2), SLOT_2)

        assert storage.runs.last_slots([acme.id, globex.id]) == {
            acme.id: FIRST_SLOT,
            globex.id: SLOT_2,
        }

    # --- look-up by slot -------------------------------------------------------------------

    def test_find_by_slot_returns_the_full_record(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")
        recorded = storage.runs.record(
            make_run(schedule, FIRST_SLOT, node_id="node-7", kind=RunKind.MANUAL), DISPATCHED_AT
        )

        assert storage.runs.find_by_slot("acme", recorded.slot_key) == recorded

    def test_find_by_slot_of_an_unknown_slot_is_none(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        assert (
            storage.runs.find_by_slot(schedule.tenant, make_run(schedule, SLOT_2).slot_key) is None
        )

    def test_find_by_slot_never_crosses_tenants(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")
        recorded = storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        assert storage.runs.find_by_slot("globex", recorded.slot_key) is None, (
            TENANT_ISOLATION + "find_by_slot in a tenant must not return another tenant's run"
        )

    def test_find_by_slot_tells_apart_the_same_key_in_two_tenants(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")
        in_acme = storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)
        in_globex = storage.runs.record(
            make_run(schedule, FIRST_SLOT, tenant="globex", node_id="node-b"), DISPATCHED_AT + 1
        )

        assert storage.runs.find_by_slot("acme", in_acme.slot_key) == in_acme, (
            TENANT_ISOLATION + "find_by_slot must return the run of the tenant asked for"
        )
        assert storage.runs.find_by_slot("globex", in_acme.slot_key) == in_globex, (
            TENANT_ISOLATION + "find_by_slot must return the run of the tenant asked for"
        )

    def test_find_by_slot_without_a_tenant_sees_every_tenant(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")
        recorded = storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        assert storage.runs.find_by_slot(None, recorded.slot_key) == recorded

    def test_state_of_a_recorded_slot_is_dispatched(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        recorded = storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        assert storage.runs.state_of(schedule.tenant, recorded.slot_key) is RunState.DISPATCHED

    def test_state_of_an_unknown_slot_is_none(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)

        assert (
            storage.runs.state_of(schedule.tenant, make_run(schedule, FIRST_SLOT).slot_key) is None
        )

    def test_state_of_never_crosses_tenants(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")
        recorded = storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        assert storage.runs.state_of("globex", recorded.slot_key) is None, (
            TENANT_ISOLATION + "state_of in a tenant must not see another tenant's run"
        )

    def test_state_of_without_a_tenant_sees_every_tenant(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")
        recorded = storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        assert storage.runs.state_of(None, recorded.slot_key) is RunState.DISPATCHED

    # --- query and count -------------------------------------------------------------------

    def test_query_of_one_schedule_lists_its_runs_newest_slot_first(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        for slot in (SLOT_2, FIRST_SLOT, SLOT_3):
            storage.runs.record(make_run(schedule, slot), SLOT_3 + 1)

        found = storage.runs.query(RunQuery(schedule_id=schedule.id))

        assert [r.slot_at for r in found] == [SLOT_3, SLOT_2, FIRST_SLOT]

    def test_query_across_schedules_lists_runs_newest_dispatched_first(
        self, storage: Storage
    ) -> None:
        schedule = stored_schedule(storage)
        for slot in (SLOT_2, FIRST_SLOT, SLOT_3):
            storage.runs.record(make_run(schedule, slot), SLOT_3 + 1)

        found = storage.runs.query(RunQuery())

        assert [r.slot_at for r in found] == [SLOT_3, FIRST_SLOT, SLOT_2]

    def test_query_by_schedule_returns_only_its_runs(self, storage: Storage) -> None:
        wanted = stored_schedule(storage, "job-a")
        other = stored_schedule(storage, "job-b")
        for slot in (FIRST_SLOT, SLOT_2):
            storage.runs.record(make_run(wanted, slot), slot)
            storage.runs.record(make_run(other, slot), slot)

        found = storage.runs.query(RunQuery(schedule_id=wanted.id))

        assert [(r.schedule_id, r.slot_at) for r in found] == [
            (wanted.id, SLOT_2),
            (wanted.id, FIRST_SLOT),
        ]

    def test_query_by_state_returns_only_that_state(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        assert len(storage.runs.query(RunQuery(state=RunState.DISPATCHED))) == 1
        assert storage.runs.query(RunQuery(state=RunState.COMPLETED)) == []

    def test_query_since_includes_slots_at_or_after_the_instant(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        for slot in (FIRST_SLOT, SLOT_2, SLOT_3):
            storage.runs.record(make_run(schedule, slot), slot)

        found = storage.runs.query(RunQuery(since_ms=SLOT_2))

        assert [r.slot_at for r in found] == [SLOT_3, SLOT_2]

    def test_query_limit_keeps_the_newest_runs(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        for slot in (FIRST_SLOT, SLOT_2, SLOT_3):
            storage.runs.record(make_run(schedule, slot), slot)

        found = storage.runs.query(RunQuery(limit=2))

        assert [r.slot_at for r in found] == [SLOT_3, SLOT_2]

    def test_query_by_tenant_never_crosses_tenants(self, storage: Storage) -> None:
        acme = stored_schedule(storage, "job", tenant="acme")
        globex = stored_schedule(storage, "job", tenant="globex")
        storage.runs.record(make_run(acme, FIRST_SLOT), DISPATCHED_AT)
        storage.runs.record(make_run(globex, FIRST_SLOT), DISPATCHED_AT)

        found = storage.runs.query(RunQuery(tenant="acme"))

        assert [r.tenant for r in found] == ["acme"], (
            TENANT_ISOLATION + "a query in a tenant must return that tenant's runs only"
        )

    def test_query_without_a_tenant_sees_every_tenant(self, storage: Storage) -> None:
        acme = stored_schedule(storage, "job", tenant="acme")
        globex = stored_schedule(storage, "job", tenant="globex")
        storage.runs.record(make_run(acme, FIRST_SLOT), DISPATCHED_AT)
        storage.runs.record(make_run(globex, FIRST_SLOT), DISPATCHED_AT)

        assert sorted(r.tenant for r in storage.runs.query(RunQuery())) == ["acme", "globex"]

    def test_query_returns_whole_runs(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        recorded = storage.runs.record(
            make_run(schedule, FIRST_SLOT, node_id="node-7"), DISPATCHED_AT
        )

        assert storage.runs.query(RunQuery()) == [recorded]

    def test_count_per_tenant_and_overall(self, storage: Storage) -> None:
        acme = stored_schedule(storage, "job", tenant="acme")
        globex = stored_schedule(storage, "job", tenant="globex")
        for slot in (FIRST_SLOT, SLOT_2):
            storage.runs.record(make_run(acme, slot), slot)
        storage.runs.record(make_run(globex, FIRST_SLOT), DISPATCHED_AT)

        assert storage.runs.count("acme") == 2, (
            TENANT_ISOLATION + "a count in a tenant must count that tenant's runs only"
        )
        assert storage.runs.count("globex") == 1
        assert storage.runs.count("initech") == 0
        assert storage.runs.count() == 3

    def test_deleting_a_schedule_keeps_its_runs(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        recorded = storage.runs.record(make_run(schedule, FIRST_SLOT), DISPATCHED_AT)

        storage.schedules.delete(schedule.id, schedule.tenant)

        assert storage.runs.find_by_slot(schedule.tenant, recorded.slot_key) == recorded, (
            "claim-once: deleting a schedule must keep its runs, or its slots could fire again"
        )
        assert storage.runs.last_slots([schedule.id]) == {schedule.id: FIRST_SLOT}

    # --- concurrency -----------------------------------------------------------------------

    def test_threads_racing_to_record_one_slot_record_it_once(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        barrier = threading.Barrier(RECORDERS)

        def record(node: str) -> str:
            barrier.wait(timeout=30)  # start every insert together
            try:
                storage.runs.record(make_run(schedule, FIRST_SLOT, node_id=node), DISPATCHED_AT)
            except DuplicateSlot:
                return "duplicate"
            return "recorded"

        with ThreadPoolExecutor(max_workers=RECORDERS) as pool:
            outcomes = list(pool.map(record, [f"node-{n}" for n in range(RECORDERS)], timeout=60))

        assert Counter(outcomes) == Counter({"recorded": 1, "duplicate": RECORDERS - 1}), (
            f"claim-once: of {RECORDERS} threads recording one slot at once exactly one must "
            "succeed and the others raise DuplicateSlot"
        )
        assert storage.runs.count() == 1, "claim-once: a slot raced for must be recorded once"

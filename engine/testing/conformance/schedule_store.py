"""The schedule store's conformance suite."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from engine import (
    CronTrigger,
    DuplicateName,
    IntervalTrigger,
    MisfireKind,
    MisfirePolicy,
    MissingHour,
    NotFound,
    OneShotTrigger,
    OverlapPolicy,
    RepeatedHour,
    ScheduleStatus,
    StaleVersion,
    Trigger,
)
from engine.domain.retry import RetryPolicy
from engine.domain.timeutil import HOUR_MS, MINUTE_MS, SECOND_MS, parse_instant
from engine.ports.schedules import ScheduleQuery
from engine.ports.storage import Storage
from engine.testing.conformance.builders import (
    CREATED_AT,
    make_schedule,
    must_raise,
    stored_schedule,
)
from engine.testing.conformance.storage import StorageConformance

# Every kind of trigger, with its non-default DST choices, to round-trip.
TRIGGERS: list[Trigger] = [
    CronTrigger("30 2 * * *", RepeatedHour.BOTH, MissingHour.SKIP),
    CronTrigger("*/15 * * * * *", RepeatedHour.LAST, MissingHour.SHIFT),
    IntervalTrigger(90 * SECOND_MS, parse_instant("2026-01-04T12:00:30Z")),
    OneShotTrigger(parse_instant("2026-03-01T09:00:00Z")),
]

# Threads updating one schedule at once.
WRITERS = 8

# The guarantees more than one test checks, as a failure names them.
OPTIMISTIC = "optimistic versions: "
STALE_UPDATE = (
    OPTIMISTIC + "an update whose expected_version is no longer current must raise StaleVersion"
)
UNKNOWN_UPDATE = "updating a schedule that does not exist must raise NotFound"
FOREIGN_DELETE = "tenant isolation: deleting another tenant's schedule must raise NotFound"
DUPLICATE_NAME = (
    "unique names: inserting a second schedule of one name in one tenant must raise DuplicateName"
)


class ScheduleStoreConformance(StorageConformance):
    """The schedule store (`Storage.schedules`, engine.ports.schedules.ScheduleStore).

    Guarantees checked:
    - round trip: every field of every kind of schedule reads back as it was written;
    - optimistic versions: an update or delete naming a version that is no longer current
      raises StaleVersion and changes nothing, and of threads updating from one version
      exactly one wins; the store, not the caller, moves the version on;
    - unique names: a second schedule of one name in one tenant raises DuplicateName, keeps
      the first, and leaves the caller's transaction usable;
    - tenant isolation: a read, find or delete in one tenant never reaches another's schedule;
    - queries: filters by tenant, status and literal name prefix, ordered by next fire
      instant (none last), paged by limit and offset.

    Subclass it and implement `open_storage`:

        class TestMyStore(ScheduleStoreConformance):
            def open_storage(self, clock, directory):
                return closing(MyStorage(directory / "store.db", clock))
    """

    # --- save and find ---------------------------------------------------------------------

    @pytest.mark.parametrize("trigger", TRIGGERS, ids=lambda t: t.describe())
    def test_every_trigger_kind_survives_a_round_trip(
        self, storage: Storage, trigger: Trigger
    ) -> None:
        schedule = make_schedule(trigger=trigger)
        storage.schedules.insert(schedule)

        found = storage.schedules.get(schedule.id)

        assert found is not None
        assert found.trigger == trigger, (
            "round trip: a schedule's trigger must read back exactly as it was inserted"
        )

    def test_every_field_survives_a_round_trip(self, storage: Storage) -> None:
        schedule = make_schedule(
            "billing.export_v2",
            tenant="acme",
            trigger=CronTrigger("0 9 * * 1-5", RepeatedHour.LAST, MissingHour.SKIP),
            timezone="Australia/Lord_Howe",
            command="reports.export",
            payload={
                "to": ["ops@example.com", "fin@example.com"],
                "limit": 250,
                "ratio": 0.75,
                "dry_run": False,
                "cursor": None,
                "note": "Zürich — 東京",
                "nested": {"a": {"b": [1, 2, {"c": True}]}},
            },
            misfire=MisfirePolicy(MisfireKind.EACH, 7, 2 * HOUR_MS, 5 * SECOND_MS),
            overlap=OverlapPolicy.BUFFER_ALL,
            jitter_ms=1500,
            status=ScheduleStatus.PAUSED,
            sensitive=True,
            metadata={"owner": "team-billing", "ticket": "OPS-42", "Env.Name": "prod"},
            version=1,
            next_slot_at=CREATED_AT + HOUR_MS,
            next_fire_at=CREATED_AT + HOUR_MS + 700,
            created_at=CREATED_AT,
            updated_at=CREATED_AT + 5,
            pause_note="paused for the quarter close — resume on the 3rd",
        )
        storage.schedules.insert(schedule)

        assert storage.schedules.get(schedule.id) == schedule, (
            "round trip: every field of an inserted schedule must read back unchanged"
        )

    def test_a_schedule_without_a_next_slot_survives_a_round_trip(self, storage: Storage) -> None:
        schedule = make_schedule(
            trigger=OneShotTrigger(CREATED_AT - MINUTE_MS), next_slot_at=None, next_fire_at=None
        )
        storage.schedules.insert(schedule)

        assert storage.schedules.get(schedule.id) == schedule, (
            "round trip: a schedule with no next slot (next_slot_at and next_fire_at None) must "
            "read back unchanged"
        )

    def test_insert_stores_version_1(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)

        found = storage.schedules.get(schedule.id)

        assert found is not None
        assert found.version == 1, OPTIMISTIC + "insert must store the schedule at version 1"

    def test_find_by_name_returns_the_stored_schedule(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, "hourly-sync", tenant="acme")

        assert storage.schedules.find_by_name("acme", "hourly-sync") == schedule

    def test_find_by_name_of_an_unknown_name_is_none(self, storage: Storage) -> None:
        stored_schedule(storage, "hourly-sync")

        assert storage.schedules.find_by_name("default", "hourly-syncs") is None

    def test_get_of_an_unknown_id_is_none(self, storage: Storage) -> None:
        stored_schedule(storage)

        assert storage.schedules.get("0" * 32) is None

    def test_get_in_its_own_tenant_returns_the_schedule(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")

        assert storage.schedules.get(schedule.id, tenant="acme") == schedule

    # --- update and optimistic versions ----------------------------------------------------

    def test_update_replaces_the_definition_and_status(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        changed = replace(
            schedule,
            status=ScheduleStatus.PAUSED,
            pause_note="maintenance",
            payload={"n": 2},
            command="echo",
            version=2,
            updated_at=CREATED_AT + 1,
        )

        storage.schedules.update(changed, expected_version=1)

        assert storage.schedules.get(schedule.id) == changed

    def test_update_stores_the_expected_version_plus_one(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)

        # The schedule as read (version 1): the store, not the caller, moves the version on.
        storage.schedules.update(
            replace(schedule, status=ScheduleStatus.PAUSED), expected_version=1
        )

        found = storage.schedules.get(schedule.id)
        assert found is not None
        assert found.version == 2, (
            OPTIMISTIC
            + "update must store expected_version + 1, whatever version the schedule it is "
            "given carries"
        )

    def test_sequential_updates_increment_the_version_each_time(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)

        for expected in (1, 2, 3):
            current = storage.schedules.get(schedule.id)
            assert current is not None
            assert current.version == expected
            storage.schedules.update(
                replace(current, jitter_ms=expected, version=expected + 1),
                expected_version=expected,
            )

        found = storage.schedules.get(schedule.id)
        assert found is not None
        assert (found.version, found.jitter_ms) == (4, 3), (
            OPTIMISTIC + "each update must land and move the version on by one"
        )

    def test_stale_update_raises_stale_version(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        storage.schedules.update(replace(schedule, jitter_ms=10, version=2), expected_version=1)

        with must_raise(StaleVersion, STALE_UPDATE):
            storage.schedules.update(replace(schedule, jitter_ms=20, version=2), expected_version=1)

    def test_stale_update_changes_nothing(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        winner = replace(schedule, jitter_ms=10, version=2)
        storage.schedules.update(winner, expected_version=1)

        with must_raise(StaleVersion, STALE_UPDATE):
            storage.schedules.update(
                replace(schedule, jitter_ms=20, status=ScheduleStatus.DISABLED, version=2),
                expected_version=1,
            )

        assert storage.schedules.get(schedule.id) == winner, (
            OPTIMISTIC + "an update refused as stale must change nothing"
        )

    def test_update_of_an_unknown_id_raises_not_found(self, storage: Storage) -> None:
        never_stored = make_schedule()

        with must_raise(NotFound, UNKNOWN_UPDATE):
            storage.schedules.update(replace(never_stored, version=2), expected_version=1)

    def test_update_of_an_unknown_id_stores_nothing(self, storage: Storage) -> None:
        never_stored = make_schedule()

        with must_raise(NotFound, UNKNOWN_UPDATE):
            storage.schedules.update(replace(never_stored, version=2), expected_version=1)

        assert storage.schedules.get(never_stored.id) is None, (
            "an update refused with NotFound must not insert the schedule"
        )
        assert storage.schedules.count() == 0

    def test_update_of_a_deleted_schedule_raises_not_found(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        storage.schedules.delete(schedule.id, schedule.tenant)

        with must_raise(NotFound, UNKNOWN_UPDATE):
            storage.schedules.update(replace(schedule, version=2), expected_version=1)

    # --- delete ----------------------------------------------------------------------------

    def test_delete_removes_the_schedule(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, "hourly-sync")

        storage.schedules.delete(schedule.id, schedule.tenant)

        assert storage.schedules.get(schedule.id) is None
        assert storage.schedules.find_by_name(schedule.tenant, "hourly-sync") is None
        assert storage.schedules.count() == 0

    def test_delete_frees_the_name_for_a_new_schedule(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, "hourly-sync")
        storage.schedules.delete(schedule.id, schedule.tenant)

        again = stored_schedule(storage, "hourly-sync")

        assert storage.schedules.find_by_name(schedule.tenant, "hourly-sync") == again

    def test_delete_with_the_current_version_removes_the_schedule(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        storage.schedules.update(replace(schedule, version=2), expected_version=1)

        storage.schedules.delete(schedule.id, schedule.tenant, expected_version=2)

        assert storage.schedules.get(schedule.id) is None

    def test_delete_with_a_stale_version_raises_and_keeps_the_schedule(
        self, storage: Storage
    ) -> None:
        schedule = stored_schedule(storage)
        updated = replace(schedule, version=2, jitter_ms=5)
        storage.schedules.update(updated, expected_version=1)

        with must_raise(
            StaleVersion,
            OPTIMISTIC
            + "a delete whose expected_version is no longer current must raise StaleVersion",
        ):
            storage.schedules.delete(schedule.id, schedule.tenant, expected_version=1)

        assert storage.schedules.get(schedule.id) == updated, (
            OPTIMISTIC + "a delete refused as stale must keep the schedule"
        )

    def test_delete_of_an_unknown_id_raises_not_found(self, storage: Storage) -> None:
        with must_raise(NotFound, "deleting a schedule that does not exist must raise NotFound"):
            storage.schedules.delete("0" * 32, "default")

    def test_delete_in_another_tenant_raises_not_found(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")

        with must_raise(NotFound, FOREIGN_DELETE):
            storage.schedules.delete(schedule.id, "globex")

    def test_delete_in_another_tenant_keeps_the_schedule(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")

        with must_raise(NotFound, FOREIGN_DELETE):
            storage.schedules.delete(schedule.id, "globex")

        assert storage.schedules.get(schedule.id) == schedule, (
            "tenant isolation: a delete under another tenant must leave the schedule in place"
        )

    # --- names -----------------------------------------------------------------------------

    def test_duplicate_name_in_one_tenant_raises_duplicate_name(self, storage: Storage) -> None:
        stored_schedule(storage, "hourly-sync", tenant="acme")

        with must_raise(DuplicateName, DUPLICATE_NAME):
            stored_schedule(storage, "hourly-sync", tenant="acme", command="echo")

    def test_duplicate_name_leaves_the_first_schedule_intact(self, storage: Storage) -> None:
        first = stored_schedule(storage, "hourly-sync", tenant="acme")
        second = make_schedule("hourly-sync", tenant="acme", command="echo", payload={"x": 1})

        with must_raise(DuplicateName, DUPLICATE_NAME):
            storage.schedules.insert(second)

        assert storage.schedules.find_by_name("acme", "hourly-sync") == first, (
            "unique names: a refused duplicate must leave the first schedule as it was"
        )
        assert storage.schedules.get(second.id) is None, (
            "unique names: a refused duplicate must not be stored"
        )
        assert storage.schedules.count("acme") == 1

    def test_a_refused_name_inside_a_transaction_leaves_the_transaction_usable(
        self, storage: Storage
    ) -> None:
        stored_schedule(storage, "hourly-sync", tenant="acme")

        with storage.atomic():
            with must_raise(DuplicateName, DUPLICATE_NAME):
                stored_schedule(storage, "hourly-sync", tenant="acme", command="echo")
            stored_schedule(storage, "nightly-sync", tenant="acme")

        assert storage.schedules.find_by_name("acme", "nightly-sync") is not None, (
            "unique names: after a refused insert, the next write in the same transaction must "
            "still land when it commits"
        )
        assert storage.schedules.count("acme") == 2

    def test_a_refused_rename_inside_a_transaction_leaves_the_transaction_usable(
        self, storage: Storage
    ) -> None:
        stored_schedule(storage, "hourly-sync", tenant="acme")
        other = stored_schedule(storage, "nightly-sync", tenant="acme")

        with storage.atomic():
            with must_raise(
                DuplicateName,
                "unique names: renaming a schedule to a name its tenant already uses must raise "
                "DuplicateName",
            ):
                storage.schedules.update(replace(other, name="hourly-sync"), expected_version=1)
            storage.schedules.update(replace(other, jitter_ms=7), expected_version=1)

        found = storage.schedules.get(other.id)
        assert found is not None
        assert (found.name, found.jitter_ms, found.version) == ("nightly-sync", 7, 2), (
            "unique names: after a refused rename, the next update in the same transaction must "
            "still land when it commits"
        )

    def test_same_name_in_two_tenants_is_two_schedules(self, storage: Storage) -> None:
        acme = stored_schedule(storage, "hourly-sync", tenant="acme")
        globex = stored_schedule(storage, "hourly-sync", tenant="globex", command="echo")

        assert storage.schedules.find_by_name("acme", "hourly-sync") == acme, (
            "unique names: a name is unique per tenant, not across tenants"
        )
        assert storage.schedules.find_by_name("globex", "hourly-sync") == globex
        assert storage.schedules.count() == 2

    # --- tenant isolation ------------------------------------------------------------------

    def test_get_in_another_tenant_is_none(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")

        assert storage.schedules.get(schedule.id, tenant="globex") is None, (
            "tenant isolation: get(id, tenant) must not return another tenant's schedule"
        )

    def test_get_without_a_tenant_finds_any_tenants_schedule(self, storage: Storage) -> None:
        schedule = stored_schedule(storage, tenant="acme")

        assert storage.schedules.get(schedule.id) == schedule

    def test_find_by_name_never_crosses_tenants(self, storage: Storage) -> None:
        stored_schedule(storage, "hourly-sync", tenant="acme")

        assert storage.schedules.find_by_name("globex", "hourly-sync") is None, (
            "tenant isolation: find_by_name must not return another tenant's schedule"
        )

    def test_query_by_tenant_returns_only_that_tenants_schedules(self, storage: Storage) -> None:
        acme = [stored_schedule(storage, f"job-{n}", tenant="acme") for n in range(3)]
        stored_schedule(storage, "job-0", tenant="globex")

        found = storage.schedules.query(ScheduleQuery(tenant="acme"))

        assert {s.id for s in found} == {s.id for s in acme}, (
            "tenant isolation: a query for one tenant must return that tenant's schedules only"
        )

    def test_query_without_a_tenant_sees_every_tenant(self, storage: Storage) -> None:
        acme = stored_schedule(storage, "job", tenant="acme")
        globex = stored_schedule(storage, "job", tenant="globex")

        found = storage.schedules.query(ScheduleQuery())

        assert {s.id for s in found} == {acme.id, globex.id}

    # --- queries ---------------------------------------------------------------------------

    def test_query_by_status_returns_only_that_status(self, storage: Storage) -> None:
        active = stored_schedule(storage, "active-job")
        paused = stored_schedule(storage, "paused-job", status=ScheduleStatus.PAUSED)
        stored_schedule(storage, "disabled-job", status=ScheduleStatus.DISABLED)

        assert storage.schedules.query(ScheduleQuery(status=ScheduleStatus.ACTIVE)) == [active]
        assert storage.schedules.query(ScheduleQuery(status=ScheduleStatus.PAUSED)) == [paused]

    def test_execution_limits_give_each_existing_schedules_timeout_and_retry(
        self, storage: Storage
    ) -> None:
        limited = stored_schedule(
            storage,
            "limited",
            tenant="acme",
            timeout_ms=30_000,
            retry=RetryPolicy(max_attempts=5, backoff_ms=2_000, backoff_cap_ms=60_000),
        )
        plain = stored_schedule(storage, "plain", tenant="globex")
        stored_schedule(storage, "other", tenant="acme")

        found = storage.schedules.execution_limits([limited.id, plain.id, "no-such-id"])

        assert found == {
            limited.id: (30_000, limited.retry),
            plain.id: (None, plain.retry),
        }, "execution_limits: each existing schedule's timeout_ms and retry policy, any tenant"
        assert storage.schedules.execution_limits([]) == {}

    def test_query_without_a_status_includes_every_status(self, storage: Storage) -> None:
        for status in ScheduleStatus:
            stored_schedule(storage, f"job-{status.value}", status=status)

        found = storage.schedules.query(ScheduleQuery())

        assert {s.status for s in found} == set(ScheduleStatus)

    def test_query_by_name_prefix_returns_the_names_that_start_with_it(
        self, storage: Storage
    ) -> None:
        for name in ("report-daily", "report-weekly", "reports", "sync-report"):
            stored_schedule(storage, name)

        found = storage.schedules.query(ScheduleQuery(name_prefix="report-"))

        assert sorted(s.name for s in found) == ["report-daily", "report-weekly"]

    def test_query_name_prefix_is_literal_not_a_pattern(self, storage: Storage) -> None:
        # '_' and '%' are wildcards in SQL LIKE; in a prefix they are plain characters.
        for name in ("a_b", "axb", "a.b", "a-b"):
            stored_schedule(storage, name)

        assert [s.name for s in storage.schedules.query(ScheduleQuery(name_prefix="a_"))] == [
            "a_b"
        ], "a name prefix is literal text: '_' and '%' in it are no wildcards"
        assert [s.name for s in storage.schedules.query(ScheduleQuery(name_prefix="a."))] == ["a.b"]

    def test_query_combines_tenant_status_and_prefix(self, storage: Storage) -> None:
        wanted = stored_schedule(storage, "report-daily", tenant="acme")
        stored_schedule(storage, "report-weekly", tenant="acme", status=ScheduleStatus.PAUSED)
        stored_schedule(storage, "sync", tenant="acme")
        stored_schedule(storage, "report-daily", tenant="globex")

        found = storage.schedules.query(
            ScheduleQuery(tenant="acme", status=ScheduleStatus.ACTIVE, name_prefix="report")
        )

        assert found == [wanted]

    def test_query_orders_by_next_fire_at_with_none_last(self, storage: Storage) -> None:
        due = {"later": 3, "never": None, "soonest": 1, "middle": 2, "also-never": None}
        for name, minutes in due.items():
            at = None if minutes is None else CREATED_AT + minutes * MINUTE_MS
            stored_schedule(storage, name, next_slot_at=at, next_fire_at=at)

        names = [s.name for s in storage.schedules.query(ScheduleQuery())]

        assert names[:3] == ["soonest", "middle", "later"]
        assert sorted(names[3:]) == ["also-never", "never"]

    def test_query_limit_and_offset_page_through_in_order(self, storage: Storage) -> None:
        for n in range(5):
            at = CREATED_AT + n * MINUTE_MS
            stored_schedule(storage, f"job-{n}", next_slot_at=at, next_fire_at=at)

        first_page = storage.schedules.query(ScheduleQuery(limit=2))
        second_page = storage.schedules.query(ScheduleQuery(limit=2, offset=2))
        last_page = storage.schedules.query(ScheduleQuery(limit=2, offset=4))

        assert [s.name for s in first_page] == ["job-0", "job-1"]
        assert [s.name for s in second_page] == ["job-2", "job-3"]
        assert [s.name for s in last_page] == ["job-4"]

    def test_query_returns_whole_schedules(self, storage: Storage) -> None:
        schedule = stored_schedule(
            storage, payload={"to": "ops"}, metadata={"owner": "ops"}, sensitive=True
        )

        assert storage.schedules.query(ScheduleQuery()) == [schedule]

    # --- count -----------------------------------------------------------------------------

    def test_count_of_an_empty_store_is_zero(self, storage: Storage) -> None:
        assert storage.schedules.count() == 0
        assert storage.schedules.count("acme") == 0

    def test_count_per_tenant_and_overall(self, storage: Storage) -> None:
        for n in range(3):
            stored_schedule(storage, f"job-{n}", tenant="acme")
        stored_schedule(storage, "job-0", tenant="globex")

        assert storage.schedules.count("acme") == 3
        assert storage.schedules.count("globex") == 1
        assert storage.schedules.count("initech") == 0
        assert storage.schedules.count() == 4

    # --- concurrency -----------------------------------------------------------------------

    def test_threads_updating_from_one_version_let_exactly_one_win(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)
        barrier = threading.Barrier(WRITERS)

        def update(jitter_ms: int) -> str:
            barrier.wait(timeout=30)  # start every update together
            try:
                storage.schedules.update(
                    replace(schedule, jitter_ms=jitter_ms, version=2), expected_version=1
                )
            except StaleVersion:
                return "stale"
            return f"won:{jitter_ms}"

        with ThreadPoolExecutor(max_workers=WRITERS) as pool:
            outcomes = list(pool.map(update, range(1, WRITERS + 1), timeout=60))

        winners = [o for o in outcomes if o.startswith("won:")]
        assert len(winners) == 1, (
            f"{OPTIMISTIC}of {WRITERS} threads updating from version 1 exactly one must win "
            f"and the others raise StaleVersion; got {outcomes}"
        )
        assert outcomes.count("stale") == WRITERS - 1
        found = storage.schedules.get(schedule.id)
        assert found is not None
        assert (found.version, f"won:{found.jitter_ms}") == (2, winners[0])

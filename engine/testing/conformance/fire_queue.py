"""The fire queue's contract (engine.ports.fire_queue): job-store claims, fencing, overlap, and
the run ledger that follows every fire.

Modelled on the reference job store's conformance list (reference-behaviour.md, B6). Time moves
only through the manual clock; every fire the builders enqueue is available before T0 (the
clock's start), so it is claimable at once unless a test says otherwise.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any

import pytest

from engine import ManualClock, RunKind, RunState
from engine.domain.overlap import (
    SKIPPED_BUFFER,
    SKIPPED_DELETED,
    SKIPPED_OVERLAP,
    SKIPPED_PAUSED,
    SUPERSEDED,
)
from engine.domain.schedule import OverlapPolicy, Schedule, ScheduleStatus
from engine.ports.fire_queue import Claim, FireQuery, FireState, Outcome, Settlement
from engine.ports.storage import Storage
from engine.testing.conformance.builders import make_run, stored_schedule
from engine.testing.conformance.fire_builders import (
    TTL_MS,
    TTL_S,
    claim,
    claimed_ids,
    complete,
    discard,
    enqueue,
    enqueue_slots,
    fail,
    fire_of,
    new_fire,
    release,
    reschedule,
    run_of,
    settlement_for,
    slot,
)
from engine.testing.conformance.storage import StorageConformance

LATER_MS = 60_000  # how far ahead a retry or a requeue is put


def free_schedule(storage: Storage, name: str = "free", **changes: Any) -> Schedule:
    """A schedule whose fires never hold each other back (overlap allow)."""
    return stored_schedule(storage, name, overlap=OverlapPolicy.ALLOW, **changes)


def pause(storage: Storage, schedule: Schedule) -> None:
    """Pause `schedule` (as stored at `schedule.version`)."""
    storage.schedules.update(replace(schedule, status=ScheduleStatus.PAUSED), schedule.version)


def settle_one(storage: Storage, taken: Claim, settlement: Settlement) -> None:
    """Settle one fire of `taken`, which must land."""
    report = storage.fire_queue.settle(taken.token, taken.consumer, [settlement])
    assert report.acked == [settlement.run_id]


# --- requeue and purge ---------------------------------------------------------------------


def dead_letter(
    storage: Storage, schedule: Schedule, at: int, state: RunState = RunState.DEAD_LETTERED
) -> int:
    """A fire of `schedule` that failed once, then was discarded (its run left in `state`)."""
    run_id = enqueue(storage, schedule, at)
    settle_one(storage, claim(storage, limit=1), fail(run_id, at, "e1"))
    settle_one(storage, claim(storage, limit=1), discard(run_id, "e2", state=state))
    return run_id


# --- read, pending, depth ------------------------------------------------------------------


def one_fire_per_state(storage: Storage, clock: ManualClock) -> dict[FireState, int]:
    """One fire in each state a fire can be in, by state."""
    schedule = free_schedule(storage)
    held, done, dead = enqueue_slots(storage, schedule, 3)
    taken = claim(storage)
    storage.fire_queue.settle(taken.token, taken.consumer, [complete(done), discard(dead)])
    claimable = enqueue(storage, schedule, slot(4))
    scheduled = enqueue(storage, schedule, slot(5), available_at=clock.now_ms() + LATER_MS)
    return {
        FireState.CLAIMED: held,
        FireState.COMPLETED: done,
        FireState.DISCARDED: dead,
        FireState.CLAIMABLE: claimable,
        FireState.SCHEDULED: scheduled,
    }


# --- the run ledger follows ----------------------------------------------------------------

SETTLED_RUNS = [
    (Outcome.COMPLETE, RunState.COMPLETED),
    (Outcome.COMPLETE, RunState.SKIPPED),
    (Outcome.COMPLETE, RunState.CANCELLED),
    (Outcome.FAIL, RunState.DISPATCHED),
    (Outcome.RESCHEDULE, RunState.DISPATCHED),
    (Outcome.DISCARD, RunState.DEAD_LETTERED),
    (Outcome.DISCARD, RunState.FAILED),
    (Outcome.RELEASE, RunState.DISPATCHED),
]


# --- overlap, decided inside the claim -----------------------------------------------------


def running_fire(
    storage: Storage, policy: OverlapPolicy, name: str = "job"
) -> tuple[Schedule, int, Claim]:
    """A schedule with `policy` whose slot-0 fire runs under worker-a's claim."""
    schedule = stored_schedule(storage, name, overlap=policy)
    run_id = enqueue(storage, schedule, slot(0))
    taken = claim(storage, "worker-a")
    assert claimed_ids(taken) == [run_id]
    return schedule, run_id, taken


def assert_ended_unrun(
    storage: Storage, clock: ManualClock, run_id: int, state: RunState, reason: str
) -> None:
    """The fire was closed at claim time and its run ended in `state`, saying why."""
    assert fire_of(storage, run_id).state_at(clock.now_ms()) is FireState.COMPLETED
    run = run_of(storage, run_id)
    assert (run.state, run.error, run.attempts) == (state, reason, 0)


def assert_waiting(storage: Storage, clock: ManualClock, *run_ids: int) -> None:
    """The fires are claimable and their runs still dispatched: they wait their turn."""
    for run_id in run_ids:
        assert fire_of(storage, run_id).state_at(clock.now_ms()) is FireState.CLAIMABLE
        assert run_of(storage, run_id).state is RunState.DISPATCHED


# --- concurrency ---------------------------------------------------------------------------

CLAIMERS = 4


def claim_until_empty(storage: Storage, consumer: str, barrier: threading.Barrier) -> list[Claim]:
    """Claim in small batches until a claim decides nothing (on this thread's connection).

    A claim that only skipped or cancelled fires made progress too (the consumer claims again
    at once after one): where consumers claim side by side, the fires one claim skips need
    not come with any it takes."""
    barrier.wait(timeout=30)
    claims = []
    while True:
        taken = claim(storage, consumer, limit=7, ttl_ms=3_600_000)
        if not (taken.fires or taken.skipped or taken.cancelled):
            break
        claims.append(taken)
    return claims


def race_claimers(storage: Storage) -> list[Claim]:
    """CLAIMERS threads claiming side by side until none decides anything; every claim."""
    barrier = threading.Barrier(CLAIMERS)
    with ThreadPoolExecutor(max_workers=CLAIMERS) as pool:
        futures = [
            pool.submit(claim_until_empty, storage, f"worker-{n}", barrier) for n in range(CLAIMERS)
        ]
        return [c for future in futures for c in future.result(timeout=120)]


def claimable_left(storage: Storage) -> int:
    """How many fires are claimable now."""
    return len(
        storage.fire_queue.read(FireQuery(states=frozenset({FireState.CLAIMABLE}), limit=10_000))
    )


def claim_until_drained(storage: Storage, consumer: str, barrier: threading.Barrier) -> list[Claim]:
    """Claim in small batches until no fire is claimable. (A claim may come back empty while
    other consumers hold every candidate; that is no sign the queue is drained.)"""
    barrier.wait(timeout=30)
    claims = []
    while True:
        taken = claim(storage, consumer, limit=7, ttl_ms=3_600_000)
        if taken.fires:
            claims.append(taken)
        elif not claimable_left(storage):
            return claims


def consume_until_done(
    storage: Storage, consumer: str, barrier: threading.Barrier, order: list[list[int]]
) -> None:
    """Settle every fire taken as completed and claim again, in one call each round, until
    the queue is empty. Each fire claimed is recorded in `order` with the fires of its
    schedule claimed at that moment (itself, when it runs alone)."""
    barrier.wait(timeout=30)
    done: list[Settlement] = []
    token = ""
    while True:
        _, taken = storage.fire_queue.settle_and_claim(
            {token: done} if done else {}, consumer=consumer, ttl_ms=3_600_000, limit=3
        )
        for fire in taken.fires:
            mates = storage.fire_queue.read(
                FireQuery(schedule_id=fire.schedule_id, states=frozenset({FireState.CLAIMED}))
            )
            order.append([fire.run_id, *(m.run_id for m in mates if m.run_id != fire.run_id)])
        token, done = taken.token, [complete(f.run_id) for f in taken.fires]
        if not done and not storage.fire_queue.depth():
            return


def in_open_transaction(
    storage: Storage, act: Callable[[], Claim], done: threading.Event, release: threading.Event
) -> Claim:
    """`act` inside a transaction left open (its changes uncommitted) until `release`."""
    with storage.atomic():
        taken = act()
        done.set()
        assert release.wait(timeout=30)
    return taken


def beside_an_open_claim(
    storage: Storage,
    *,
    hold_s: float,
    commands_a: set[str] | None = None,
    commands_b: set[str] | None = None,
) -> tuple[Claim, Claim, bool]:
    """worker-a claims in a transaction left open; worker-b claims meanwhile; worker-a commits
    once worker-b is done, or after `hold_s`. Both claims, and whether worker-b was done
    before worker-a committed."""
    claimed, release = threading.Event(), threading.Event()
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(
            in_open_transaction,
            storage,
            lambda: storage.fire_queue.claim(
                consumer="worker-a", ttl_ms=TTL_MS, limit=10, commands=commands_a
            ),
            claimed,
            release,
        )
        assert claimed.wait(timeout=30)
        second = pool.submit(
            storage.fire_queue.claim,
            consumer="worker-b",
            ttl_ms=TTL_MS,
            limit=30,
            commands=commands_b,
        )
        # A store that runs one writer at a time (SQLite) finishes the second claim only
        # after the first commits.
        early = bool(wait([second], timeout=hold_s).done)
        release.set()
        return first.result(timeout=30), second.result(timeout=30), early


def beside_an_open_takeover(storage: Storage, late: Callable[[], Any]) -> tuple[Claim, Any]:
    """worker-b takes over the expired claims in a transaction left open; `late` (the old
    holder's call) starts meanwhile, and waits, on every backend, for the takeover's rows."""
    done, release = threading.Event(), threading.Event()
    with ThreadPoolExecutor(max_workers=2) as pool:
        takeover = pool.submit(
            in_open_transaction, storage, lambda: claim(storage, "worker-b"), done, release
        )
        assert done.wait(timeout=30)
        reply = pool.submit(late)
        wait([reply], timeout=0.5)
        release.set()
        return takeover.result(timeout=30), reply.result(timeout=30)


class FireQueueConformance(StorageConformance):
    """Checks `Storage.fire_queue` (FireQueue), with the run ledger (`Storage.runs`) each fire
    moves and the schedules (`Storage.schedules`) whose overlap policy a claim applies.

    Guarantees:
    - enqueue is idempotent by slot key (the ledger decides "already fired"), reports what it
      inserted, and never moves a schedule's cursor;
    - a claim takes claimable fires oldest available first under one fresh token and TTL;
      no fire is ever held by two live claims, even with many consumers claiming at once or
      beside an uncommitted claim; an expired claim is simply claimable again, its
      abandonment counted;
    - fencing: a heartbeat or settle under a superseded token (a takeover, a requeue, an
      earlier settle) is reported stale and changes nothing; a late one that nobody
      superseded still lands; staleness never raises;
    - each of the five outcomes (complete, fail, reschedule, discard, release) leaves the fire
      and its run where the port says, with their counters and streaks;
    - requeue re-arms dead letters and fences the holder; purge deletes only dead letters;
      neither crosses tenants;
    - the overlap policies (skip, buffer one, buffer all, allow, cancel other), pausing and
      deleting are applied inside the claim's transaction.

    Subclass it and implement `open_storage` (see StorageConformance):

        class TestMyStore(FireQueueConformance):
            def open_storage(self, clock, directory):
                return closing(MyStore(directory / "store.db", clock))

    A store that runs one write transaction at a time, as SQLite does, sets
    `serialises_writes = True`: there a claim waits for another's commit, by design.
    """

    # True for a store that runs one write transaction at a time: one consumer's claim then
    # waits for another's uncommitted claim, which the port allows.
    serialises_writes = False

    # --- enqueue and get -----------------------------------------------------------------------

    def test_enqueue_then_get_returns_the_fire_with_its_runs_fields(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = stored_schedule(storage, "hourly-sync", tenant="acme")
        wanted = new_fire(schedule, slot(1), command="send-mail", payload={"to": ["ops"], "n": 1})
        assert storage.fire_queue.get(1) is None

        (run_id,) = storage.fire_queue.enqueue([wanted], available_at=slot(1) + 7).inserted
        fire = fire_of(storage, run_id)

        assert (fire.tenant, fire.schedule_id, fire.schedule_name) == (
            "acme",
            schedule.id,
            "hourly-sync",
        )
        assert (fire.slot_key, fire.slot_at, fire.kind) == (
            wanted.slot_key,
            slot(1),
            RunKind.SCHEDULED,
        )
        assert (fire.command, fire.payload) == ("send-mail", {"to": ["ops"], "n": 1})
        assert (fire.available_at, fire.created_at, fire.attempts) == (
            slot(1) + 7,
            clock.now_ms(),
            0,
        )
        assert (fire.consecutive_failures, fire.reschedules, fire.abandoned_count) == (0, 0, 0)
        assert (fire.stale_ack_count, fire.lease_token, fire.consumed_by) == (0, None, None)
        assert fire.state_at(clock.now_ms()) is FireState.CLAIMABLE

    def test_enqueue_records_a_dispatched_run_for_each_fire(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = stored_schedule(storage)
        wanted = new_fire(schedule, slot(1), kind=RunKind.BACKFILL, node_id="node-7")

        (run_id,) = storage.fire_queue.enqueue([wanted], available_at=slot(1)).inserted
        run = run_of(storage, run_id)

        assert (run.state, run.kind, run.node_id) == (
            RunState.DISPATCHED,
            RunKind.BACKFILL,
            "node-7",
        )
        assert (run.slot_key, run.slot_at) == (wanted.slot_key, slot(1))
        assert (run.dispatched_at, run.attempts, run.consumer) == (clock.now_ms(), 0, None)

    def test_enqueue_reports_the_inserted_run_ids_in_the_order_given(
        self, storage: Storage
    ) -> None:
        schedule = stored_schedule(storage)
        order = [slot(3), slot(1), slot(2)]

        report = storage.fire_queue.enqueue(
            [new_fire(schedule, at) for at in order], available_at=slot(0)
        )

        assert [fire_of(storage, rid).slot_at for rid in report.inserted] == order
        assert report.already == []

    def test_enqueue_skips_slot_keys_the_ledger_holds_and_stores_the_rest(
        self, storage: Storage
    ) -> None:
        schedule = stored_schedule(storage)
        first = enqueue(storage, schedule, slot(1))
        before = fire_of(storage, first)
        storage.runs.record(make_run(schedule, slot(2)), slot(2))  # dispatched, fire elsewhere
        again = new_fire(schedule, slot(1), command="other", payload={"x": 1})
        recorded = new_fire(schedule, slot(2))
        copy_1, copy_2 = (
            new_fire(schedule, slot(3), payload={"copy": 1}),
            new_fire(schedule, slot(3)),
        )

        report = storage.fire_queue.enqueue([again, recorded, copy_1, copy_2], available_at=slot(0))

        assert report.already == [again.slot_key, recorded.slot_key, copy_2.slot_key], (
            "exactly once: enqueue must skip every slot key the ledger (or the batch) holds"
        )
        (inserted,) = report.inserted
        assert fire_of(storage, inserted).payload == {"copy": 1}  # the first copy in a batch wins
        assert fire_of(storage, first) == before, "enqueue of a held slot key must change nothing"
        assert (storage.fire_queue.depth(), storage.runs.count()) == (2, 3)

    def test_enqueue_never_moves_the_schedules_cursor(self, storage: Storage) -> None:
        schedule = stored_schedule(storage)

        storage.fire_queue.enqueue(
            [new_fire(schedule, slot(n)) for n in range(3)]
            + [new_fire(schedule, slot(9), kind=RunKind.MANUAL)],
            available_at=slot(0),
        )

        assert storage.schedules.get(schedule.id) == schedule, (
            "enqueue must never move the schedule's cursor (only dispatch does)"
        )

    # --- claim ---------------------------------------------------------------------------------

    def test_claim_takes_claimable_fires_oldest_available_first_up_to_the_limit(
        self,
        storage: Storage,
    ) -> None:
        schedule = free_schedule(storage)
        # Created newest first: the order is the order of availability, not of creation.
        ids = [enqueue(storage, schedule, slot(n)) for n in reversed(range(5))][::-1]

        taken = claim(storage, limit=3)

        assert claimed_ids(taken) == ids[:3], (
            "a claim takes claimable fires oldest available first, at most `limit`"
        )
        assert claimed_ids(claim(storage, "worker-b", limit=10)) == ids[3:]

    def test_claim_stamps_one_token_and_one_deadline_across_the_batch(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = free_schedule(storage)
        ids = enqueue_slots(storage, schedule, 3)

        taken = claim(storage, "worker-a")

        assert (taken.consumer, taken.claimed_till) == ("worker-a", clock.now_ms() + TTL_MS)
        for fire in [*taken.fires, *(fire_of(storage, rid) for rid in ids)]:
            assert (fire.lease_token, fire.consumed_till) == (taken.token, taken.claimed_till)
            assert (fire.consumed_by, fire.attempts) == ("worker-a", 1)
            assert fire.state_at(clock.now_ms()) is FireState.CLAIMED

    def test_every_claim_mints_a_fresh_token_even_when_it_takes_nothing(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        tokens = {claim(storage).token for _ in range(3)}
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        nothing = claim(storage, limit=0)
        full = claim(storage)
        empty = claim(storage)

        assert len({*tokens, nothing.token, full.token, empty.token}) == 6, (
            "every claim must mint a fresh token, even one that takes nothing"
        )
        assert all(tokens)
        assert (nothing.fires, claimed_ids(full)) == ([], [run_id])
        assert (empty.fires, empty.claimed_till) == ([], clock.now_ms() + TTL_MS)

    def test_a_claim_without_a_positive_ttl_is_refused(self, storage: Storage) -> None:
        enqueue(storage, free_schedule(storage), slot(1))

        for ttl_ms in (0, -1):
            with pytest.raises(ValueError, match="TTL"):
                claim(storage, ttl_ms=ttl_ms)

        assert storage.fire_queue.read(FireQuery(states=frozenset({FireState.CLAIMABLE})))

    def test_claim_waits_for_a_fires_available_at(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = free_schedule(storage)
        at = clock.now_ms() + LATER_MS
        run_id = enqueue(storage, schedule, slot(1), available_at=at)

        assert claim(storage).fires == [], "a fire must not be claimed before its available_at"
        assert fire_of(storage, run_id).state_at(clock.now_ms()) is FireState.SCHEDULED

        clock.set(at)  # available_at <= now: claimable on the instant
        assert claimed_ids(claim(storage)) == [run_id]

    def test_claim_takes_only_fires_whose_command_is_listed(self, storage: Storage) -> None:
        schedule = free_schedule(storage)
        a = enqueue(storage, schedule, slot(1), command="alpha")
        enqueue(storage, schedule, slot(2), command="beta")
        c = enqueue(storage, schedule, slot(3), command="gamma")

        assert (
            storage.fire_queue.claim(consumer="w", ttl_ms=TTL_MS, limit=10, commands=[]).fires == []
        )
        taken = storage.fire_queue.claim(
            consumer="w", ttl_ms=TTL_MS, limit=10, commands={"alpha", "gamma", "delta"}
        )

        assert claimed_ids(taken) == [a, c]

    def test_an_expired_claim_is_taken_over_and_its_abandonment_counted(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        first = claim(storage, "worker-a")
        clock.advance(TTL_S - 0.001)
        assert claim(storage, "worker-b").fires == [], (
            "a fire under a live claim must not be claimed by anyone else"
        )
        clock.advance(0.001)  # its deadline: no longer live

        second = claim(storage, "worker-b")

        assert claimed_ids(second) == [run_id], (
            "an expired claim's fire must be claimable again at its deadline (no reaper)"
        )
        (fire,) = second.fires
        assert (fire.run_id, fire.attempts, fire.consumed_by) == (run_id, 2, "worker-b")
        assert (fire.abandoned_count, fire.last_abandoned_by) == (1, "worker-a"), (
            "a takeover of an expired claim must count the abandonment and say by whom"
        )
        assert fire.last_abandoned_at == first.claimed_till
        run = run_of(storage, run_id)
        assert (run.state, run.attempts, run.abandoned, run.consumer) == (
            RunState.RUNNING,
            2,
            1,
            "worker-b",
        )

    def test_abandonment_accumulates_and_remembers_the_latest_deserter(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        claim(storage, "worker-a")
        clock.advance(TTL_S + 1)
        second = claim(storage, "worker-b")
        clock.advance(TTL_S + 1)

        claim(storage, "worker-c")

        fire = fire_of(storage, run_id)
        assert (fire.abandoned_count, fire.last_abandoned_by) == (2, "worker-b")
        assert (fire.last_abandoned_at, fire.attempts) == (second.claimed_till, 3)

    def test_a_released_or_retried_fire_is_reclaimed_without_abandonment(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        released, retried = enqueue_slots(storage, free_schedule(storage), 2)
        first = claim(storage, "worker-a")
        storage.fire_queue.settle(
            first.token, "worker-a", [release(released), fail(retried, clock.now_ms())]
        )

        second = claim(storage, "worker-b")  # at once: released means available now

        assert claimed_ids(second) == [released, retried]
        assert [(f.attempts, f.abandoned_count) for f in second.fires] == [(2, 0), (2, 0)]
        assert {f.last_abandoned_by for f in second.fires} == {None}

    def test_claim_moves_the_run_to_running_with_attempts_start_and_consumer(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        settle_one(storage, claim(storage, "worker-a"), fail(run_id, clock.now_ms()))
        clock.advance(5)

        claim(storage, "worker-b")

        run = run_of(storage, run_id)
        assert (run.state, run.attempts) == (RunState.RUNNING, 2)
        assert (run.started_at, run.consumer) == (clock.now_ms(), "worker-b")
        assert (run.finished_at, run.exit_code, run.output) == (None, None, None)

    # --- heartbeat -----------------------------------------------------------------------------

    def test_heartbeat_extends_the_claim(self, storage: Storage, clock: ManualClock) -> None:
        ids = enqueue_slots(storage, free_schedule(storage), 2)
        taken = claim(storage, "worker-a")
        clock.advance(TTL_S - 5)

        report = storage.fire_queue.heartbeat(taken.token, TTL_MS, ids)

        assert (report.extended, report.stale, report.cancel_requested) == (ids, [], []), (
            "a heartbeat under the live claim's token must extend every fire it holds"
        )
        assert {fire_of(storage, rid).consumed_till for rid in ids} == {clock.now_ms() + TTL_MS}
        clock.advance(10)  # past the first deadline, within the extended one
        assert claim(storage, "worker-b").fires == [], (
            "a fire whose claim a heartbeat extended must not be claimed by anyone else"
        )

    def test_heartbeat_after_expiry_still_lands_while_nobody_reclaimed(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        taken = claim(storage, "worker-a")
        clock.advance(TTL_S + 10)

        report = storage.fire_queue.heartbeat(taken.token, TTL_MS, [run_id])

        assert report.extended == [run_id], (
            "a late heartbeat must still land while nobody has claimed the fire since"
        )
        assert fire_of(storage, run_id).state_at(clock.now_ms()) is FireState.CLAIMED
        assert claim(storage, "worker-b").fires == []

    def test_heartbeat_of_a_foreign_token_an_unknown_or_a_settled_fire_is_stale_and_not_counted(
        self,
        storage: Storage,
    ) -> None:
        held, done = enqueue_slots(storage, free_schedule(storage), 2)
        taken = claim(storage, "worker-a")
        settle_one(storage, taken, complete(done))
        before = fire_of(storage, held), fire_of(storage, done)

        foreign = storage.fire_queue.heartbeat("not-a-token", TTL_MS, [held])
        unknown = storage.fire_queue.heartbeat(taken.token, TTL_MS, [424242])
        settled = storage.fire_queue.heartbeat(taken.token, TTL_MS, [done])
        nothing = storage.fire_queue.heartbeat(taken.token, TTL_MS, [])

        assert [r.stale for r in (foreign, unknown, settled)] == [[held], [424242], [done]], (
            "fencing: a heartbeat under a token that does not hold the fire must be reported stale"
        )
        assert [r.extended for r in (foreign, unknown, settled, nothing)] == [[], [], [], []]
        assert (nothing.stale, nothing.cancel_requested) == ([], [])
        assert (fire_of(storage, held), fire_of(storage, done)) == before, (
            "fencing: a stale heartbeat must change nothing, not even a counter"
        )

    def test_heartbeat_of_a_mixed_batch_reports_only_the_reclaimed_fires_stale(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        ids = enqueue_slots(storage, free_schedule(storage), 3)
        first = claim(storage, "worker-a")
        clock.advance(TTL_S + 1)
        second = claim(storage, "worker-b", limit=1)  # takes over the oldest only

        report = storage.fire_queue.heartbeat(first.token, 10 * TTL_MS, ids)

        assert (report.extended, report.stale) == (ids[1:], ids[:1]), (
            "fencing: a heartbeat must extend the fires its token still holds and report the "
            "ones another claim took over stale"
        )
        taken_over = fire_of(storage, ids[0])  # the new claim is left alone, nothing counted
        assert (taken_over.lease_token, taken_over.consumed_till) == (
            second.token,
            second.claimed_till,
        ), "fencing: a stale heartbeat must leave the new claim as it is"
        assert taken_over.stale_ack_count == 0

    # --- the five outcomes ---------------------------------------------------------------------

    def test_complete_closes_the_fire_and_completes_its_run(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        taken = claim(storage, "worker-a")
        clock.advance(3)

        settle_one(storage, taken, complete(run_id, output="ok\n", exit_code=0))

        fire = fire_of(storage, run_id)
        assert fire.state_at(clock.now_ms()) is FireState.COMPLETED
        assert (fire.completed_at, fire.lease_token, fire.consumed_till) == (
            clock.now_ms(),
            None,
            None,
        )
        assert fire.consumed_by == "worker-a"  # who last held it stays readable
        run = run_of(storage, run_id)
        assert (run.state, run.output, run.exit_code) == (RunState.COMPLETED, "ok\n", 0)
        assert (run.finished_at, run.duration_ms) == (clock.now_ms(), 3000)
        assert storage.fire_queue.depth() == 0
        assert claim(storage, "worker-b").fires == [], (
            "a completed fire must never be claimed again"
        )

    def test_fail_retries_at_the_given_instant_and_bumps_the_failure_streak(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        at = clock.now_ms() + LATER_MS

        settle_one(storage, claim(storage), fail(run_id, at, error="exit 3"))

        fire = fire_of(storage, run_id)
        assert (fire.available_at, fire.last_error, fire.lease_token) == (at, "exit 3", None)
        assert (fire.consecutive_failures, fire.reschedules) == (1, 0)
        assert fire.state_at(clock.now_ms()) is FireState.SCHEDULED
        assert (run_of(storage, run_id).state, run_of(storage, run_id).error) == (
            RunState.DISPATCHED,
            "exit 3",
        )
        clock.set(at)
        assert claimed_ids(claim(storage)) == [run_id], (
            "a failed fire must be claimable again at the retry instant its settlement gave"
        )

    def test_reschedule_runs_again_at_the_given_instant_without_a_failure(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        at = clock.now_ms() + LATER_MS

        settle_one(storage, claim(storage), reschedule(run_id, at))

        fire = fire_of(storage, run_id)
        assert (fire.available_at, fire.reschedules, fire.consecutive_failures) == (at, 1, 0)
        assert fire.state_at(clock.now_ms()) is FireState.SCHEDULED
        assert run_of(storage, run_id).state is RunState.DISPATCHED

    def test_discard_dead_letters_the_fire_with_its_reason(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))

        settle_one(storage, claim(storage), discard(run_id, "bad payload"))

        fire = fire_of(storage, run_id)
        assert fire.state_at(clock.now_ms()) is FireState.DISCARDED
        assert (fire.discarded_at, fire.discard_reason, fire.last_error) == (
            clock.now_ms(),
            "bad payload",
            "bad payload",
        )
        assert (fire.lease_token, fire.completed_at) == (None, None)
        assert (run_of(storage, run_id).state, run_of(storage, run_id).error) == (
            RunState.DEAD_LETTERED,
            "bad payload",
        )
        assert storage.fire_queue.depth() == 0
        assert claim(storage, "worker-b").fires == [], (
            "a dead-lettered fire must never be claimed again until it is requeued"
        )

    def test_release_gives_the_fire_back_at_once_and_changes_no_counter(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        settle_one(storage, claim(storage), fail(run_id, clock.now_ms()))
        settle_one(storage, claim(storage), reschedule(run_id, clock.now_ms()))
        before = fire_of(storage, run_id)

        settle_one(storage, claim(storage), release(run_id))

        fire = fire_of(storage, run_id)
        assert fire.state_at(clock.now_ms()) is FireState.CLAIMABLE
        assert (fire.available_at, fire.lease_token) == (before.available_at, None)
        assert (fire.consecutive_failures, fire.reschedules) == (0, 1)
        assert (fire.attempts, fire.abandoned_count, fire.stale_ack_count) == (3, 0, 0)
        assert run_of(storage, run_id).state is RunState.DISPATCHED

    def test_the_failure_and_reschedule_streaks_reset_each_other(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        streaks = []
        for step in (fail, fail, reschedule, reschedule, fail):
            settle_one(storage, claim(storage), step(run_id, clock.now_ms()))
            fire = fire_of(storage, run_id)
            streaks.append((fire.consecutive_failures, fire.reschedules))

        assert streaks == [(1, 0), (2, 0), (0, 1), (0, 2), (1, 0)]

    @pytest.mark.parametrize("ending", [Outcome.COMPLETE, Outcome.DISCARD])
    def test_a_terminal_outcome_freezes_the_streaks(
        self, storage: Storage, clock: ManualClock, ending: Outcome
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        settle_one(storage, claim(storage), reschedule(run_id, clock.now_ms()))
        settle_one(storage, claim(storage), fail(run_id, clock.now_ms()))
        settle_one(storage, claim(storage), fail(run_id, clock.now_ms()))
        state = RunState.COMPLETED if ending is Outcome.COMPLETE else RunState.DEAD_LETTERED

        settle_one(storage, claim(storage), settlement_for(run_id, ending, state, clock.now_ms()))

        fire = fire_of(storage, run_id)
        assert (fire.consecutive_failures, fire.reschedules, fire.attempts) == (2, 0, 4)

    def test_a_mixed_batch_applies_each_fires_own_outcome_and_inputs(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        done, failed, moved, dead, freed = enqueue_slots(storage, free_schedule(storage), 5)
        taken = claim(storage)
        fail_at, move_at = clock.now_ms() + 1_000, clock.now_ms() + 2_000

        report = storage.fire_queue.settle(
            taken.token,
            taken.consumer,
            [
                complete(done, output="done"),
                fail(failed, fail_at, "timeout"),
                reschedule(moved, move_at),
                discard(dead, "poison"),
                release(freed),
            ],
        )

        assert (report.acked, report.stale) == ([done, failed, moved, dead, freed], [])
        at = clock.now_ms()
        assert {rid: fire_of(storage, rid).state_at(at) for rid in report.acked} == {
            done: FireState.COMPLETED,
            failed: FireState.SCHEDULED,
            moved: FireState.SCHEDULED,
            dead: FireState.DISCARDED,
            freed: FireState.CLAIMABLE,
        }
        assert (fire_of(storage, failed).available_at, fire_of(storage, failed).last_error) == (
            fail_at,
            "timeout",
        )
        assert fire_of(storage, moved).available_at == move_at
        assert fire_of(storage, dead).discard_reason == "poison"
        assert [run_of(storage, rid).state for rid in report.acked] == [
            RunState.COMPLETED,
            RunState.DISPATCHED,
            RunState.DISPATCHED,
            RunState.DEAD_LETTERED,
            RunState.DISPATCHED,
        ]

    def test_empty_batches_and_unknown_fires_never_raise(self, storage: Storage) -> None:
        taken = claim(storage)

        enqueued = storage.fire_queue.enqueue([], available_at=slot(0))
        empty = storage.fire_queue.settle(taken.token, taken.consumer, [])
        unknown = storage.fire_queue.settle(
            taken.token, taken.consumer, [complete(424242), release(424243)]
        )

        assert (enqueued.inserted, enqueued.already) == ([], [])
        assert (empty.acked, empty.stale) == ([], [])
        assert (unknown.acked, unknown.stale) == ([], [424242, 424243])
        assert (storage.fire_queue.depth(), storage.runs.count()) == (0, 0)

    # --- fencing -------------------------------------------------------------------------------

    def test_a_late_ack_after_expiry_lands_when_nobody_reclaimed(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        taken = claim(storage)
        clock.advance(TTL_S * 3)

        report = storage.fire_queue.settle(taken.token, taken.consumer, [complete(run_id)])

        assert (report.acked, report.stale) == ([run_id], []), (
            "a settle after the claim's deadline must still land while nobody has claimed the "
            "fire since"
        )
        assert fire_of(storage, run_id).stale_ack_count == 0
        assert run_of(storage, run_id).state is RunState.COMPLETED

    def test_a_stale_settle_after_a_reclaim_is_reported_counted_and_changes_nothing(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        first = claim(storage, "worker-a")
        clock.advance(TTL_S + 1)
        second = claim(storage, "worker-b")
        held = fire_of(storage, run_id)

        report = storage.fire_queue.settle(first.token, "worker-a", [complete(run_id)])

        assert (report.acked, report.stale) == ([], [run_id]), (
            "fencing: a settle under a superseded claim token must be reported stale"
        )
        assert fire_of(storage, run_id) == replace(held, stale_ack_count=1), (
            "fencing: a stale settle must change nothing but the fire's stale-ack count"
        )
        assert run_of(storage, run_id).state is RunState.RUNNING, (
            "fencing: a stale settle must not move the run"
        )
        assert storage.fire_queue.settle(second.token, "worker-b", [complete(run_id)]).acked == [
            run_id
        ], "the current claim's settle must land after a stale one"

    def test_stale_acks_accumulate_across_outcomes_and_consumers(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        old = [claim(storage, "worker-a")]
        clock.advance(TTL_S + 1)
        old.append(claim(storage, "worker-b"))
        clock.advance(TTL_S + 1)
        claim(storage, "worker-c")

        storage.fire_queue.settle(old[0].token, "worker-a", [complete(run_id)])
        storage.fire_queue.settle(old[1].token, "worker-b", [discard(run_id)])
        storage.fire_queue.settle(
            old[0].token, "worker-a", [discard(run_id, state=RunState.FAILED)]
        )

        fire = fire_of(storage, run_id)
        assert (fire.stale_ack_count, fire.consumed_by) == (3, "worker-c")
        assert (fire.completed_at, fire.discarded_at) == (None, None)

    def test_a_stale_fail_or_reschedule_is_counted_as_a_stale_ack(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        # The reference store counts every stale outcome that would end or re-arm the claim
        # (all but release); see the report on the port's wording ("terminal outcome").
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        first = claim(storage, "worker-a")
        clock.advance(TTL_S + 1)
        claim(storage, "worker-b")

        storage.fire_queue.settle(first.token, "worker-a", [fail(run_id, clock.now_ms())])
        storage.fire_queue.settle(first.token, "worker-a", [reschedule(run_id, clock.now_ms())])

        assert fire_of(storage, run_id).stale_ack_count == 2

    def test_a_stale_release_is_reported_but_not_counted(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        first = claim(storage, "worker-a")
        clock.advance(TTL_S + 1)
        second = claim(storage, "worker-b")

        report = storage.fire_queue.settle(first.token, "worker-a", [release(run_id)])

        assert report.stale == [run_id]
        fire = fire_of(storage, run_id)
        assert (fire.stale_ack_count, fire.lease_token) == (0, second.token)

    def test_a_settled_fire_fences_its_own_token_out(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        taken = claim(storage)
        settle_one(storage, taken, fail(run_id, clock.now_ms() + LATER_MS, "first"))

        report = storage.fire_queue.settle(taken.token, taken.consumer, [complete(run_id)])

        assert report.stale == [run_id], (
            "fencing: a fire once settled must refuse a second settle under the same token"
        )
        fire = fire_of(storage, run_id)
        assert fire.state_at(clock.now_ms()) is FireState.SCHEDULED  # the first outcome stands
        assert (fire.last_error, fire.stale_ack_count) == ("first", 1)
        assert run_of(storage, run_id).state is RunState.DISPATCHED

    def test_the_consumer_name_is_not_the_token(self, storage: Storage, clock: ManualClock) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        claim(storage, "worker-a")

        beat = storage.fire_queue.heartbeat("worker-a", TTL_MS, [run_id])
        report = storage.fire_queue.settle("worker-a", "worker-a", [complete(run_id)])

        assert (beat.stale, report.stale) == ([run_id], [run_id]), (
            "fencing: only the claim's token holds a fire, never the consumer's name"
        )
        assert fire_of(storage, run_id).state_at(clock.now_ms()) is FireState.CLAIMED

    def test_a_batch_with_partial_staleness_never_raises_and_counts_only_fenced_fires(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        lost, kept_done, kept_failed, kept_freed = enqueue_slots(storage, free_schedule(storage), 4)
        first = claim(storage, "worker-a")
        clock.advance(TTL_S + 1)
        claim(storage, "worker-b", limit=1)  # takes over `lost` only

        report = storage.fire_queue.settle(
            first.token,
            "worker-a",
            [
                complete(lost),
                complete(kept_done),
                fail(kept_failed, clock.now_ms()),
                release(kept_freed),
            ],
        )

        assert (report.acked, report.stale) == ([kept_done, kept_failed, kept_freed], [lost]), (
            "fencing: a batch settle must apply the fires its token still holds and report the "
            "others stale, without raising"
        )
        counts = [fire_of(storage, rid).stale_ack_count for rid in (lost, kept_done, kept_failed)]
        assert counts == [1, 0, 0]
        assert fire_of(storage, lost).consumed_by == "worker-b"

    def test_a_second_settlement_of_one_fire_in_a_batch_is_stale(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        taken = claim(storage)

        report = storage.fire_queue.settle(
            taken.token, taken.consumer, [complete(run_id), fail(run_id, clock.now_ms())]
        )

        assert (report.acked, report.stale) == ([run_id], [run_id]), (
            "a fire settled once in a batch must report its second settlement stale"
        )
        assert fire_of(storage, run_id).state_at(clock.now_ms()) is FireState.COMPLETED
        assert run_of(storage, run_id).state is RunState.COMPLETED

    # --- requeue and purge ---------------------------------------------------------------------

    @pytest.mark.parametrize("ended", [RunState.DEAD_LETTERED, RunState.FAILED])
    def test_requeue_rearms_a_dead_letter_keeps_its_counters_and_restarts_its_retry_budget(
        self, storage: Storage, clock: ManualClock, ended: RunState
    ) -> None:
        run_id = dead_letter(storage, free_schedule(storage), slot(1), ended)
        at = clock.now_ms() + LATER_MS

        assert storage.fire_queue.requeue([run_id], at=at) == 1

        fire = fire_of(storage, run_id)
        assert fire.state_at(clock.now_ms()) is FireState.SCHEDULED
        assert (fire.available_at, fire.discarded_at, fire.discard_reason) == (at, None, None)
        assert (fire.attempts, fire.requeued_at_attempt, fire.round_attempts) == (2, 2, 0)
        assert fire.consecutive_failures == 0  # the failure streak starts over
        run = run_of(storage, run_id)
        assert (run.state, run.finished_at) == (RunState.DISPATCHED, None)
        clock.set(at)
        (again,) = claim(storage).fires
        assert (again.run_id, again.attempts, again.round_attempts) == (run_id, 3, 1)

    def test_only_a_failure_counts_against_the_retry_budget_and_a_requeue_resets_both_budgets(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        now = clock.now_ms()
        settle_one(storage, claim(storage, limit=1), reschedule(run_id, now))
        settle_one(storage, claim(storage, limit=1), release(run_id))
        assert fire_of(storage, run_id).failures == 0, (
            "a reschedule or a release must not count as a failure"
        )
        settle_one(storage, claim(storage, limit=1), fail(run_id, now))
        assert fire_of(storage, run_id).failures == 1, "a FAIL settlement counts one failure"
        assert claim(storage, "doomed", limit=1, ttl_ms=1_000).fires  # its consumer dies
        clock.advance(2)
        taken = claim(storage, "heir", limit=1)
        fire = taken.fires[0]
        assert (fire.attempts, fire.failures, fire.round_deaths) == (5, 1, 1), (
            "a takeover counts a consumer death, not a failure"
        )
        settle_one(storage, taken, discard(run_id))

        assert storage.fire_queue.requeue([run_id], at=clock.now_ms()) == 1

        fire = fire_of(storage, run_id)
        assert (fire.failures, fire.round_deaths, fire.abandoned_count) == (0, 0, 1), (
            "a requeue starts both budgets over (the death count itself stays)"
        )

    def test_requeue_fences_the_holder_of_a_claimed_fire(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        holder = claim(storage, "worker-a")

        assert storage.fire_queue.requeue([run_id], at=clock.now_ms()) == 1

        assert fire_of(storage, run_id).state_at(clock.now_ms()) is FireState.CLAIMABLE
        assert run_of(storage, run_id).state is RunState.DISPATCHED
        fenced = "fencing: a requeue must fence the claim's holder out (its calls are stale)"
        assert storage.fire_queue.heartbeat(holder.token, TTL_MS, [run_id]).stale == [run_id], (
            fenced
        )
        assert storage.fire_queue.settle(holder.token, "worker-a", [complete(run_id)]).stale == [
            run_id
        ], fenced
        (fire,) = claim(storage, "worker-b").fires
        assert (fire.run_id, fire.abandoned_count) == (run_id, 0)

    def test_requeue_never_touches_a_completed_fire(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        settle_one(storage, claim(storage), complete(run_id))
        before = fire_of(storage, run_id)

        assert storage.fire_queue.requeue([run_id], at=clock.now_ms()) == 0
        assert storage.fire_queue.requeue(None, at=clock.now_ms()) == 0

        assert fire_of(storage, run_id) == before, "a completed fire must never be requeued"
        assert run_of(storage, run_id).state is RunState.COMPLETED

    def test_requeue_of_every_dead_letter_stays_in_the_tenant_and_leaves_open_fires_alone(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        acme = free_schedule(storage, "job", tenant="acme")
        globex = free_schedule(storage, "job", tenant="globex")
        acme_dead = dead_letter(storage, acme, slot(1))
        globex_dead = dead_letter(storage, globex, slot(1))
        acme_open = enqueue(storage, acme, slot(2), available_at=slot(2))
        at = clock.now_ms() + LATER_MS

        assert storage.fire_queue.requeue(None, at=at, tenant="acme") == 1

        assert fire_of(storage, acme_dead).available_at == at
        assert fire_of(storage, globex_dead).state_at(clock.now_ms()) is FireState.DISCARDED, (
            "tenant isolation: a tenant's requeue must never touch another tenant's fires"
        )
        assert fire_of(storage, acme_open).available_at == slot(2)
        assert storage.fire_queue.requeue(None, at=at) == 1  # globex's, the last one

    def test_requeue_and_purge_of_nothing_return_zero(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        enqueue(storage, free_schedule(storage), slot(1))  # open: neither verb's business

        for run_ids in ([], [424242], None):
            assert storage.fire_queue.requeue(run_ids, at=clock.now_ms()) == 0
            assert storage.fire_queue.purge(run_ids) == 0
        assert storage.fire_queue.depth() == 1

    def test_purge_deletes_only_dead_letters_and_keeps_their_runs(self, storage: Storage) -> None:
        schedule = free_schedule(storage)
        dead = dead_letter(storage, schedule, slot(1))
        done, waiting = enqueue_slots(storage, schedule, 2, first=2)
        settle_one(storage, claim(storage, limit=1), complete(done))

        assert storage.fire_queue.purge([done, waiting]) == 0, (
            "purge must delete dead letters only, never a completed or an open fire"
        )
        assert storage.fire_queue.purge(None) == 1

        assert storage.fire_queue.get(dead) is None
        assert storage.fire_queue.get(done) is not None
        assert storage.fire_queue.get(waiting) is not None
        assert run_of(storage, dead).state is RunState.DEAD_LETTERED
        assert storage.runs.count() == 3

    def test_purge_of_every_dead_letter_of_a_tenant_never_crosses_tenants(
        self, storage: Storage
    ) -> None:
        acme_dead = dead_letter(storage, free_schedule(storage, "job", tenant="acme"), slot(1))
        globex_dead = dead_letter(storage, free_schedule(storage, "job", tenant="globex"), slot(1))

        assert storage.fire_queue.purge(None, tenant="globex") == 1
        assert storage.fire_queue.purge([acme_dead], tenant="globex") == 0

        assert storage.fire_queue.get(acme_dead) is not None, (
            "tenant isolation: a tenant's purge must never delete another tenant's fires"
        )
        assert storage.fire_queue.get(globex_dead) is None

    # --- read, pending, depth ------------------------------------------------------------------

    def test_each_state_filter_matches_exactly_its_fire(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        by_state = one_fire_per_state(storage, clock)

        for state, run_id in by_state.items():
            found = storage.fire_queue.read(FireQuery(states=frozenset({state})))
            assert [f.run_id for f in found] == [run_id], state
            assert found[0].state_at(clock.now_ms()) is state

    def test_state_filters_accumulate_and_no_filter_means_any_state(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        by_state = one_fire_per_state(storage, clock)
        wanted = frozenset({FireState.COMPLETED, FireState.SCHEDULED})

        some = storage.fire_queue.read(FireQuery(states=wanted))
        every = storage.fire_queue.read(FireQuery())

        assert [f.run_id for f in some] == sorted(by_state[s] for s in wanted)
        assert [f.run_id for f in every] == sorted(by_state.values())

    def test_an_expired_claim_reads_as_claimable_not_claimed(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        claim(storage)
        clock.advance(TTL_S)

        claimable = storage.fire_queue.read(FireQuery(states=frozenset({FireState.CLAIMABLE})))
        claimed = storage.fire_queue.read(FireQuery(states=frozenset({FireState.CLAIMED})))

        assert ([f.run_id for f in claimable], claimed) == ([run_id], [])
        assert fire_of(storage, run_id).state_at(clock.now_ms()) is FireState.CLAIMABLE

    def test_read_narrows_by_tenant_schedule_and_run_ids_in_run_id_order(
        self, storage: Storage
    ) -> None:
        acme_a = free_schedule(storage, "a", tenant="acme")
        acme_b = free_schedule(storage, "b", tenant="acme")
        globex = free_schedule(storage, "a", tenant="globex")
        a1, a2 = enqueue_slots(storage, acme_a, 2)
        (b1,) = enqueue_slots(storage, acme_b, 1)
        (g1,) = enqueue_slots(storage, globex, 1)

        def ids(query: FireQuery) -> list[int]:
            return [f.run_id for f in storage.fire_queue.read(query)]

        assert ids(FireQuery(tenant="acme")) == [a1, a2, b1]
        assert ids(FireQuery(schedule_id=acme_a.id)) == [a1, a2]
        assert ids(FireQuery(run_ids=(g1, a2, 424242))) == [a2, g1]
        assert ids(FireQuery(tenant="globex", run_ids=(a1, b1))) == []
        assert ids(FireQuery(run_ids=())) == []
        assert ids(FireQuery(limit=2)) == [a1, a2]  # by run id, though b1 is available earlier

    def test_read_returns_the_same_fire_as_get_and_claim(self, storage: Storage) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        (claimed,) = claim(storage).fires

        (read,) = storage.fire_queue.read(FireQuery(run_ids=(run_id,)))

        assert read == claimed == storage.fire_queue.get(run_id)

    def test_pending_lists_open_fires_oldest_available_first(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        by_state = one_fire_per_state(storage, clock)
        other = enqueue(
            storage,
            free_schedule(storage, "other", tenant="acme"),
            slot(0),
            available_at=slot(0) - 1,
        )

        pending = [f.run_id for f in storage.fire_queue.pending()]

        assert pending == [
            other,
            by_state[FireState.CLAIMED],
            by_state[FireState.CLAIMABLE],
            by_state[FireState.SCHEDULED],
        ]
        assert [f.run_id for f in storage.fire_queue.pending(limit=2)] == pending[:2]
        assert [f.run_id for f in storage.fire_queue.pending(tenant="acme")] == [other]

    def test_depth_counts_open_fires_per_tenant_and_overall(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        one_fire_per_state(storage, clock)  # three open, two closed, in the default tenant
        enqueue(storage, free_schedule(storage, "other", tenant="acme"), slot(0))

        assert storage.fire_queue.depth() == 4
        assert storage.fire_queue.depth("acme") == 1
        assert storage.fire_queue.depth("initech") == 0

    # --- the run ledger follows ----------------------------------------------------------------

    @pytest.mark.parametrize(("outcome", "state"), SETTLED_RUNS)
    def test_each_settlement_moves_the_run_to_the_state_it_gives(
        self, storage: Storage, clock: ManualClock, outcome: Outcome, state: RunState
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        taken = claim(storage)
        clock.advance(2)

        settle_one(storage, taken, settlement_for(run_id, outcome, state, clock.now_ms()))

        run = run_of(storage, run_id)
        assert run.state is state, "a settlement must move the fire's run to the state it gives"
        assert run.finished_at == (None if outcome is Outcome.RELEASE else clock.now_ms())

    # --- overlap, decided inside the claim -----------------------------------------------------

    def test_skip_skips_every_fire_that_comes_while_its_schedule_runs(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule, running, first = running_fire(storage, OverlapPolicy.SKIP)
        n1, n2 = enqueue_slots(storage, schedule, 2, first=1)

        taken = claim(storage, "worker-b")

        assert (taken.fires, taken.skipped) == ([], {n1: SKIPPED_OVERLAP, n2: SKIPPED_OVERLAP}), (
            "overlap skip: fires that come while their schedule runs must be skipped at claim"
        )
        assert (taken.cancelled, taken.cancel_requested) == ({}, [])
        for run_id in (n1, n2):
            assert_ended_unrun(storage, clock, run_id, RunState.SKIPPED, SKIPPED_OVERLAP)
        assert fire_of(storage, running).lease_token == first.token
        assert storage.fire_queue.depth() == 1

    def test_skip_applies_between_the_fires_of_one_claim(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = stored_schedule(storage, "job", overlap=OverlapPolicy.SKIP)
        older, newer = enqueue_slots(storage, schedule, 2)

        taken = claim(storage)

        assert (claimed_ids(taken), taken.skipped) == ([older], {newer: SKIPPED_OVERLAP}), (
            "overlap skip: one claim must not run two fires of a skip schedule"
        )
        assert_ended_unrun(storage, clock, newer, RunState.SKIPPED, SKIPPED_OVERLAP)

    def test_buffer_one_keeps_the_oldest_newer_fire_waiting_and_skips_the_rest(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule, running, first = running_fire(storage, OverlapPolicy.BUFFER_ONE)
        n1, n2, n3 = enqueue_slots(storage, schedule, 3, first=1)

        taken = claim(storage, "worker-b")
        again = claim(storage, "worker-b")  # the buffered fire keeps its place

        assert (taken.fires, taken.skipped) == ([], {n2: SKIPPED_BUFFER, n3: SKIPPED_BUFFER}), (
            "overlap buffer-one: the oldest newer fire waits, the rest are skipped"
        )
        assert (again.fires, again.skipped) == ([], {})
        assert_waiting(storage, clock, n1)
        assert_ended_unrun(storage, clock, n3, RunState.SKIPPED, SKIPPED_BUFFER)
        settle_one(storage, first, complete(running))
        assert claimed_ids(claim(storage, "worker-b")) == [n1]

    def test_buffer_all_keeps_every_newer_fire_waiting_and_runs_them_one_by_one_in_order(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule, running, first = running_fire(storage, OverlapPolicy.BUFFER_ALL)
        n1, n2, n3 = enqueue_slots(storage, schedule, 3, first=1)

        taken = claim(storage, "worker-b")

        assert (taken.fires, taken.skipped, taken.cancelled) == ([], {}, {}), (
            "overlap buffer-all: every newer fire waits while its schedule runs"
        )
        assert_waiting(storage, clock, n1, n2, n3)
        settle_one(storage, first, complete(running))
        second = claim(storage, "worker-b")
        assert claimed_ids(second) == [n1]
        settle_one(storage, second, complete(n1))
        assert claimed_ids(claim(storage, "worker-b")) == [n2]
        assert_waiting(storage, clock, n3)

    def test_allow_claims_newer_fires_beside_the_running_one(self, storage: Storage) -> None:
        schedule, running, _ = running_fire(storage, OverlapPolicy.ALLOW)
        n1, n2 = enqueue_slots(storage, schedule, 2, first=1)

        taken = claim(storage, "worker-b")

        assert claimed_ids(taken) == [n1, n2], (
            "overlap allow: newer fires run beside the running one"
        )
        assert (taken.skipped, taken.cancelled, taken.cancel_requested) == ({}, {}, [])
        assert run_of(storage, running).state is RunState.RUNNING

    def test_cancel_other_runs_the_newest_fire_cancels_older_waiting_ones_and_stops_the_runner(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule, running, first = running_fire(storage, OverlapPolicy.CANCEL_OTHER)
        n1, n2 = enqueue_slots(storage, schedule, 2, first=1)

        taken = claim(storage, "worker-b")

        assert claimed_ids(taken) == [n2], "overlap cancel-other: only the newest fire runs"
        assert (taken.cancelled, taken.skipped) == ({n1: SUPERSEDED}, {})
        assert taken.cancel_requested == [running], (
            "overlap cancel-other: the running fire must be asked to stop"
        )
        assert_ended_unrun(storage, clock, n1, RunState.CANCELLED, SUPERSEDED)
        # The runner is asked through its heartbeat, not forced; the newcomer is asked nothing.
        old_beat = storage.fire_queue.heartbeat(first.token, TTL_MS, [running])
        new_beat = storage.fire_queue.heartbeat(taken.token, TTL_MS, [n2])
        assert (old_beat.extended, old_beat.cancel_requested) == ([running], [running])
        assert (new_beat.extended, new_beat.cancel_requested) == ([n2], [])
        assert run_of(storage, running).state is RunState.RUNNING
        settle_one(storage, first, complete(running, state=RunState.CANCELLED))
        assert run_of(storage, running).state is RunState.CANCELLED

    def test_cancel_other_on_an_idle_schedule_runs_only_its_newest_fire(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = stored_schedule(storage, "job", overlap=OverlapPolicy.CANCEL_OTHER)
        n1, n2, n3 = enqueue_slots(storage, schedule, 3)

        taken = claim(storage)

        assert claimed_ids(taken) == [n3]
        assert (taken.cancelled, taken.cancel_requested) == ({n1: SUPERSEDED, n2: SUPERSEDED}, [])
        assert_ended_unrun(storage, clock, n2, RunState.CANCELLED, SUPERSEDED)

    @pytest.mark.parametrize(
        "policy", [OverlapPolicy.SKIP, OverlapPolicy.BUFFER_ONE, OverlapPolicy.BUFFER_ALL]
    )
    def test_manual_fires_wait_for_the_running_fire_instead_of_being_skipped(
        self, storage: Storage, clock: ManualClock, policy: OverlapPolicy
    ) -> None:
        schedule, running, first = running_fire(storage, policy)
        m1, m2 = enqueue_slots(storage, schedule, 2, first=1, kind=RunKind.MANUAL)

        taken = claim(storage, "worker-b")

        assert (taken.fires, taken.skipped, taken.cancelled) == ([], {}, {}), (
            "a manual fire is never skipped for overlap: it waits for the running fire"
        )
        assert_waiting(storage, clock, m1, m2)
        settle_one(storage, first, complete(running))
        assert claimed_ids(claim(storage, "worker-b")) == [m1]  # then one at a time
        assert_waiting(storage, clock, m2)

    @pytest.mark.parametrize(
        "policy",
        [
            OverlapPolicy.SKIP,
            OverlapPolicy.BUFFER_ONE,
            OverlapPolicy.BUFFER_ALL,
            OverlapPolicy.CANCEL_OTHER,
        ],
    )
    def test_backfill_fires_wait_for_the_running_fire_whatever_the_policy(
        self, storage: Storage, clock: ManualClock, policy: OverlapPolicy
    ) -> None:
        schedule, running, first = running_fire(storage, policy)
        (backfill,) = enqueue_slots(storage, schedule, 1, first=1, kind=RunKind.BACKFILL)

        taken = claim(storage, "worker-b")

        assert (taken.fires, taken.skipped, taken.cancelled, taken.cancel_requested) == (
            [],
            {},
            {},
            [],
        ), "a backfill fire waits for the running fire, whatever the overlap policy"
        assert_waiting(storage, clock, backfill)
        settle_one(storage, first, complete(running))
        assert claimed_ids(claim(storage, "worker-b")) == [backfill]

    def test_a_manual_fire_of_a_cancel_other_schedule_runs_at_once_and_stops_the_running_one(
        self,
        storage: Storage,
    ) -> None:
        schedule, running, _ = running_fire(storage, OverlapPolicy.CANCEL_OTHER)
        (manual,) = enqueue_slots(storage, schedule, 1, first=1, kind=RunKind.MANUAL)

        taken = claim(storage, "worker-b")

        assert (claimed_ids(taken), taken.cancel_requested) == ([manual], [running])

    def test_an_abandoned_fire_is_taken_over_before_the_newer_fires_of_its_schedule(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule, running, _ = running_fire(storage, OverlapPolicy.SKIP)
        (newer,) = enqueue_slots(storage, schedule, 1, first=1)
        clock.advance(TTL_S)

        taken = claim(storage, "worker-b")

        assert (claimed_ids(taken), taken.skipped) == ([running], {newer: SKIPPED_OVERLAP})
        assert taken.fires[0].abandoned_count == 1

    def test_a_running_schedule_holds_back_none_of_the_other_schedules_fires(
        self,
        storage: Storage,
    ) -> None:
        schedule, _, _ = running_fire(storage, OverlapPolicy.SKIP)
        n1, n2 = enqueue_slots(storage, schedule, 2, first=1)
        other = enqueue(storage, stored_schedule(storage, "other"), slot(9))

        taken = claim(storage, "worker-b", limit=1)

        assert (claimed_ids(taken), taken.skipped) == (
            [other],
            {n1: SKIPPED_OVERLAP, n2: SKIPPED_OVERLAP},
        )

    def test_a_paused_schedules_scheduled_fires_are_skipped_but_asked_for_ones_still_run(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = free_schedule(storage, "job")
        s1, s2 = enqueue_slots(storage, schedule, 2)
        manual = enqueue(storage, schedule, slot(3), kind=RunKind.MANUAL)
        backfill = enqueue(storage, schedule, slot(4), kind=RunKind.BACKFILL)
        pause(storage, schedule)

        taken = claim(storage)

        assert taken.skipped == {s1: SKIPPED_PAUSED, s2: SKIPPED_PAUSED}, (
            "a paused schedule's scheduled fires must be skipped at claim"
        )
        assert claimed_ids(taken) == [manual, backfill], (
            "a paused schedule's manual and backfill fires must still run"
        )
        assert_ended_unrun(storage, clock, s1, RunState.SKIPPED, SKIPPED_PAUSED)

    def test_every_fire_of_a_deleted_schedule_is_skipped_at_claim(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule = free_schedule(storage, "job")
        fires = [
            enqueue(storage, schedule, slot(1)),
            enqueue(storage, schedule, slot(2), kind=RunKind.MANUAL),
            enqueue(storage, schedule, slot(3), kind=RunKind.BACKFILL),
        ]
        storage.schedules.delete(schedule.id, schedule.tenant)

        taken = claim(storage)

        assert (taken.fires, taken.skipped) == ([], dict.fromkeys(fires, SKIPPED_DELETED)), (
            "every fire of a deleted schedule must be skipped at claim"
        )
        for run_id in fires:
            assert_ended_unrun(storage, clock, run_id, RunState.SKIPPED, SKIPPED_DELETED)
        assert storage.runs.count() == 3

    def test_an_abandoned_fire_of_a_schedule_paused_meanwhile_ends_skipped(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule, running, first = running_fire(storage, OverlapPolicy.SKIP)
        pause(storage, schedule)
        clock.advance(TTL_S)

        taken = claim(storage, "worker-b")

        assert (taken.fires, taken.skipped) == ([], {running: SKIPPED_PAUSED})
        assert run_of(storage, running).state is RunState.SKIPPED  # running -> skipped
        late = storage.fire_queue.settle(first.token, "worker-a", [complete(running)])
        assert late.stale == [running]

    @pytest.mark.parametrize(
        "policy",
        [
            OverlapPolicy.SKIP,
            OverlapPolicy.BUFFER_ONE,
            OverlapPolicy.ALLOW,
            OverlapPolicy.CANCEL_OTHER,
            OverlapPolicy.BUFFER_ALL,
        ],
    )
    def test_a_schedule_paused_while_it_runs_has_its_newer_scheduled_fires_skipped(
        self, storage: Storage, clock: ManualClock, policy: OverlapPolicy
    ) -> None:
        schedule, _, _ = running_fire(storage, policy)
        (newer,) = enqueue_slots(storage, schedule, 1, first=1)
        pause(storage, schedule)

        taken = claim(storage, "worker-b")

        assert (taken.fires, taken.skipped) == ([], {newer: SKIPPED_PAUSED})
        assert_ended_unrun(storage, clock, newer, RunState.SKIPPED, SKIPPED_PAUSED)

    def test_a_deleted_schedule_has_its_fires_skipped_even_while_one_of_them_runs(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule, _, _ = running_fire(storage, OverlapPolicy.SKIP)
        (newer,) = enqueue_slots(storage, schedule, 1, first=1)
        storage.schedules.delete(schedule.id, schedule.tenant)

        taken = claim(storage, "worker-b")

        assert (taken.fires, taken.skipped) == ([], {newer: SKIPPED_DELETED})
        assert_ended_unrun(storage, clock, newer, RunState.SKIPPED, SKIPPED_DELETED)

    def test_cancel_other_never_lets_an_abandoned_older_fire_stop_a_newer_running_one(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        schedule, older, _ = running_fire(storage, OverlapPolicy.CANCEL_OTHER)
        clock.advance(TTL_S / 3)
        (newer,) = enqueue_slots(storage, schedule, 1, first=1)
        second = claim(storage, "worker-b", ttl_ms=10 * TTL_MS)
        assert second.cancel_requested == [older]
        clock.advance(TTL_S)  # the older fire's holder vanished; the newer one still runs

        taken = claim(storage, "worker-c")

        assert older not in claimed_ids(taken), (
            "overlap cancel-other: an abandoned older fire must not run beside a newer one"
        )
        assert newer not in taken.cancel_requested, (
            "overlap cancel-other: an older fire must never stop a newer running one"
        )
        assert storage.fire_queue.heartbeat(second.token, TTL_MS, [newer]).cancel_requested == []

    # --- concurrency ---------------------------------------------------------------------------

    def test_parallel_claimers_never_share_a_fire(self, storage: Storage) -> None:
        schedule = free_schedule(storage)
        ids = storage.fire_queue.enqueue(
            [new_fire(schedule, slot(n)) for n in range(300)], available_at=slot(0)
        ).inserted

        claims = race_claimers(storage)

        taken = Counter(rid for c in claims for rid in claimed_ids(c))
        assert sorted(taken) == sorted(ids), "parallel claimers must between them take every fire"
        assert set(taken.values()) == {1}, (
            "exclusive claims: no fire may be taken by two claims at once"
        )
        assert len({c.token for c in claims}) == len(claims)
        assert {f.lease_token for f in storage.fire_queue.read(FireQuery(limit=1000))} == {
            c.token for c in claims
        }

    def test_parallel_claimers_never_run_two_fires_of_a_skip_schedule_at_once(
        self,
        storage: Storage,
    ) -> None:
        schedules = [stored_schedule(storage, f"job-{n}") for n in range(20)]
        storage.fire_queue.enqueue(
            [new_fire(s, slot(k)) for k in range(3) for s in schedules], available_at=slot(0)
        )

        claims = race_claimers(storage)

        running = Counter(f.schedule_id for c in claims for f in c.fires)
        skipped = sum(len(c.skipped) for c in claims)
        assert running == Counter({s.id: 1 for s in schedules}), (
            "overlap skip under concurrency: parallel claimers must never run two fires of one "
            "skip schedule at once"
        )
        assert skipped == 2 * len(schedules)

    def test_parallel_claimers_over_many_schedules_claim_each_fire_exactly_once(
        self,
        storage: Storage,
    ) -> None:
        schedules = [free_schedule(storage, f"free-{n}") for n in range(40)]
        ids = storage.fire_queue.enqueue(
            [new_fire(s, slot(k)) for k in range(5) for s in schedules], available_at=slot(0)
        ).inserted
        barrier = threading.Barrier(CLAIMERS)

        with ThreadPoolExecutor(max_workers=CLAIMERS) as pool:
            futures = [
                pool.submit(claim_until_drained, storage, f"worker-{n}", barrier)
                for n in range(CLAIMERS)
            ]
            claims = [c for future in futures for c in future.result(timeout=120)]

        assert len(ids) == 200
        assert Counter(rid for c in claims for rid in claimed_ids(c)) == Counter(ids), (
            "exclusive claims: parallel claimers must claim each fire exactly once"
        )
        holders = {(c.token, c.consumer) for c in claims}
        for fire in storage.fire_queue.read(FireQuery(limit=1000)):
            assert (fire.attempts, fire.abandoned_count) == (1, 0)
            assert (fire.lease_token, fire.consumed_by) in holders  # the claim that took it
            assert run_of(storage, fire.run_id).state is RunState.RUNNING

    def test_parallel_consumers_run_a_buffer_all_schedules_fires_one_at_a_time_in_order(
        self,
        storage: Storage,
    ) -> None:
        schedules = [
            stored_schedule(storage, f"queue-{n}", overlap=OverlapPolicy.BUFFER_ALL)
            for n in range(8)
        ]
        # Each schedule's fires, in slot order.
        fires = {s.id: [enqueue(storage, s, slot(k)) for k in range(6)] for s in schedules}
        order: list[list[int]] = []
        barrier = threading.Barrier(CLAIMERS)

        with ThreadPoolExecutor(max_workers=CLAIMERS) as pool:
            futures = [
                pool.submit(consume_until_done, storage, f"worker-{n}", barrier, order)
                for n in range(CLAIMERS)
            ]
            for future in futures:
                future.result(timeout=120)

        assert [claimed for claimed in order if len(claimed) > 1] == [], (
            "overlap buffer-all: never two fires of one schedule claimed at once"
        )
        for ids in fires.values():
            assert [claimed[0] for claimed in order if claimed[0] in ids] == ids, (
                "overlap buffer-all: a schedule's fires run one at a time, in slot order"
            )
            assert {run_of(storage, rid).state for rid in ids} == {RunState.COMPLETED}
            assert {run_of(storage, rid).attempts for rid in ids} == {1}

    def test_a_claim_beside_an_uncommitted_claim_takes_none_of_its_fires(
        self, storage: Storage
    ) -> None:
        ids = enqueue_slots(storage, free_schedule(storage), 30)

        a, b, _ = beside_an_open_claim(storage, hold_s=1)

        assert len(claimed_ids(a)) == 10
        assert sorted(claimed_ids(a) + claimed_ids(b)) == ids, (
            "exclusive claims: a claim beside an uncommitted claim must take none of its fires"
        )
        assert {fire_of(storage, rid).lease_token for rid in claimed_ids(a)} == {a.token}

    @pytest.mark.parametrize("split", [False, True], ids=["same-commands", "split-commands"])
    def test_a_claim_beside_an_uncommitted_claim_never_sees_its_schedule_idle(
        self, storage: Storage, clock: ManualClock, split: bool
    ) -> None:
        # Split: each consumer runs one command only, so worker-b never even reads worker-a's
        # fire; only the schedule's own lock can tell it the schedule runs.
        schedule = stored_schedule(storage, "job", overlap=OverlapPolicy.SKIP)
        first = enqueue(storage, schedule, slot(0), command="alpha")
        newer = enqueue(storage, schedule, slot(1), command="beta")

        a, b, _ = beside_an_open_claim(
            storage,
            hold_s=1,
            commands_a={"alpha"} if split else None,
            commands_b={"beta"} if split else None,
        )
        after = claim(storage, "worker-c")

        assert (claimed_ids(a), claimed_ids(b), claimed_ids(after)) == ([first], [], []), (
            "overlap skip: a claim beside an uncommitted claim must see its schedule running"
        )
        assert {**a.skipped, **b.skipped, **after.skipped} == {newer: SKIPPED_OVERLAP}
        assert_ended_unrun(storage, clock, newer, RunState.SKIPPED, SKIPPED_OVERLAP)

    def test_a_claim_never_waits_for_another_consumers_uncommitted_claim(
        self, storage: Storage
    ) -> None:
        if self.serialises_writes:
            pytest.skip("the store runs one writer at a time: there a claim waits, by design")
        free = enqueue_slots(storage, free_schedule(storage), 20)
        # After the free ones: worker-a, at its limit, decides nothing about this schedule.
        alone = enqueue(
            storage, stored_schedule(storage, "job", overlap=OverlapPolicy.SKIP), slot(30)
        )

        a, b, early = beside_an_open_claim(storage, hold_s=10)

        assert early, "a claim must not wait for another consumer's uncommitted claim"
        assert (claimed_ids(a), claimed_ids(b)) == (free[:10], [*free[10:], alone])

    def test_a_settle_racing_an_uncommitted_takeover_is_stale_and_changes_nothing(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        first = claim(storage, "worker-a")
        clock.advance(TTL_S)

        second, report = beside_an_open_takeover(
            storage, lambda: storage.fire_queue.settle(first.token, "worker-a", [complete(run_id)])
        )

        assert claimed_ids(second) == [run_id]
        assert (report.acked, report.stale) == ([], [run_id]), (
            "fencing: a settle racing a takeover must wait for it and then be reported stale"
        )
        fire = fire_of(storage, run_id)
        assert (fire.lease_token, fire.completed_at, fire.stale_ack_count) == (
            second.token,
            None,
            1,
        ), "fencing: a stale settle must change nothing but the stale-ack count"
        assert run_of(storage, run_id).state is RunState.RUNNING

    def test_a_heartbeat_racing_an_uncommitted_takeover_is_stale_and_extends_nothing(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        run_id = enqueue(storage, free_schedule(storage), slot(1))
        first = claim(storage, "worker-a")
        clock.advance(TTL_S)

        second, report = beside_an_open_takeover(
            storage, lambda: storage.fire_queue.heartbeat(first.token, 10 * TTL_MS, [run_id])
        )

        assert (report.extended, report.stale) == ([], [run_id]), (
            "fencing: a heartbeat racing a takeover must wait for it and then be reported stale"
        )
        fire = fire_of(storage, run_id)
        assert (fire.lease_token, fire.consumed_till) == (second.token, second.claimed_till), (
            "fencing: a stale heartbeat must extend nothing"
        )

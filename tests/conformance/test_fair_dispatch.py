"""Dispatch on every backend: the per-tenant cap of a dispatch transaction (one tenant's
backlog cannot starve another tenant's fires, and a tenant alone with a backlog is not slowed
down); dispatch under concurrency (fencing by the lease, transactions at once, the audit chain
appended from many writers); lease shards; and the change feed that wakes a sleeping daemon."""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from engine import InvalidInput, LeaseExpired, LeaseNotOwned, ManualClock
from engine.domain.audit import AuditEvent, KeyRing, tenant_chain
from engine.domain.misfire import SlotPlan
from engine.domain.schedule import Schedule
from engine.domain.timeutil import MINUTE_MS
from engine.governance.audit import verify
from engine.ports.dispatch import DispatchReport
from engine.ports.lease import LEADER_LEASE, Lease
from engine.ports.runs import RunQuery
from engine.ports.storage import Storage
from tests.conformance._builders import FIRST_SLOT, make_schedule
from tests.conformance._lease_racer import address_of, open_store
from tests.helpers import resolver_at

NOW = FIRST_SLOT + MINUTE_MS
LIMIT = 100
CAP = 20


def due(storage: Storage, tenant: str, count: int, *, at: int = FIRST_SLOT) -> None:
    """`count` schedules of `tenant`, each with one slot due at `at` (the soonest first)."""
    for i in range(count):
        storage.schedules.insert(
            make_schedule(f"{tenant}-{i:04d}", tenant=tenant, next_slot_at=at, next_fire_at=at)
        )


def dispatch(storage: Storage, cap: int | None = CAP) -> DispatchReport:
    return storage.dispatcher.dispatch_due(
        lease_key=LEADER_LEASE,
        token="t",
        node_id="n1",
        now_ms=NOW,
        limit=LIMIT,
        resolve=resolver_at(NOW),
        tenant_cap=cap,
    )


@pytest.fixture
def leader(storage: Storage) -> Storage:
    assert storage.leases.acquire(LEADER_LEASE, "t", "n1", 600_000) is not None
    return storage


def per_tenant(report: DispatchReport) -> Counter[str]:
    return Counter(fire.tenant for fire in report.dispatched)


def test_a_tenant_behind_anothers_backlog_fires_in_the_first_transaction(
    leader: Storage,
) -> None:
    due(leader, "acme", 300)
    due(leader, "globex", 5, at=FIRST_SLOT + 1)  # behind every one of acme's in due order
    first = dispatch(leader)
    assert per_tenant(first) == {"acme": LIMIT - 5, "globex": 5}
    assert first.truncated
    assert first.capped == {"acme": 5}


def test_without_the_cap_the_same_tenant_waits_for_the_whole_backlog(leader: Storage) -> None:
    due(leader, "acme", 300)
    due(leader, "globex", 5, at=FIRST_SLOT + 1)
    assert per_tenant(dispatch(leader, cap=None)) == {"acme": LIMIT}
    assert per_tenant(dispatch(leader, cap=None)) == {"acme": LIMIT}
    assert per_tenant(dispatch(leader, cap=None)) == {"acme": LIMIT}
    assert per_tenant(dispatch(leader, cap=None)) == {"globex": 5}


def test_a_tenant_alone_with_a_backlog_fills_every_transaction(leader: Storage) -> None:
    due(leader, "acme", 250)
    sizes = [len(dispatch(leader).dispatched) for _ in range(3)]
    assert sizes == [LIMIT, LIMIT, 50]


def test_with_many_tenants_waiting_each_gets_its_share_and_every_slot_fires_once(
    leader: Storage,
) -> None:
    others = ("b", "c", "d", "e", "f", "g")
    due(leader, "acme", 400)
    for i, tenant in enumerate(others):
        due(leader, tenant, 30, at=FIRST_SLOT + 1 + i)
    remaining = Counter({"acme": 400, **dict.fromkeys(others, 30)})
    first_fired: dict[str, int] = {}
    for transaction in range(1, 20):
        counts = per_tenant(dispatch(leader))
        if not counts:
            break
        remaining -= counts
        for tenant in counts:
            first_fired.setdefault(tenant, transaction)
        for tenant, n in counts.items():
            if n > CAP:  # more than the cap only when nobody else is short of theirs
                short = [t for t in remaining if t != tenant and counts[t] < CAP]
                assert not short, (transaction, counts, dict(remaining))
    assert not remaining
    assert max(first_fired.values()) <= 2, first_fired  # nobody waits out acme's backlog
    runs = leader.runs.query(RunQuery(limit=10_000))
    assert len(runs) == 400 + 6 * 30
    assert len({(r.tenant, r.slot_key) for r in runs}) == len(runs)  # each slot exactly once


def test_a_small_tenant_is_not_capped_at_all(leader: Storage) -> None:
    due(leader, "acme", 300)
    due(leader, "globex", CAP * 3, at=FIRST_SLOT + 1)
    first = per_tenant(dispatch(leader))
    assert first["globex"] == CAP  # its share while acme is over the cap
    assert first["acme"] == LIMIT - CAP


# --- dispatch under concurrency ------------------------------------------------------------

# The storage fixture's audit key.
KEYS = KeyRing([b"conformance-suite-audit-key-0001"])
THREAD_TIMEOUT_S = 60


def dispatch_as(
    storage: Storage,
    token: str,
    *,
    limit: int = LIMIT,
    resolve: Callable[[Schedule, int], SlotPlan] | None = None,
    shard: tuple[int, int] | None = None,
) -> DispatchReport:
    return storage.dispatcher.dispatch_due(
        lease_key=LEADER_LEASE,
        token=token,
        node_id=f"node-{token}",
        now_ms=NOW,
        limit=limit,
        resolve=resolver_at(NOW) if resolve is None else resolve,
        shard=shard,
    )


def dispatch_all(storage: Storage, token: str, *, limit: int = LIMIT) -> list[DispatchReport]:
    """Dispatch until nothing due is left to this caller."""
    reports = []
    while True:
        report = dispatch_as(storage, token, limit=limit)
        reports.append(report)
        if not report.dispatched and not report.truncated:
            return reports


def test_a_deposed_leaders_dispatch_lands_nothing(leader: Storage, clock: ManualClock) -> None:
    due(leader, "acme", 5)
    clock.advance(601)  # past the lease's expiry
    assert leader.leases.acquire(LEADER_LEASE, "u", "n2", 600_000) is not None

    with pytest.raises(LeaseNotOwned):
        dispatch_as(leader, "t")

    assert leader.runs.count() == 0
    assert leader.audit.chains() == []


def test_a_dispatch_under_an_expired_lease_lands_nothing(leader: Storage) -> None:
    due(leader, "acme", 5)
    lease = leader.leases.current(LEADER_LEASE)
    assert lease is not None

    with pytest.raises(LeaseExpired):
        leader.dispatcher.dispatch_due(
            lease_key=LEADER_LEASE,
            token="t",
            node_id="n1",
            now_ms=lease.expires_at,
            limit=LIMIT,
            resolve=resolver_at(NOW),
        )

    assert leader.runs.count() == 0


def test_of_two_dispatchers_racing_with_two_tokens_only_the_lease_holders_lands(
    leader: Storage,
) -> None:
    barrier = threading.Barrier(2)

    def race(token: str) -> DispatchReport | None:
        barrier.wait(timeout=THREAD_TIMEOUT_S)
        try:
            return dispatch_as(leader, token)
        except LeaseNotOwned:
            return None

    holder, other = "t", "u"
    with ThreadPoolExecutor(max_workers=2) as pool:
        for round_no in range(6):
            due(leader, f"round{round_no}", 10)
            reports = dict(zip((holder, other), pool.map(race, (holder, other)), strict=True))

            assert reports[other] is None, f"round {round_no}: {other} dispatched without the lease"
            won = reports[holder]
            assert won is not None
            assert {f.node_id for f in won.dispatched} == {f"node-{holder}"}
            assert len(won.dispatched) == 10
            # The lease changes hands for the next round.
            leader.leases.release(LEADER_LEASE, holder)
            assert leader.leases.acquire(LEADER_LEASE, other, "n2", 600_000) is not None
            holder, other = other, holder
    runs = leader.runs.query(RunQuery(limit=1000))
    assert len({(r.tenant, r.slot_key) for r in runs}) == len(runs) == 60


def test_a_lease_taken_over_mid_dispatch_waits_for_the_dispatch_to_commit(
    leader: Storage, clock: ManualClock
) -> None:
    """Fencing: the lease cannot change hands between a dispatch's check and its commit."""
    due(leader, "acme", 3)
    inside = threading.Event()
    plain = resolver_at(NOW)

    def slow(schedule: Schedule, cursor: int) -> SlotPlan:
        inside.set()  # the lease check is behind us: the transaction is open
        time.sleep(0.3)  # the takeover below must not get through meanwhile
        return plain(schedule, cursor)

    with ThreadPoolExecutor(max_workers=1) as pool:
        dispatching = pool.submit(dispatch_as, leader, "t", resolve=slow)
        assert inside.wait(THREAD_TIMEOUT_S)
        clock.advance(601)  # the lease expires while the dispatch is still running
        taken = leader.leases.acquire(LEADER_LEASE, "u", "n2", 600_000)
        committed = leader.runs.count()  # what the dispatch had committed when it got through
        report = dispatching.result(timeout=THREAD_TIMEOUT_S)

    assert taken is not None
    assert committed == 3
    assert len(report.dispatched) == 3


def test_dispatch_transactions_at_once_fire_every_slot_exactly_once(leader: Storage) -> None:
    due(leader, "acme", 200)
    barrier = threading.Barrier(3)

    def drain(_: int) -> list[DispatchReport]:
        barrier.wait(timeout=THREAD_TIMEOUT_S)
        return dispatch_all(leader, "t", limit=15)

    with ThreadPoolExecutor(max_workers=3) as pool:
        reports = [r for batch in pool.map(drain, range(3)) for r in batch]
    reports += dispatch_all(leader, "t")  # whatever the three left behind

    fired = [f for r in reports for f in r.dispatched]
    assert len(fired) == 200
    assert len({(f.tenant, f.slot_key) for f in fired}) == 200
    assert sum(r.already_dispatched for r in reports) == 0  # no slot was even tried twice
    assert leader.runs.count() == 200
    assert leader.dispatcher.next_due_at() is not None
    assert leader.dispatcher.next_due_at() > NOW  # type: ignore[operator]


def test_appends_to_the_same_chains_from_two_threads_keep_them_valid_chains(
    storage: Storage,
) -> None:
    """Each append touches two chains, in opposite orders in the two threads (no deadlock),
    and the chains cross a checkpoint."""
    barrier = threading.Barrier(2)
    batches, per_batch = 26, 20

    def append(writer: int) -> None:
        tenants = ["acme", "globex"] if writer == 0 else ["globex", "acme"]
        barrier.wait(timeout=THREAD_TIMEOUT_S)
        for batch in range(batches):
            storage.audit.append(
                [
                    AuditEvent("test.appended", actor=f"w{writer}", tenant=t, data={"n": batch})
                    for _ in range(per_batch)
                    for t in tenants
                ]
            )

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(append, range(2)))

    result = verify(storage.audit, KEYS, record=False)
    assert [(c.chain, c.intact) for c in result.chains] == [
        (tenant_chain("acme"), True),
        (tenant_chain("globex"), True),
    ]
    for tenant in ("acme", "globex"):
        assert storage.audit.head(tenant_chain(tenant)).seq == 2 * batches * per_batch
        assert [c.seq for c in storage.audit.checkpoints(tenant_chain(tenant))] == [1000]


def test_dispatch_and_another_writer_append_to_one_chain_without_breaking_it(
    leader: Storage,
) -> None:
    due(leader, "acme", 120)
    barrier = threading.Barrier(2)

    def dispatcher() -> int:
        barrier.wait(timeout=THREAD_TIMEOUT_S)
        return sum(len(r.dispatched) for r in dispatch_all(leader, "t", limit=10))

    def writer() -> int:
        barrier.wait(timeout=THREAD_TIMEOUT_S)
        for n in range(40):
            leader.audit.append(
                [AuditEvent("test.appended", actor="op", tenant="acme", data={"n": n})]
            )
        return 40

    with ThreadPoolExecutor(max_workers=2) as pool:
        fired, written = (
            f.result(THREAD_TIMEOUT_S) for f in [pool.submit(dispatcher), pool.submit(writer)]
        )

    assert fired == 120
    (report,) = verify(leader.audit, KEYS, chains=[tenant_chain("acme")], record=False).chains
    assert report.intact, report.problem
    assert report.head.seq == fired + written


# --- a lease held elsewhere, mirrored into the row dispatch fences on ----------------------


def mirroring(storage: Storage) -> Any:
    """The lease store of a backend that mirrors external leases (Redis, an advisory lock)."""
    leases = storage.leases
    if not hasattr(leases, "mirror"):
        pytest.skip(f"{type(leases).__name__} mirrors no external lease")
    return leases


def external(token: str, clock: ManualClock) -> Lease:
    now = clock.now_ms()
    return Lease(LEADER_LEASE, token, f"node-{token}", now - 1000, now, now + 600_000)


def test_a_mirrored_lease_is_what_the_row_then_says(storage: Storage, clock: ManualClock) -> None:
    assert storage.leases.acquire(LEADER_LEASE, "t", "n1", 600_000) is not None
    lease = external("x", clock)

    mirroring(storage).mirror(lease)

    assert storage.leases.current(LEADER_LEASE) == lease


def test_dispatch_lands_under_a_mirrored_lease_and_not_under_the_one_it_replaced(
    storage: Storage, clock: ManualClock
) -> None:
    due(storage, "acme", 5)
    assert storage.leases.acquire(LEADER_LEASE, "t", "n1", 600_000) is not None

    mirroring(storage).mirror(external("x", clock))

    with pytest.raises(LeaseNotOwned):
        dispatch_as(storage, "t")
    assert len(dispatch_as(storage, "x").dispatched) == 5


def test_unmirror_removes_only_the_row_of_its_token(storage: Storage, clock: ManualClock) -> None:
    leases = mirroring(storage)
    leases.mirror(external("x", clock))

    leases.unmirror(LEADER_LEASE, "y")
    assert storage.leases.current(LEADER_LEASE) == external("x", clock)
    leases.unmirror(LEADER_LEASE, "x")
    assert storage.leases.current(LEADER_LEASE) is None


# --- lease shards --------------------------------------------------------------------------


def test_a_shard_of_one_is_every_schedule(leader: Storage) -> None:
    due(leader, "acme", 10)

    assert len(dispatch_as(leader, "t", shard=(0, 1)).dispatched) == 10


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0)])
def test_a_shard_that_does_not_exist_is_refused(leader: Storage, shard: tuple[int, int]) -> None:
    due(leader, "acme", 3)

    with pytest.raises(InvalidInput, match="does not exist"):
        dispatch_as(leader, "t", shard=shard)

    assert leader.runs.count() == 0


def test_shards_split_the_schedules_by_their_ids_hash(leader: Storage) -> None:
    from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - an extra

    due(leader, "acme", 40)
    if not isinstance(leader, PostgresBackend):
        with pytest.raises(InvalidInput, match="lease shards need PostgreSQL"):
            dispatch_as(leader, "t", shard=(0, 2))
        assert leader.runs.count() == 0
        return

    shards = [dispatch_as(leader, "t", shard=(index, 3)).dispatched for index in range(3)]

    for index, fired in enumerate(shards):
        assert {zlib.crc32(f.schedule_id.encode()) % 3 for f in fired} <= {index}
    assert sum(len(fired) for fired in shards) == 40
    assert leader.dispatcher.next_due_at() > NOW  # type: ignore[operator]


# --- the change feed -----------------------------------------------------------------------


def test_a_threads_first_wait_reports_a_change(storage: Storage) -> None:
    assert storage.changes.wait(5.0) is True


def test_a_wait_with_nothing_changed_returns_false_when_it_times_out(storage: Storage) -> None:
    storage.changes.wait(5.0)

    assert storage.changes.wait(0.2) is False


def test_a_commit_through_another_connection_wakes_a_waiter(storage: Storage) -> None:
    address = address_of(storage)
    assert address is not None
    other = open_store(address)
    try:
        storage.changes.wait(5.0)
        timer = threading.Timer(0.2, lambda: other.schedules.insert(make_schedule("elsewhere")))
        started = time.monotonic()
        timer.start()
        woke = storage.changes.wait(30.0)
        timer.join()
    finally:
        other.close()

    assert woke is True
    assert time.monotonic() - started < 10.0


def test_notify_wakes_a_waiting_thread(storage: Storage) -> None:
    def wait() -> bool:
        storage.changes.wait(5.0)  # this thread's first: the baseline
        ready.set()
        return storage.changes.wait(30.0)

    ready = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(wait)
        assert ready.wait(THREAD_TIMEOUT_S)
        time.sleep(0.1)
        started = time.monotonic()
        storage.changes.notify()
        assert waiting.result(timeout=THREAD_TIMEOUT_S) is True
    assert time.monotonic() - started < 10.0


def test_the_callers_own_event_wakes_a_waiter(storage: Storage) -> None:
    storage.changes.wait(5.0)
    wake = threading.Event()
    threading.Timer(0.1, wake.set).start()
    started = time.monotonic()

    assert storage.changes.wait(30.0, wake) is True
    assert time.monotonic() - started < 10.0


def test_the_change_feed_hears_commits_again_after_its_connection_broke(
    storage: Storage,
) -> None:
    from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - an extra

    if not isinstance(storage, PostgresBackend):
        pytest.skip("only a server's listener connection can break")
    import psycopg  # noqa: PLC0415

    from engine.backends.postgres.changes import LISTENER_NAME  # noqa: PLC0415

    storage.changes.wait(5.0)
    with psycopg.connect(storage.url, autocommit=True) as admin:
        schema = admin.execute("SELECT current_schema()").fetchone()
        assert schema is not None
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"{LISTENER_NAME}{schema[0]}",),
        ).fetchall()
    assert ended == [(True,)]
    # Notifications sent while it was away are lost: reconnecting counts as a change.
    assert storage.changes.wait(30.0) is True
    assert storage.changes.wait(0.2) is False
    threading.Timer(0.2, lambda: storage.schedules.insert(make_schedule("after"))).start()
    assert storage.changes.wait(30.0) is True

"""Dispatch (engine.ports.dispatch): the per-tenant cap of a dispatch transaction (one tenant's
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
from engine.runtime.daemon import resolver_at
from engine.testing.conformance.builders import FIRST_SLOT, make_schedule, must_raise
from engine.testing.conformance.storage import StorageConformance

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
    """One dispatch transaction by the leader, with a per-tenant cap of `cap`."""
    return storage.dispatcher.dispatch_due(
        lease_key=LEADER_LEASE,
        token="t",
        node_id="n1",
        now_ms=NOW,
        limit=LIMIT,
        resolve=resolver_at(NOW),
        tenant_cap=cap,
    )


def per_tenant(report: DispatchReport) -> Counter[str]:
    """How many fires each tenant got."""
    return Counter(fire.tenant for fire in report.dispatched)


# --- dispatch under concurrency ------------------------------------------------------------


THREAD_TIMEOUT_S = 60


def dispatch_as(
    storage: Storage,
    token: str,
    *,
    limit: int = LIMIT,
    resolve: Callable[[Schedule, int], SlotPlan] | None = None,
    shard: tuple[int, int] | None = None,
) -> DispatchReport:
    """One dispatch transaction under `token`, as the node `node-<token>`."""
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


# --- a lease held elsewhere, mirrored into the row dispatch fences on ----------------------


def mirroring(storage: Storage) -> Any:
    """The lease store of a backend that mirrors external leases (Redis, an advisory lock)."""
    leases = storage.leases
    if not hasattr(leases, "mirror"):
        pytest.skip(f"{type(leases).__name__} mirrors no external lease")
    return leases


def external(token: str, clock: ManualClock) -> Lease:
    """A leader lease held elsewhere under `token`, live for ten minutes."""
    now = clock.now_ms()
    return Lease(LEADER_LEASE, token, f"node-{token}", now - 1000, now, now + 600_000)


class FairDispatchConformance(StorageConformance):
    """Checks `Storage.dispatcher` (DispatchPort), with the leases it fences on
    (`Storage.leases`), the audit chains it appends to (`Storage.audit`), and the change feed
    that wakes a sleeping daemon (`Storage.changes`).

    Guarantees:
    - fairness: with a per-tenant cap, one tenant's backlog never delays another tenant's
      fires by more than a transaction, and a tenant alone is not slowed down;
    - fencing: a dispatch lands only under the live lease's token: a deposed leader, an
      expired lease or a second dispatcher lands nothing, and the lease cannot change hands
      between a dispatch's check and its commit;
    - exactly once: dispatch transactions running at once fire every due slot exactly once;
    - the audit chains stay valid, signed chains when several writers append at once;
    - a lease held elsewhere and mirrored into the store is what dispatch fences on (for a
      lease store with `mirror`/`unmirror`); lease shards split the schedules;
    - the change feed reports changes and wakes its waiters.

    Subclass it, implement `open_storage` (see StorageConformance) and `audit_keys`, the key
    ring the store signs its audit entries with:

        class TestMyStore(FairDispatchConformance):
            def open_storage(self, clock, directory):
                return closing(MyStore(directory / "store.db", clock, audit_keys=KEYS))
            def audit_keys(self): return KEYS

    A store that runs one write transaction at a time, as SQLite does, sets
    `serialises_writes = True`: the port lets it refuse lease shards.
    """

    # True for a store that runs one write transaction at a time; it refuses lease shards
    # (count > 1) with InvalidInput, which the port allows.
    serialises_writes = False

    def audit_keys(self) -> KeyRing:
        """The key ring the stores `open_storage` opens sign audit entries with: the suite
        verifies the chains that dispatch and concurrent writers append to."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement audit_keys: the key ring its store signs with"
        )

    @pytest.fixture
    def leader(self, storage: Storage) -> Storage:
        """The store, its leader lease held by token "t" of node n1 for ten minutes."""
        assert storage.leases.acquire(LEADER_LEASE, "t", "n1", 600_000) is not None
        return storage

    def test_a_tenant_behind_anothers_backlog_fires_in_the_first_transaction(
        self,
        leader: Storage,
    ) -> None:
        due(leader, "acme", 300)
        due(leader, "globex", 5, at=FIRST_SLOT + 1)  # behind every one of acme's in due order
        first = dispatch(leader)
        assert per_tenant(first) == {"acme": LIMIT - 5, "globex": 5}, (
            "fairness: a tenant behind another's backlog must fire in the first capped transaction"
        )
        assert first.truncated
        assert first.capped == {"acme": 5}

    def test_without_the_cap_the_same_tenant_waits_for_the_whole_backlog(
        self, leader: Storage
    ) -> None:
        due(leader, "acme", 300)
        due(leader, "globex", 5, at=FIRST_SLOT + 1)
        assert per_tenant(dispatch(leader, cap=None)) == {"acme": LIMIT}
        assert per_tenant(dispatch(leader, cap=None)) == {"acme": LIMIT}
        assert per_tenant(dispatch(leader, cap=None)) == {"acme": LIMIT}
        assert per_tenant(dispatch(leader, cap=None)) == {"globex": 5}

    def test_a_tenant_alone_with_a_backlog_fills_every_transaction(self, leader: Storage) -> None:
        due(leader, "acme", 250)
        sizes = [len(dispatch(leader).dispatched) for _ in range(3)]
        assert sizes == [LIMIT, LIMIT, 50], (
            "fairness: the cap must not slow down a tenant that is alone with a backlog"
        )

    def test_with_many_tenants_waiting_each_gets_its_share_and_every_slot_fires_once(
        self,
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
        assert max(first_fired.values()) <= 2, (  # nobody waits out acme's backlog
            f"fairness: every tenant must fire within two transactions: {first_fired}"
        )
        runs = leader.runs.query(RunQuery(limit=10_000))
        assert len(runs) == 400 + 6 * 30
        assert len({(r.tenant, r.slot_key) for r in runs}) == len(runs), (
            "exactly once: no slot may be dispatched twice"
        )

    def test_a_small_tenant_is_not_capped_at_all(self, leader: Storage) -> None:
        due(leader, "acme", 300)
        due(leader, "globex", CAP * 3, at=FIRST_SLOT + 1)
        first = per_tenant(dispatch(leader))
        assert first["globex"] == CAP  # its share while acme is over the cap
        assert first["acme"] == LIMIT - CAP

    # --- dispatch under concurrency ------------------------------------------------------------

    def test_a_deposed_leaders_dispatch_lands_nothing(
        self, leader: Storage, clock: ManualClock
    ) -> None:
        due(leader, "acme", 5)
        clock.advance(601)  # past the lease's expiry
        assert leader.leases.acquire(LEADER_LEASE, "u", "n2", 600_000) is not None

        with must_raise(LeaseNotOwned, "fencing: a deposed leader's dispatch must be refused"):
            dispatch_as(leader, "t")

        assert leader.runs.count() == 0, "fencing: a deposed leader's dispatch must land nothing"
        assert leader.audit.chains() == []

    def test_a_dispatch_under_an_expired_lease_lands_nothing(self, leader: Storage) -> None:
        due(leader, "acme", 5)
        lease = leader.leases.current(LEADER_LEASE)
        assert lease is not None

        with must_raise(LeaseExpired, "fencing: a dispatch under an expired lease must be refused"):
            leader.dispatcher.dispatch_due(
                lease_key=LEADER_LEASE,
                token="t",
                node_id="n1",
                now_ms=lease.expires_at,
                limit=LIMIT,
                resolve=resolver_at(NOW),
            )

        assert leader.runs.count() == 0, (
            "fencing: a dispatch under an expired lease must land nothing"
        )

    def test_of_two_dispatchers_racing_with_two_tokens_only_the_lease_holders_lands(
        self,
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

                assert reports[other] is None, (
                    f"fencing: round {round_no}: {other} dispatched without holding the lease"
                )
                won = reports[holder]
                assert won is not None
                assert {f.node_id for f in won.dispatched} == {f"node-{holder}"}
                assert len(won.dispatched) == 10
                # The lease changes hands for the next round.
                leader.leases.release(LEADER_LEASE, holder)
                assert leader.leases.acquire(LEADER_LEASE, other, "n2", 600_000) is not None
                holder, other = other, holder
        runs = leader.runs.query(RunQuery(limit=1000))
        assert len({(r.tenant, r.slot_key) for r in runs}) == len(runs) == 60, (
            "exactly once: each round's slots must be dispatched once, by the lease holder"
        )

    def test_a_lease_taken_over_mid_dispatch_waits_for_the_dispatch_to_commit(
        self, leader: Storage, clock: ManualClock
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
        assert committed == 3, (
            "fencing: the lease must not change hands between a dispatch's check and its commit"
        )
        assert len(report.dispatched) == 3

    def test_dispatch_transactions_at_once_fire_every_slot_exactly_once(
        self, leader: Storage
    ) -> None:
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
        assert len({(f.tenant, f.slot_key) for f in fired}) == 200, (
            "exactly once: dispatch transactions at once must fire every slot exactly once"
        )
        assert sum(r.already_dispatched for r in reports) == 0, (
            "dispatch transactions at once must not even try a slot twice (a due schedule is "
            "taken by one transaction)"
        )
        assert leader.runs.count() == 200
        assert leader.dispatcher.next_due_at() is not None
        assert leader.dispatcher.next_due_at() > NOW  # type: ignore[operator]

    def test_appends_to_the_same_chains_from_two_threads_keep_them_valid_chains(
        self,
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

        result = verify(storage.audit, self.audit_keys(), record=False)
        assert [(c.chain, c.intact) for c in result.chains] == [
            (tenant_chain("acme"), True),
            (tenant_chain("globex"), True),
        ], "audit chain: appends from two writers at once must keep every chain intact"
        for tenant in ("acme", "globex"):
            # The chain's opening, and every entry of both writers.
            assert storage.audit.head(tenant_chain(tenant)).seq == 1 + 2 * batches * per_batch, (
                "audit chain: no append from two writers at once may be lost"
            )
            assert [c.seq for c in storage.audit.checkpoints(tenant_chain(tenant))] == [1000]

    def test_dispatch_and_another_writer_append_to_one_chain_without_breaking_it(
        self,
        leader: Storage,
    ) -> None:
        due(leader, "acme", 120)
        barrier = threading.Barrier(2)

        batches: list[DispatchReport] = []

        def dispatcher() -> int:
            barrier.wait(timeout=THREAD_TIMEOUT_S)
            reports = dispatch_all(leader, "t", limit=10)
            batches.extend(r for r in reports if r.dispatched)
            return sum(len(r.dispatched) for r in reports)

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
        (report,) = verify(
            leader.audit, self.audit_keys(), chains=[tenant_chain("acme")], record=False
        ).chains
        assert report.intact, (
            f"audit chain: dispatch beside another writer broke it: {report.problem}"
        )
        # The chain's opening, one entry per dispatch transaction (not per fire), the writes.
        assert report.head.seq == 1 + len(batches) + written, (
            "audit chain: every dispatch transaction appends one entry for its fires"
        )

    # --- a lease held elsewhere, mirrored into the row dispatch fences on ----------------------

    def test_a_mirrored_lease_is_what_the_row_then_says(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        assert storage.leases.acquire(LEADER_LEASE, "t", "n1", 600_000) is not None
        lease = external("x", clock)

        mirroring(storage).mirror(lease)

        assert storage.leases.current(LEADER_LEASE) == lease, (
            "a mirrored lease must be what the lease row then says, whoever held it"
        )

    def test_dispatch_lands_under_a_mirrored_lease_and_not_under_the_one_it_replaced(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        due(storage, "acme", 5)
        assert storage.leases.acquire(LEADER_LEASE, "t", "n1", 600_000) is not None

        mirroring(storage).mirror(external("x", clock))

        with must_raise(
            LeaseNotOwned, "fencing: the token a mirrored lease replaced must not dispatch"
        ):
            dispatch_as(storage, "t")
        assert len(dispatch_as(storage, "x").dispatched) == 5, (
            "dispatch must land under the mirrored lease's token"
        )

    def test_unmirror_removes_only_the_row_of_its_token(
        self, storage: Storage, clock: ManualClock
    ) -> None:
        leases = mirroring(storage)
        leases.mirror(external("x", clock))

        leases.unmirror(LEADER_LEASE, "y")
        assert storage.leases.current(LEADER_LEASE) == external("x", clock)
        leases.unmirror(LEADER_LEASE, "x")
        assert storage.leases.current(LEADER_LEASE) is None

    # --- lease shards --------------------------------------------------------------------------

    def test_a_shard_of_one_is_every_schedule(self, leader: Storage) -> None:
        due(leader, "acme", 10)

        assert len(dispatch_as(leader, "t", shard=(0, 1)).dispatched) == 10

    @pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0)])
    def test_a_shard_that_does_not_exist_is_refused(
        self, leader: Storage, shard: tuple[int, int]
    ) -> None:
        due(leader, "acme", 3)

        with must_raise(InvalidInput, "lease shards: a shard that does not exist must be refused"):
            dispatch_as(leader, "t", shard=shard)

        assert leader.runs.count() == 0, "a refused dispatch must write nothing"

    def test_shards_split_the_schedules_by_their_ids_hash(self, leader: Storage) -> None:
        due(leader, "acme", 40)
        if self.serialises_writes:
            with must_raise(
                InvalidInput,
                "lease shards: a store that refuses them must say so and write nothing",
            ):
                dispatch_as(leader, "t", shard=(0, 2))
            assert leader.runs.count() == 0, "a refused dispatch must write nothing"
            return

        shards = [dispatch_as(leader, "t", shard=(index, 3)).dispatched for index in range(3)]

        for index, fired in enumerate(shards):
            # The shard key: the CRC-32 of the id (the hash DispatchPort's contract names).
            assert {zlib.crc32(f.schedule_id.encode()) % 3 for f in fired} <= {index}, (
                "lease shards: shard i of n dispatches only the schedules whose shard key "
                "modulo n is i"
            )
        assert sum(len(fired) for fired in shards) == 40, (
            "lease shards: the shards together must dispatch every due schedule, once"
        )
        assert leader.dispatcher.next_due_at() > NOW  # type: ignore[operator]

    # --- the change feed -----------------------------------------------------------------------

    def test_a_threads_first_wait_reports_a_change(self, storage: Storage) -> None:
        assert storage.changes.wait(5.0) is True, (
            "change feed: a thread's first wait must report a change (it has seen nothing yet)"
        )

    def test_a_wait_with_nothing_changed_returns_false_when_it_times_out(
        self, storage: Storage
    ) -> None:
        storage.changes.wait(5.0)

        assert storage.changes.wait(0.2) is False, (
            "change feed: a wait with nothing changed must time out and return False"
        )

    def test_notify_wakes_a_waiting_thread(self, storage: Storage) -> None:
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
            assert waiting.result(timeout=THREAD_TIMEOUT_S) is True, (
                "change feed: notify() must wake a waiting thread"
            )
        assert time.monotonic() - started < 10.0

    def test_the_callers_own_event_wakes_a_waiter(self, storage: Storage) -> None:
        storage.changes.wait(5.0)
        wake = threading.Event()
        threading.Timer(0.1, wake.set).start()
        started = time.monotonic()

        assert storage.changes.wait(30.0, wake) is True, (
            "change feed: the caller's own event must wake the waiter"
        )
        assert time.monotonic() - started < 10.0

"""The per-tenant cap of a dispatch transaction, on every backend: one tenant's backlog cannot
starve another tenant's fires, and a tenant alone with a backlog is not slowed down."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.domain.timeutil import MINUTE_MS
from engine.ports.dispatch import DispatchReport
from engine.ports.lease import LEADER_LEASE
from engine.ports.runs import RunQuery
from engine.ports.storage import Storage
from tests.conformance._builders import FIRST_SLOT, make_schedule
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

"""The tenant isolation conformance suite: an operator scoped to one tenant sees and changes
nothing of another's, through every read and every change of the service, through the console's
read model, and through every store method that takes a tenant or a scope.

The store holds two tenants, acme and globex, each with a schedule, a sensitive schedule, a
completed run, a dead letter, a pending approval request and its audit chain. olga operates
acme, vera views acme, bea approves acme; admin holds admin in every tenant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from engine import (
    ApprovalRequired,
    Engine,
    IntervalTrigger,
    ManualClock,
    NotFound,
    RunState,
    ScheduleSpec,
    ScheduleStatus,
)
from engine.commands import builtin_commands
from engine.domain.access import PermissionDenied, Role
from engine.domain.approvals import ApprovalState
from engine.domain.audit import SYSTEM_CHAIN, tenant_chain
from engine.domain.timeutil import MINUTE_MS
from engine.governance.policy import AccessControl
from engine.ports.fire_queue import FireQuery, FireState, Outcome, Settlement
from engine.ports.read_model import FireListQuery, ReadModel, ScheduleListQuery
from engine.ports.runs import RunQuery
from engine.ports.schedules import ScheduleQuery
from engine.ports.storage import Storage
from engine.testing.conformance.builders import must_raise
from engine.testing.conformance.storage import T0, StorageConformance

T = TypeVar("T")
TENANTS = ("acme", "globex")
OTHER = "globex"
ISOLATION = "tenant isolation: "


def read(call: Coroutine[Any, Any, T]) -> T:
    """The read model's answer, from synchronous test code."""
    return asyncio.run(call)


@dataclass(frozen=True)
class World:
    """The governed engine over the store, and the ids of each tenant's rows."""

    engine: Engine
    clock: ManualClock
    schedule_ids: dict[str, str]
    run_ids: dict[str, int]  # a completed run
    dead_ids: dict[str, int]  # a dead-lettered run
    approval_ids: dict[str, str]  # a pending request
    open_model: Callable[[str], ReadModel]

    def model(self, operator: str) -> ReadModel:
        """The console's read model, narrowed to what `operator` may view."""
        return self.open_model(operator)

    def snapshot(self, tenant: str) -> tuple[Any, ...]:
        """Everything stored of `tenant`, to show a refused change changed nothing."""
        storage = self.engine.storage
        return (
            storage.schedules.query(ScheduleQuery(tenant=tenant)),
            storage.runs.query(RunQuery(tenant=tenant, limit=1000)),
            storage.fire_queue.read(FireQuery(tenant=tenant, limit=1000)),
            storage.approvals.list(tenant=tenant),
            storage.audit.head(tenant_chain(tenant)),
        )


Ids = tuple[dict[str, str], dict[str, int], dict[str, int]]


def _settle(engine: Engine, settlement: Settlement) -> None:
    """Claim the one open fire and settle it so."""
    claim = engine.storage.fire_queue.claim(consumer="c1", ttl_ms=60_000, limit=10)
    assert [f.run_id for f in claim.fires] == [settlement.run_id]
    report = engine.storage.fire_queue.settle(claim.token, "c1", [settlement])
    assert not report.stale


def _seed(storage: Storage, clock: ManualClock) -> Ids:
    """Two tenants' rows, written by trusted code (no roles, no four-eyes)."""
    schedule_ids: dict[str, str] = {}
    run_ids: dict[str, int] = {}
    dead_ids: dict[str, int] = {}
    # Not closed: the store is the fixture's, and outlives this engine.
    trusted = Engine(storage, clock, builtin_commands())
    service = trusted.service
    for tenant in TENANTS:
        for name, sensitive in (("report", False), ("payroll", True)):
            made = service.create(
                ScheduleSpec(
                    name,
                    IntervalTrigger(MINUTE_MS, T0),
                    "noop",
                    tenant=tenant,
                    sensitive=sensitive,
                ),
                actor="admin",
            )
            if name == "report":
                schedule_ids[tenant] = made.id
        done = service.trigger("report", actor="admin", tenant=tenant)
        _settle(trusted, Settlement(done.id, Outcome.COMPLETE, RunState.COMPLETED))
        dead = service.trigger("report", actor="admin", tenant=tenant)
        _settle(
            trusted,
            Settlement(dead.id, Outcome.DISCARD, RunState.DEAD_LETTERED, error="given up"),
        )
        run_ids[tenant], dead_ids[tenant] = done.id, dead.id
    service.grant_role("admin", Role.ADMIN, actor="admin")
    for who, role, tenant in (
        ("olga", Role.OPERATOR, "acme"),
        ("vera", Role.VIEWER, "acme"),
        ("bea", Role.APPROVER, "acme"),
        ("gus", Role.OPERATOR, "globex"),
    ):
        service.grant_role(who, role, actor="admin", tenant=tenant)
    return schedule_ids, run_ids, dead_ids


# The service's lists: each returns the tenants of what it read for the operator.
SCOPED_READS: dict[str, Callable[[World, str], list[str]]] = {
    "schedules": lambda w, who: [s.tenant for s in w.engine.service.schedules(actor=who)],
    "runs": lambda w, who: [r.tenant for r in w.engine.service.runs(RunQuery(), actor=who)],
    "dead_letters": lambda w, who: [f.tenant for f in w.engine.service.dead_letters(actor=who)],
    "approvals": lambda w, who: [a.tenant for a in w.engine.service.approvals(actor=who)],
    "audit_chains": lambda w, who: [
        c.removeprefix("tenant:") for c in w.engine.service.audit_chains(actor=who)
    ],
    "audit_latest": lambda w, who: [
        e.tenant or SYSTEM_CHAIN for e in w.engine.service.audit_latest(actor=who, limit=1000)
    ],
}

# The service's reads naming another tenant (or the system chain, or every tenant).
NAMED_READS: dict[str, Callable[[World], object]] = {
    "get": lambda w: w.engine.service.get("report", tenant=OTHER, actor="olga"),
    "preview": lambda w: w.engine.service.preview("report", tenant=OTHER, actor="olga"),
    "schedules": lambda w: w.engine.service.schedules(tenant=OTHER, actor="olga"),
    "runs": lambda w: w.engine.service.runs(RunQuery(tenant=OTHER), actor="olga"),
    "dead_letters": lambda w: w.engine.service.dead_letters(tenant=OTHER, actor="olga"),
    "approvals": lambda w: w.engine.service.approvals(tenant=OTHER, actor="olga"),
    "audit_chains": lambda w: w.engine.service.audit_chains(
        actor="olga", wanted=[tenant_chain(OTHER)]
    ),
    "audit_latest": lambda w: w.engine.service.audit_latest(
        actor="olga", chain=tenant_chain(OTHER)
    ),
    "audit_latest(system)": lambda w: w.engine.service.audit_latest(
        actor="olga", chain=SYSTEM_CHAIN
    ),
}

# The service's calls by the id of another tenant's row.
BY_ID: dict[str, Callable[[World], object]] = {
    "run": lambda w: w.engine.service.run(w.run_ids[OTHER], actor="olga"),
    "approval": lambda w: w.engine.service.approval(w.approval_ids[OTHER], actor="bea"),
    "approve": lambda w: w.engine.service.approve(w.approval_ids[OTHER], actor="bea"),
    "reject": lambda w: w.engine.service.reject(
        w.approval_ids[OTHER], actor="bea", reason="not yours to decide"
    ),
}

# The service's changes in another tenant (or in every tenant).
CHANGES: dict[str, Callable[[World], object]] = {
    "create": lambda w: w.engine.service.create(
        ScheduleSpec("mine", IntervalTrigger(MINUTE_MS, T0), "noop", tenant=OTHER),
        actor="olga",
    ),
    "pause": lambda w: w.engine.service.pause("report", actor="olga", tenant=OTHER),
    "resume": lambda w: w.engine.service.resume("report", actor="olga", tenant=OTHER),
    "delete": lambda w: w.engine.service.delete("report", actor="olga", tenant=OTHER),
    "trigger": lambda w: w.engine.service.trigger("report", actor="olga", tenant=OTHER),
    "backfill": lambda w: w.engine.service.backfill(
        "report", start_ms=T0, end_ms=T0 + MINUTE_MS, actor="olga", tenant=OTHER
    ),
    "requeue": lambda w: w.engine.service.requeue([w.dead_ids[OTHER]], actor="olga", tenant=OTHER),
    "requeue(all tenants)": lambda w: w.engine.service.requeue(None, actor="olga"),
    "purge": lambda w: w.engine.service.purge([w.dead_ids[OTHER]], actor="olga", tenant=OTHER),
    "purge(all tenants)": lambda w: w.engine.service.purge(None, actor="olga"),
    "grant_role": lambda w: w.engine.service.grant_role(
        "olga", Role.OPERATOR, actor="olga", tenant=OTHER
    ),
}

# Scopes: olga's tenant, and no tenant at all.
ACME = frozenset({"acme"})
NOBODY: frozenset[str] = frozenset()

# The store methods that take a scope: each returns the tenants of what it read.
STORE_READS: dict[str, Callable[[World, frozenset[str]], list[str]]] = {
    "ScheduleStore.query": lambda w, scope: [
        s.tenant for s in w.engine.storage.schedules.query(ScheduleQuery(tenants=scope))
    ],
    "ScheduleStore.query(status)": lambda w, scope: [
        s.tenant
        for s in w.engine.storage.schedules.query(
            ScheduleQuery(tenants=scope, status=ScheduleStatus.ACTIVE)
        )
    ],
    "RunLedger.query": lambda w, scope: [
        r.tenant for r in w.engine.storage.runs.query(RunQuery(tenants=scope, limit=1000))
    ],
    "FireQueue.read": lambda w, scope: [
        f.tenant for f in w.engine.storage.fire_queue.read(FireQuery(tenants=scope, limit=1000))
    ],
    "FireQueue.read(dead)": lambda w, scope: [
        f.tenant
        for f in w.engine.storage.fire_queue.read(
            FireQuery(tenants=scope, states=frozenset({FireState.DISCARDED}))
        )
    ],
    "ApprovalStore.list": lambda w, scope: [
        a.tenant for a in w.engine.storage.approvals.list(tenants=scope)
    ],
}


class TenantIsolationConformance(StorageConformance):
    """Tenant isolation across the store's ports (schedules, runs, fire queue, approvals,
    operators, audit), as the service and the console's read model use them.

    Guarantees checked, for an operator granted roles in one tenant:
    - every list the service gives them holds only their tenant's rows (an admin's holds
      both tenants': the data is there to leak);
    - naming another tenant is refused with PermissionDenied, and another tenant's id is
      NotFound, as if it did not exist (the message says nothing of that tenant);
    - every change in another tenant is refused and changes nothing stored of it;
    - the read model counts, lists and finds only what they may view, and narrows at its next
      read when a grant is revoked;
    - every store read narrowed to a scope returns only its tenants' rows (an empty scope,
      none), and every look-up by id in a tenant misses another tenant's row.

    Subclass it and implement `open_storage`; implement `open_read_model` too if your backend
    has a read model for the console (its tests skip otherwise):

        class TestMyTenants(TenantIsolationConformance):
            def open_storage(self, clock, directory):
                return closing(MyStorage(directory / "store.db", clock))
    """

    def open_read_model(self, storage: Storage, operator: str) -> ReadModel:
        """The console's read model of `storage` (engine.ports.read_model.ReadModel), narrowed
        to what `operator` may view; the suite never closes it."""
        pytest.skip(f"{type(self).__name__} has no open_read_model: the read model is not checked")

    @pytest.fixture
    def world(self, storage: Storage, clock: ManualClock) -> World:
        """The seeded store under an engine that enforces roles, with each tenant's pending
        request for a sensitive change."""
        schedule_ids, run_ids, dead_ids = _seed(storage, clock)
        engine = Engine(storage, clock, builtin_commands(), AccessControl(storage, clock))
        approval_ids: dict[str, str] = {}
        for tenant, asker in (("acme", "olga"), ("globex", "gus")):
            with pytest.raises(ApprovalRequired) as waiting:
                engine.service.trigger("payroll", actor=asker, tenant=tenant)
            approval_ids[tenant] = waiting.value.approval.id
        return World(
            engine,
            clock,
            schedule_ids,
            run_ids,
            dead_ids,
            approval_ids,
            lambda operator: self.open_read_model(storage, operator),
        )

    # -- the service's reads ----------------------------------------------------------------

    @pytest.mark.parametrize("method", sorted(SCOPED_READS))
    @pytest.mark.parametrize("who", ["olga", "vera"])
    def test_a_list_holds_only_the_operators_tenant(
        self, world: World, method: str, who: str
    ) -> None:
        seen = SCOPED_READS[method](world, who)
        assert seen, f"{method} showed {who} nothing of their own tenant"
        assert set(seen) == {"acme"}, (
            f"{ISOLATION}{method} must show {who} only the tenant they hold a role in"
        )
        # The same read by an admin sees both tenants: the data is there to leak.
        assert set(SCOPED_READS[method](world, "admin")) >= set(TENANTS), (
            f"{method} must show an admin of every tenant both tenants' rows"
        )

    @pytest.mark.parametrize("method", sorted(NAMED_READS))
    def test_naming_another_tenant_is_refused_with_the_missing_permission(
        self, world: World, method: str
    ) -> None:
        with must_raise(
            PermissionDenied,
            f"{ISOLATION}{method} naming a tenant the operator holds no role in must be refused, "
            "saying what they may not do",
            match=r"olga may not .*(globex|every tenant)",
        ):
            NAMED_READS[method](world)

    @pytest.mark.parametrize("method", sorted(BY_ID))
    def test_another_tenants_id_is_not_found_as_if_it_did_not_exist(
        self, world: World, method: str
    ) -> None:
        before = world.snapshot(OTHER)
        with must_raise(
            NotFound, f"{ISOLATION}{method} by another tenant's id must raise NotFound"
        ) as refused:
            BY_ID[method](world)
        assert OTHER not in str(refused.value), (
            f"{ISOLATION}the NotFound of another tenant's id must tell nothing of that tenant"
        )
        assert world.snapshot(OTHER) == before, (
            f"{ISOLATION}{method} by another tenant's id must change nothing of it"
        )

    def test_the_same_ids_in_the_operators_own_tenant_are_found(self, world: World) -> None:
        assert world.engine.service.run(world.run_ids["acme"], actor="olga").tenant == "acme", (
            "the operator's own tenant's run must be found by its id"
        )
        found = world.engine.service.approval(world.approval_ids["acme"], actor="bea")
        assert found.tenant == "acme"
        approved = world.engine.service.approve(found.id, actor="bea")
        assert approved.state_at(world.clock.now_ms()) is ApprovalState.APPROVED

    # -- the service's changes --------------------------------------------------------------

    @pytest.mark.parametrize("method", sorted(CHANGES))
    def test_a_change_in_another_tenant_is_refused_and_changes_nothing(
        self, world: World, method: str
    ) -> None:
        before = world.snapshot(OTHER)
        with must_raise(
            PermissionDenied,
            f"{ISOLATION}{method} in a tenant the operator holds no role in must be refused",
            match="olga may not",
        ):
            CHANGES[method](world)
        assert world.snapshot(OTHER) == before, (
            f"{ISOLATION}a refused {method} must change nothing stored of the other tenant"
        )

    def test_another_tenants_dead_letter_cannot_be_requeued_through_ones_own_tenant(
        self, world: World
    ) -> None:
        before = world.snapshot(OTHER)
        for change in (world.engine.service.requeue, world.engine.service.purge):
            with must_raise(
                NotFound,
                f"{ISOLATION}{change.__name__} in one's own tenant of another tenant's dead "
                "letter must raise NotFound",
            ):
                change([world.dead_ids[OTHER]], actor="olga", tenant="acme")
        assert world.snapshot(OTHER) == before, (
            f"{ISOLATION}a refused requeue or purge must change nothing stored of the other tenant"
        )

    # -- the console's read model -----------------------------------------------------------

    def test_the_read_model_counts_and_lists_only_the_viewers_tenant(self, world: World) -> None:
        for who in ("olga", "vera"):
            model = world.model(who)
            overview = read(model.overview(world.clock.now_ms()))
            assert (overview.schedules, overview.dead_letters) == (2, 1), (
                f"{ISOLATION}the read model's overview must count only {who}'s tenant's rows"
            )
            assert overview.scope.tenants == frozenset({"acme"})
            assert overview.identity is not None
            assert {(g.role, g.tenant) for g in overview.identity.grants} == {
                (Role.OPERATOR if who == "olga" else Role.VIEWER, "acme")
            }
            page = read(model.schedules(ScheduleListQuery()))
            assert {r.schedule.tenant for r in page.rows} == {"acme"}, (
                f"{ISOLATION}the read model must list only {who}'s tenant's schedules"
            )
            assert page.total == 2
            assert {r.tenant for r in read(model.fires(FireListQuery())).rows} == {"acme"}, (
                f"{ISOLATION}the read model must list only {who}'s tenant's fires"
            )
            assert {a.tenant for a in read(model.approvals())} == {"acme"}, (
                f"{ISOLATION}the read model must list only {who}'s tenant's approvals"
            )
            audit = read(model.audit())
            assert [c.chain for c in audit.chains] == [tenant_chain("acme")], (
                f"{ISOLATION}the read model must show only {who}'s tenant's audit chain"
            )
            assert {e.tenant for e in audit.recent} == {"acme"}
        everything = read(world.model("admin").overview(world.clock.now_ms()))
        assert (everything.schedules, everything.dead_letters) == (4, 2)

    def test_the_read_model_finds_nothing_of_another_tenant_by_id_or_by_filter(
        self, world: World
    ) -> None:
        model = world.model("olga")
        assert read(model.schedule(world.schedule_ids[OTHER])) is None, (
            f"{ISOLATION}the read model must not find another tenant's schedule by its id"
        )
        assert read(model.run(world.run_ids[OTHER])) is None, (
            f"{ISOLATION}the read model must not find another tenant's run by its id"
        )
        assert read(model.schedules(ScheduleListQuery(tenant=OTHER))).rows == (), (
            f"{ISOLATION}the read model must list none of another tenant's schedules"
        )
        assert read(model.fires(FireListQuery(tenant=OTHER))).rows == (), (
            f"{ISOLATION}the read model must list none of another tenant's fires"
        )
        assert read(model.audit(tenant_chain(OTHER))).chain == tenant_chain("acme"), (
            f"{ISOLATION}asked for another tenant's audit chain, the read model must show "
            "the viewer's own"
        )
        assert read(model.audit(SYSTEM_CHAIN)).chain == tenant_chain("acme")
        own = read(model.schedule(world.schedule_ids["acme"]))
        assert own is not None
        assert own.schedule.tenant == "acme"

    def test_a_revoked_grant_narrows_the_read_model_at_its_next_read(self, world: World) -> None:
        model = world.model("olga")
        assert read(model.schedules(ScheduleListQuery())).total == 2
        world.engine.service.revoke_role("olga", Role.OPERATOR, actor="admin", tenant="acme")
        overview = read(model.overview(world.clock.now_ms()))
        assert overview.schedules == 0, (
            f"{ISOLATION}a revoked grant must narrow the read model at its next read"
        )
        assert overview.scope.empty
        assert read(model.schedules(ScheduleListQuery())).rows == ()
        assert read(model.audit()).chains == ()

    def test_an_operator_without_any_grant_sees_nothing(self, world: World) -> None:
        # Refused, told it holds no role (not shown an empty list that reads as "none").
        with pytest.raises(PermissionDenied, match="holds no role"):
            world.engine.service.schedules(actor="mallory")
        with pytest.raises(PermissionDenied, match="holds no role"):
            world.engine.service.audit_chains(actor="mallory")
        assert read(world.model("mallory").overview(world.clock.now_ms())).schedules == 0, (
            f"{ISOLATION}the read model of an operator with no grant must count no schedule"
        )

    # -- the stores -------------------------------------------------------------------------

    @pytest.mark.parametrize("method", sorted(STORE_READS))
    def test_a_store_read_narrowed_to_a_scope_returns_only_its_tenants(
        self, world: World, method: str
    ) -> None:
        assert set(STORE_READS[method](world, ACME)) == {"acme"}, (
            f"{ISOLATION}{method} narrowed to a scope must return only its tenants' rows"
        )
        assert STORE_READS[method](world, NOBODY) == [], (
            f"{ISOLATION}{method} narrowed to a scope of no tenant must return nothing"
        )
        assert set(STORE_READS[method](world, frozenset(TENANTS))) == set(TENANTS)

    def test_store_lookups_by_id_in_a_tenant_do_not_cross_into_another(self, world: World) -> None:
        storage = world.engine.storage
        assert storage.schedules.get(world.schedule_ids[OTHER], "acme") is None, (
            f"{ISOLATION}ScheduleStore.get(id, tenant) must miss another tenant's schedule"
        )
        assert storage.runs.get(world.run_ids[OTHER], "acme") is None, (
            f"{ISOLATION}RunLedger.get(id, tenant) must miss another tenant's run"
        )
        assert storage.schedules.find_by_name("acme", "report") is not None
        assert storage.runs.get(world.run_ids["acme"], "acme") is not None
        other_run = storage.runs.get(world.run_ids[OTHER])
        assert other_run is not None
        assert storage.runs.find_by_slot("acme", other_run.slot_key) is None, (
            f"{ISOLATION}RunLedger.find_by_slot(tenant, key) must miss another tenant's run"
        )

"""The approval and operator stores' conformance suite."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from engine.domain.access import Grant, Role
from engine.domain.approvals import Approval, ApprovalState, GatedOperation
from engine.domain.timeutil import HOUR_MS
from engine.ports.storage import Storage
from engine.testing.conformance.storage import T0, StorageConformance

# The guarantee the racing tests check, as a failure names it.
CONDITIONAL = "conditional transitions: "


def request(
    tenant: str = "acme", digest: str = "digest-1", *, at: int = T0, **changes: Any
) -> Approval:
    """A pending request, open for an hour from `at`."""
    base = Approval(
        id=uuid.uuid4().hex,
        tenant=tenant,
        schedule="nightly-report",
        operation=GatedOperation.UPDATE,
        digest=digest,
        change={"schedule": "nightly-report", "set": {"payload": {"n": 2}}},
        requested_by="alice",
        requested_at=at,
        expires_at=at + HOUR_MS,
        stored_state=ApprovalState.PENDING,
    )
    return replace(base, **changes)


def added(storage: Storage, *approvals: Approval) -> list[Approval]:
    """`approvals`, added to `storage`'s approval store."""
    for approval in approvals:
        storage.approvals.add(approval)
    return list(approvals)


def stored(storage: Storage, approval_id: str) -> Approval:
    """The request as stored now; it must still be there."""
    found = storage.approvals.get(approval_id)
    assert found is not None, f"request {approval_id} is gone"
    return found


def stored_state(storage: Storage, approval_id: str) -> ApprovalState:
    """The state stored for the request now."""
    return stored(storage, approval_id).stored_state


# Threads moving each request at once, and how many requests they race on.
RACERS = 2
ROUNDS = 30


def race(storage: Storage, ids: list[str], expect: ApprovalState, to: ApprovalState) -> list[str]:
    """Each racer moves every request from `expect` to `to`, all starting each request
    together; who won each request, in order."""
    barrier = threading.Barrier(RACERS)

    def racer(name: str) -> list[bool]:
        won = []
        for approval_id in ids:
            barrier.wait(timeout=30)
            won.append(
                storage.approvals.transition(approval_id, expect=expect, to=to, by=name, at=T0)
            )
        return won

    with ThreadPoolExecutor(max_workers=RACERS) as pool:
        futures = {f"approver-{n}": pool.submit(racer, f"approver-{n}") for n in range(RACERS)}
        results = {name: future.result(timeout=120) for name, future in futures.items()}
    winners = []
    for n in range(len(ids)):
        won = [name for name, result in results.items() if result[n]]
        assert len(won) == 1, (
            f"{CONDITIONAL}of {RACERS} threads moving request {n} from {expect.value} to "
            f"{to.value} at once exactly one must succeed; won by {won}"
        )
        winners.append(won[0])
    return winners


class ApprovalStoreConformance(StorageConformance):
    """The approval store (`Storage.approvals`, engine.ports.approvals.ApprovalStore) and the
    operator store (`Storage.operators`, engine.ports.policy.OperatorStore): four-eyes requests
    and grants of roles.

    Guarantees checked:
    - round trip: a request reads back as it was added;
    - conditional transitions: a request moves only from the state the caller expects, so of
      two approvers deciding at once, or two changes consuming one approval, exactly one wins;
      a transition from any other state, or of an unknown request, returns False and changes
      nothing; a transition joins the caller's transaction (it rolls back with it);
    - find ignores an expired request, though nobody swept it; list shows pending requests
      first, then the newest, narrowed to the tenant or scope asked for (an empty scope sees
      nothing);
    - a grant is stored once; revoke removes that grant only and says whether there was one.

    Subclass it and implement `open_storage`:

        class TestMyApprovals(ApprovalStoreConformance):
            def open_storage(self, clock, directory):
                return closing(MyStorage(directory / "store.db", clock))
    """

    # --- requests --------------------------------------------------------------------------

    def test_add_then_get_returns_the_request_as_stored(self, storage: Storage) -> None:
        (pending,) = added(storage, request())
        decided = request(
            stored_state=ApprovalState.REJECTED,
            decided_by="bob",
            decided_at=T0 + 5,
            reason="not during the freeze",
        )
        storage.approvals.add(decided)

        assert storage.approvals.get(pending.id) == pending, (
            "round trip: a request must read back as it was added"
        )
        assert storage.approvals.get(decided.id) == decided, (
            "round trip: a decided request must read back as it was added"
        )
        assert storage.approvals.get("no-such-request") is None

    def test_find_returns_the_newest_unexpired_request_with_the_digest_in_the_state(
        self, storage: Storage
    ) -> None:
        older, newer, _, _, _ = added(
            storage,
            request(at=T0),
            request(at=T0 + 10),
            request(at=T0 + 20, stored_state=ApprovalState.APPROVED),
            request(at=T0 + 30, digest="digest-2"),
            request(at=T0 + 40, tenant="globex"),
        )

        def find(now: int) -> Approval | None:
            return storage.approvals.find(
                tenant="acme", digest="digest-1", state=ApprovalState.PENDING, now_ms=now
            )

        assert find(T0 + 50) == newer
        assert find(older.expires_at) == newer
        assert find(newer.expires_at) is None, (
            "find must ignore a request from its expiry on, even though nobody swept it"
        )

    def test_list_shows_pending_requests_first_then_the_newest(self, storage: Storage) -> None:
        a, b, c, d = added(
            storage,
            request(at=T0, stored_state=ApprovalState.CONSUMED),
            request(at=T0 + 10),
            request(at=T0 + 20, stored_state=ApprovalState.REJECTED),
            request(at=T0 + 5),
        )

        assert [x.id for x in storage.approvals.list()] == [b.id, d.id, c.id, a.id]
        assert [x.id for x in storage.approvals.list(limit=2)] == [b.id, d.id]
        assert [x.id for x in storage.approvals.list(state=ApprovalState.REJECTED)] == [c.id]

    def test_list_keeps_only_the_tenant_or_the_scope_asked_for(self, storage: Storage) -> None:
        acme, globex, initech = added(
            storage, request("acme"), request("globex"), request("initech")
        )

        def ids(**where: Any) -> set[str]:
            return {x.id for x in storage.approvals.list(**where)}

        assert ids(tenant="acme") == {acme.id}, (
            "tenant isolation: list in a tenant must return that tenant's requests only"
        )
        assert ids(tenants=frozenset({"globex", "initech"})) == {globex.id, initech.id}
        assert ids(tenant="acme", tenants=frozenset({"globex"})) == set()
        assert ids(tenants=frozenset()) == set(), (
            "tenant isolation: list in a scope of no tenant must return nothing"
        )
        assert ids() == {acme.id, globex.id, initech.id}

    # --- transitions -----------------------------------------------------------------------

    def test_a_decision_records_who_when_and_why(self, storage: Storage) -> None:
        (pending,) = added(storage, request())

        moved = storage.approvals.transition(
            pending.id,
            expect=ApprovalState.PENDING,
            to=ApprovalState.REJECTED,
            by="bob",
            at=T0 + 7,
            reason="not during the freeze",
        )

        assert moved, CONDITIONAL + "a transition from the state the request is in must succeed"
        stored = storage.approvals.get(pending.id)
        assert stored == replace(
            pending,
            stored_state=ApprovalState.REJECTED,
            decided_by="bob",
            decided_at=T0 + 7,
            reason="not during the freeze",
        ), "a decision must record who decided, when and why"

    def test_consuming_records_when_and_keeps_the_decision(self, storage: Storage) -> None:
        (approved,) = added(
            storage, request(stored_state=ApprovalState.APPROVED, decided_by="bob", decided_at=T0)
        )

        assert storage.approvals.transition(
            approved.id,
            expect=ApprovalState.APPROVED,
            to=ApprovalState.CONSUMED,
            by="carol",
            at=T0 + 9,
        )

        assert storage.approvals.get(approved.id) == replace(
            approved, stored_state=ApprovalState.CONSUMED, consumed_at=T0 + 9
        ), "consuming must record when, and keep who decided"

    @pytest.mark.parametrize(
        ("stored", "expect"),
        [
            (ApprovalState.APPROVED, ApprovalState.PENDING),
            (ApprovalState.REJECTED, ApprovalState.PENDING),
            (ApprovalState.CONSUMED, ApprovalState.APPROVED),
            (ApprovalState.PENDING, ApprovalState.APPROVED),
        ],
    )
    def test_a_transition_from_a_state_the_request_is_not_in_changes_nothing(
        self, storage: Storage, stored: ApprovalState, expect: ApprovalState
    ) -> None:
        (approval,) = added(storage, request(stored_state=stored))

        moved = storage.approvals.transition(
            approval.id, expect=expect, to=ApprovalState.CONSUMED, by="bob", at=T0 + 1
        )

        assert not moved, (
            CONDITIONAL + f"a transition expecting {expect.value} must return False for a "
            f"request that is {stored.value}"
        )
        assert storage.approvals.get(approval.id) == approval, (
            CONDITIONAL + "a transition refused for its expected state must change nothing"
        )

    def test_a_transition_of_an_unknown_request_changes_nothing(self, storage: Storage) -> None:
        assert not storage.approvals.transition(
            "no-such-request",
            expect=ApprovalState.PENDING,
            to=ApprovalState.APPROVED,
            by="b",
            at=T0,
        ), CONDITIONAL + "a transition of an unknown request must return False"

    def test_a_transition_joins_the_callers_transaction(self, storage: Storage) -> None:
        (pending,) = added(storage, request())

        def approve_then_fail() -> None:
            with storage.atomic():
                assert storage.approvals.transition(
                    pending.id,
                    expect=ApprovalState.PENDING,
                    to=ApprovalState.APPROVED,
                    by="b",
                    at=T0,
                )
                raise RuntimeError("the audit entry could not be written")

        with pytest.raises(RuntimeError, match="audit entry"):
            approve_then_fail()

        assert storage.approvals.get(pending.id) == pending, (
            "a transition must join the caller's transaction and roll back with it"
        )

    # --- transitions under concurrency -----------------------------------------------------

    def test_of_two_approvers_racing_on_a_request_exactly_one_wins(self, storage: Storage) -> None:
        pending = added(storage, *(request(digest=f"d{n}") for n in range(ROUNDS)))
        ids = [a.id for a in pending]

        winners = race(storage, ids, ApprovalState.PENDING, ApprovalState.APPROVED)

        for approval_id, winner in zip(ids, winners, strict=True):
            assert stored_state(storage, approval_id) is ApprovalState.APPROVED
            assert stored(storage, approval_id).decided_by == winner, (
                CONDITIONAL + "the stored decision must be the winning approver's"
            )

    def test_of_two_changes_consuming_one_approval_exactly_one_wins(self, storage: Storage) -> None:
        approved = added(
            storage,
            *(request(digest=f"d{n}", stored_state=ApprovalState.APPROVED) for n in range(ROUNDS)),
        )

        race(storage, [a.id for a in approved], ApprovalState.APPROVED, ApprovalState.CONSUMED)

        assert {stored_state(storage, a.id) for a in approved} == {ApprovalState.CONSUMED}, (
            CONDITIONAL + "every raced-for approval must end consumed"
        )

    # --- operator grants -------------------------------------------------------------------

    def test_a_grant_is_stored_once(self, storage: Storage) -> None:
        grant = Grant("olga", Role.OPERATOR, "acme")

        assert storage.operators.grant(grant, by="root", at=T0), "a new grant must return True"
        assert not storage.operators.grant(grant, by="someone-else", at=T0 + 1), (
            "a grant already held must return False and not be stored again"
        )

        assert storage.operators.grants("olga") == [grant]
        assert storage.operators.count() == 1

    def test_revoke_removes_only_that_grant_and_says_whether_there_was_one(
        self, storage: Storage
    ) -> None:
        kept, revoked = Grant("olga", Role.VIEWER, "acme"), Grant("olga", Role.OPERATOR, "acme")
        for grant in (kept, revoked):
            storage.operators.grant(grant, by="root", at=T0)

        assert storage.operators.revoke(revoked), "revoking a grant held must return True"
        assert not storage.operators.revoke(revoked), (
            "revoking a grant no longer held must return False"
        )

        assert storage.operators.grants("olga") == [kept], (
            "revoke must remove that grant only, keeping the operator's others"
        )

    def test_grants_are_listed_by_operator_tenant_and_role_and_counted_by_role(
        self, storage: Storage
    ) -> None:
        wanted = [
            Grant("anna", Role.ADMIN, "*"),
            Grant("olga", Role.OPERATOR, "acme"),
            Grant("olga", Role.VIEWER, "acme"),
            Grant("olga", Role.APPROVER, "globex"),
        ]
        for grant in reversed(wanted):
            storage.operators.grant(grant, by="root", at=T0)

        assert storage.operators.grants() == wanted
        assert storage.operators.grants("nobody") == []
        assert [storage.operators.count(role) for role in Role] == [1, 1, 1, 1]
        assert storage.operators.count() == 4

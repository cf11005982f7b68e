"""Which available fires a claim takes: the overlap decisions, without storage."""

from __future__ import annotations

from engine import OverlapPolicy, RunKind
from engine.domain.overlap import (
    SKIPPED_BUFFER,
    SKIPPED_DELETED,
    SKIPPED_OVERLAP,
    SKIPPED_PAUSED,
    SUPERSEDED,
    Candidate,
    plan_claim,
)


def fire(
    run_id: int,
    policy: OverlapPolicy | None = OverlapPolicy.SKIP,
    *,
    schedule: str = "s",
    kind: RunKind = RunKind.SCHEDULED,
    active: bool = True,
) -> Candidate:
    return Candidate(run_id, schedule, kind, policy, active)


def test_an_idle_schedule_has_its_oldest_fire_claimed() -> None:
    plan = plan_claim([fire(1)], running={}, limit=10)
    assert plan.claim == [1]
    assert plan.skip == {}


def test_skip_skips_a_fire_of_a_running_schedule() -> None:
    plan = plan_claim([fire(2)], running={"s": [1]}, limit=10)
    assert plan.claim == []
    assert plan.skip == {2: SKIPPED_OVERLAP}


def test_skip_claims_the_first_of_two_fires_due_together_and_skips_the_second() -> None:
    plan = plan_claim([fire(1), fire(2)], running={}, limit=10)
    assert plan.claim == [1]
    assert plan.skip == {2: SKIPPED_OVERLAP}


def test_buffer_one_leaves_one_fire_waiting_and_skips_the_rest() -> None:
    policy = OverlapPolicy.BUFFER_ONE
    plan = plan_claim([fire(2, policy), fire(3, policy), fire(4, policy)], {"s": [1]}, 10)
    assert plan.claim == []
    assert plan.waiting == [2]
    assert plan.skip == {3: SKIPPED_BUFFER, 4: SKIPPED_BUFFER}


def test_buffer_one_claims_the_waiting_fire_once_the_schedule_is_idle() -> None:
    policy = OverlapPolicy.BUFFER_ONE
    plan = plan_claim([fire(2, policy), fire(3, policy), fire(4, policy)], {}, 10)
    assert plan.claim == [2]
    assert plan.waiting == [3]
    assert plan.skip == {4: SKIPPED_BUFFER}


def test_buffer_all_leaves_every_fire_waiting_while_the_schedule_runs() -> None:
    policy = OverlapPolicy.BUFFER_ALL
    plan = plan_claim([fire(n, policy) for n in (2, 3, 4)], {"s": [1]}, 10)
    assert plan.claim == []
    assert plan.waiting == [2, 3, 4]
    assert plan.skip == {}


def test_buffer_all_claims_one_fire_at_a_time() -> None:
    policy = OverlapPolicy.BUFFER_ALL
    plan = plan_claim([fire(n, policy) for n in (2, 3, 4)], {}, 10)
    assert plan.claim == [2]
    assert plan.waiting == [3, 4]


def test_allow_claims_every_fire_whatever_runs() -> None:
    policy = OverlapPolicy.ALLOW
    plan = plan_claim([fire(n, policy) for n in (2, 3, 4)], {"s": [1]}, 10)
    assert plan.claim == [2, 3, 4]


def test_cancel_other_claims_the_newest_cancels_older_waiting_and_asks_the_running_to_stop() -> (
    None
):
    policy = OverlapPolicy.CANCEL_OTHER
    plan = plan_claim([fire(n, policy) for n in (2, 3, 4)], {"s": [1]}, 10)
    assert plan.claim == [4]
    assert plan.cancel == {2: SUPERSEDED, 3: SUPERSEDED}
    assert plan.cancel_running == {"s"}


def test_cancel_other_on_an_idle_schedule_asks_nobody_to_stop() -> None:
    plan = plan_claim([fire(1, OverlapPolicy.CANCEL_OTHER)], {}, 10)
    assert plan.claim == [1]
    assert plan.cancel_running == set()


def test_manual_and_backfill_fires_wait_instead_of_being_skipped() -> None:
    manual = fire(2, kind=RunKind.MANUAL)
    backfill = fire(3, kind=RunKind.BACKFILL)
    plan = plan_claim([manual, backfill], {"s": [1]}, 10)
    assert plan.skip == {}
    assert plan.waiting == [2, 3]


def test_a_manual_fire_of_a_cancel_other_schedule_stops_the_running_one() -> None:
    plan = plan_claim([fire(2, OverlapPolicy.CANCEL_OTHER, kind=RunKind.MANUAL)], {"s": [1]}, 10)
    assert plan.claim == [2]
    assert plan.cancel_running == {"s"}


def test_backfill_of_a_cancel_other_schedule_runs_one_slot_at_a_time() -> None:
    policy = OverlapPolicy.CANCEL_OTHER
    slots = [fire(n, policy, kind=RunKind.BACKFILL) for n in (2, 3, 4)]
    plan = plan_claim(slots, {}, 10)
    assert plan.claim == [2]
    assert plan.waiting == [3, 4]
    assert plan.cancel == {}


def test_a_paused_schedules_scheduled_fire_is_skipped_but_a_manual_one_runs() -> None:
    plan = plan_claim(
        [fire(1, active=False), fire(2, active=False, kind=RunKind.MANUAL, schedule="t")], {}, 10
    )
    assert plan.skip == {1: SKIPPED_PAUSED}
    assert plan.claim == [2]


def test_a_deleted_schedules_fires_are_skipped() -> None:
    plan = plan_claim([fire(1, None), fire(2, None, kind=RunKind.MANUAL)], {}, 10)
    assert plan.skip == {1: SKIPPED_DELETED, 2: SKIPPED_DELETED}


def test_schedules_are_decided_independently() -> None:
    plan = plan_claim([fire(1, schedule="a"), fire(2, schedule="b")], {"a": [1]}, 10)
    assert plan.claim == [2]
    assert plan.skip == {1: SKIPPED_OVERLAP}


def test_the_limit_leaves_the_rest_waiting_but_still_skips() -> None:
    fires = [fire(1, OverlapPolicy.ALLOW, schedule="a"), fire(2, OverlapPolicy.ALLOW, schedule="a")]
    plan = plan_claim([*fires, fire(3, active=False, schedule="b")], {}, 1)
    assert plan.claim == [1]
    assert plan.waiting == [2]
    assert plan.skip == {3: SKIPPED_PAUSED}


def test_cancel_other_supersedes_an_older_fire_taken_over_after_its_consumer_vanished() -> None:
    plan = plan_claim([fire(1, OverlapPolicy.CANCEL_OTHER)], {"s": [2]}, 10)
    assert plan.claim == []
    assert plan.cancel == {1: SUPERSEDED}
    assert plan.cancel_running == set()

"""Overlap: which available fires a claim takes, given the schedules already running.

Pure. A backend collects the candidates (open, available fires in the order they became
available) and the schedules that have a fire under a live claim, and applies the plan in the
claim's transaction, so two consumers can never both decide that a schedule is idle.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from engine.domain.run import RunKind
from engine.domain.schedule import OverlapPolicy

SKIPPED_OVERLAP = "skipped: the previous run was still running (overlap policy skip)"
SKIPPED_BUFFER = "skipped: another fire was already waiting (overlap policy buffer-one)"
SKIPPED_PAUSED = "skipped: the schedule was paused before this fire ran"
SKIPPED_DELETED = "skipped: the schedule was deleted before this fire ran"
SUPERSEDED = "cancelled: a newer fire of the schedule superseded it (overlap policy cancel-other)"


@dataclass(frozen=True, slots=True)
class Candidate:
    run_id: int
    schedule_id: str
    kind: RunKind
    policy: OverlapPolicy | None  # None: the schedule no longer exists
    active: bool  # the schedule's status is active


@dataclass(slots=True)
class ClaimPlan:
    claim: list[int] = field(default_factory=list)
    skip: dict[int, str] = field(default_factory=dict)  # run id -> why
    cancel: dict[int, str] = field(default_factory=dict)  # waiting fires superseded, unrun
    cancel_running: set[str] = field(default_factory=set)  # schedules whose running fires
    # are asked to stop
    waiting: list[int] = field(default_factory=list)  # left for a later claim


def plan_claim(
    candidates: Sequence[Candidate], running: Mapping[str, Collection[int]], limit: int
) -> ClaimPlan:
    """Decide, in candidate order, what to claim (at most `limit`), skip, cancel or leave.

    `running` maps each schedule with fires under a live claim to those fires' run ids.
    """
    plan = ClaimPlan()
    busy = set(running)
    buffered: set[str] = set()
    # cancel-other: only a schedule's newest fire (the highest run id: dispatched last) may
    # run; an older one, even one taken over from a vanished consumer, is superseded.
    newest: dict[str, int] = {sid: max(ids) for sid, ids in running.items() if ids}
    for c in candidates:
        if c.policy is OverlapPolicy.CANCEL_OTHER and c.kind is not RunKind.BACKFILL:
            newest[c.schedule_id] = max(c.run_id, newest.get(c.schedule_id, c.run_id))
    for c in candidates:
        sid = c.schedule_id
        if c.policy is None:
            plan.skip[c.run_id] = SKIPPED_DELETED
            continue
        if not c.active and c.kind is RunKind.SCHEDULED:
            plan.skip[c.run_id] = SKIPPED_PAUSED
            continue
        if len(plan.claim) >= limit:
            plan.waiting.append(c.run_id)
            continue
        policy = c.policy
        if policy is OverlapPolicy.ALLOW:
            take = True
        elif c.kind is RunKind.BACKFILL or (
            c.kind is RunKind.MANUAL and policy is not OverlapPolicy.CANCEL_OTHER
        ):
            # Asked for explicitly: never dropped for overlap, run when the schedule is idle.
            take = sid not in busy
        elif policy is OverlapPolicy.CANCEL_OTHER:
            if newest[sid] != c.run_id:
                plan.cancel[c.run_id] = SUPERSEDED
                continue
            if sid in running:
                plan.cancel_running.add(sid)
            take = True
        elif sid not in busy:
            take = True
        elif policy is OverlapPolicy.SKIP:
            plan.skip[c.run_id] = SKIPPED_OVERLAP
            continue
        elif policy is OverlapPolicy.BUFFER_ONE and sid in buffered:
            plan.skip[c.run_id] = SKIPPED_BUFFER
            continue
        else:  # buffer-one's first waiting fire, or buffer-all
            buffered.add(sid)
            take = False
        if take:
            plan.claim.append(c.run_id)
            busy.add(sid)
        else:
            plan.waiting.append(c.run_id)
    return plan

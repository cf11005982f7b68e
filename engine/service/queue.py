"""Dead letters: fires that will not run again by themselves, and what an operator does."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from engine.domain.access import Operation
from engine.domain.approvals import Approval, GatedOperation
from engine.domain.audit import AuditEvent
from engine.domain.errors import InvalidInput, NotFound
from engine.ports.fire_queue import Fire, FireQuery, FireState
from engine.service.core import ServiceCore

log = logging.getLogger("vortos.service")


def _ids(runs: Sequence[int]) -> str:
    return ", ".join(str(r) for r in sorted(runs))


DEAD_LETTER_PAGE_MAX = 10_000


class DeadLetters(ServiceCore):
    def dead_letters(
        self, *, tenant: str | None = None, limit: int = 100, actor: str | None = None
    ) -> list[Fire]:
        """Fires dead-lettered or failed for good, oldest run first."""
        if not 1 <= limit <= DEAD_LETTER_PAGE_MAX:
            raise InvalidInput(f"limit {limit} is out of range: use 1 to {DEAD_LETTER_PAGE_MAX}")
        scope = self.listing_scope(actor, tenant)
        return self._storage.fire_queue.read(
            FireQuery(
                tenant=tenant,
                tenants=scope.tenants,
                states=frozenset({FireState.DISCARDED}),
                limit=limit,
            )
        )

    def requeue(
        self, run_ids: Sequence[int] | None, *, actor: str, tenant: str | None = None
    ) -> int:
        """Make these dead letters (None: all of `tenant`'s, or all) available again now; their
        runs go back to `dispatched`, their counters stay."""
        self._authorize(actor, Operation.REQUEUE, tenant)
        self._check_dead(run_ids, tenant)
        approval, chosen = self._requeue_approval(run_ids, actor=actor, tenant=tenant)
        if chosen is not None and not chosen:
            return 0  # "all" of none: nothing to change, nothing to record
        with self._changing(actor, Operation.REQUEUE, tenant):
            if approval is not None:
                self.four_eyes.consume(actor, approval)
            count = self._storage.fire_queue.requeue(chosen, at=self._clock.now_ms(), tenant=tenant)
            self._record_queue("queue.requeued", actor, run_ids, tenant, count)
        log.info("%d dead letter(s) requeued by %s", count, actor)
        return count

    def purge(self, run_ids: Sequence[int] | None, *, actor: str, tenant: str | None = None) -> int:
        """Delete these dead letters (None: all of `tenant`'s, or all); runs stay."""
        self._authorize(actor, Operation.REQUEUE, tenant)
        self._check_dead(run_ids, tenant)
        with self._changing(actor, Operation.REQUEUE, tenant):
            count = self._storage.fire_queue.purge(run_ids, tenant=tenant)
            self._record_queue("queue.purged", actor, run_ids, tenant, count)
        log.info("%d dead letter(s) purged by %s", count, actor)
        return count

    def _requeue_approval(
        self, run_ids: Sequence[int] | None, *, actor: str, tenant: str | None
    ) -> tuple[Approval | None, Sequence[int] | None]:
        """Running a protected schedule's dead letter again is one more execution of what
        four-eyes protects: it needs an approval, for exactly these runs of one schedule.
        Returns the approval to consume and the runs to requeue: with access control, "all"
        becomes the dead letters checked here, so one that arrives meanwhile is not among
        them unchecked."""
        if self.access is None:
            return None, run_ids
        dead = self._storage.fire_queue.read(
            FireQuery(
                tenant=tenant,
                run_ids=None if run_ids is None else tuple(run_ids),
                states=frozenset({FireState.DISCARDED}),
                limit=DEAD_LETTER_PAGE_MAX + 1 if run_ids is None else len(run_ids),
            )
        )
        if len(dead) > DEAD_LETTER_PAGE_MAX:
            raise InvalidInput(
                f"there are more than {DEAD_LETTER_PAGE_MAX} dead letters: requeue them by id, "
                f"at most {DEAD_LETTER_PAGE_MAX} at a time (`vortos queue list` shows them)"
            )
        chosen = [fire.run_id for fire in dead] if run_ids is None else run_ids
        protected: dict[tuple[str, str], list[int]] = {}
        reasons: dict[tuple[str, str], str] = {}
        for fire in dead:
            schedule = self._storage.schedules.get(fire.schedule_id, fire.tenant)
            why = self.protection(schedule is not None and schedule.sensitive, fire.command)
            if why is not None:
                key = (fire.tenant, fire.schedule_name)
                protected.setdefault(key, []).append(fire.run_id)
                reasons[key] = why
        if not protected:
            return None, chosen
        named = ", ".join(f"{t}/{n} (runs {_ids(r)})" for (t, n), r in sorted(protected.items()))
        if run_ids is None or len(protected) > 1:
            raise InvalidInput(
                f"dead letters of sensitive schedules are among these: {named}; requeue them "
                "by id, one schedule at a time (`vortos queue requeue ID...`), as each needs a "
                "second operator's approval"
            )
        ((owner, name),) = protected
        approval = self.four_eyes.check(
            actor,
            GatedOperation.REQUEUE,
            owner,
            name,
            {"runs": sorted(run_ids)},
            why=reasons[owner, name],
        )
        return approval, chosen

    def _record_queue(
        self,
        event: str,
        actor: str,
        run_ids: Sequence[int] | None,
        tenant: str | None,
        count: int,
    ) -> None:
        if count == 0:
            return  # nothing changed: nothing to record
        self._append(
            actor,
            [
                AuditEvent(
                    event,
                    actor=actor,
                    tenant=tenant,
                    data={"runs": None if run_ids is None else list(run_ids), "count": count},
                )
            ],
        )

    def _check_dead(self, run_ids: Sequence[int] | None, tenant: str | None) -> None:
        """Every id named must be a dead letter: otherwise nothing is done at all."""
        if run_ids is None:
            return
        if not run_ids:
            raise InvalidInput("name at least one run id, or run_ids=None for every dead letter")
        found = {
            f.run_id: f
            for f in self._storage.fire_queue.read(
                FireQuery(tenant=tenant, run_ids=tuple(run_ids), limit=len(run_ids))
            )
        }
        now = self._clock.now_ms()
        for rid in run_ids:
            fire = found.get(rid)
            if fire is None:
                raise NotFound(
                    f"no fire for run {rid}{f' in tenant {tenant!r}' if tenant else ''}: "
                    "`vortos queue list` shows the dead letters"
                )
            if fire.state_at(now) is not FireState.DISCARDED:
                raise InvalidInput(
                    f"run {rid} is not a dead letter (its fire is {fire.state_at(now).value}): "
                    "only dead letters can be requeued or purged"
                )

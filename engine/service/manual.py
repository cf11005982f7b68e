"""Fires asked for by hand: trigger now, and backfill of a past range."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from engine.domain.access import Operation
from engine.domain.approvals import Approval, GatedOperation
from engine.domain.audit import FIRES_BACKFILLED, AuditEvent, batch_data
from engine.domain.errors import InvalidInput
from engine.domain.misfire import due_at
from engine.domain.run import Run, RunKind
from engine.domain.schedule import DEFAULT_TENANT, Schedule
from engine.domain.slots import manual_slot_key, slot_key
from engine.domain.timeutil import iso_utc
from engine.ports.fire_queue import NewFire
from engine.service.core import ServiceCore

log = logging.getLogger("vortos.service")

# A backfill of more slots than this needs an explicit yes; past the hard limit, none at all.
BACKFILL_CONFIRM_OVER = 10_000
BACKFILL_HARD_LIMIT = 1_000_000
_ENQUEUE_CHUNK = 10_000


@dataclass(frozen=True, slots=True)
class BackfillReport:
    schedule: str
    slots: int  # slots of the trigger in the range
    dispatched: int  # new runs
    already: int  # slots the ledger already held (dispatched before, or an earlier backfill)
    first_slot: int | None
    last_slot: int | None


class ManualFires(ServiceCore):
    def trigger(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
    ) -> Run:
        """Fire the schedule now, once, as a manual run. Its cursor does not move, so the next
        scheduled slot still fires; a paused schedule can be triggered too. With
        `expected_version`, a schedule changed since the caller read it is refused
        (StaleVersion)."""
        self._authorize(actor, Operation.TRIGGER, tenant)
        schedule = self._current(name, tenant, expected_version)
        self._check_payload(schedule)
        approval = (
            self.four_eyes.check(
                actor,
                GatedOperation.TRIGGER,
                tenant,
                name,
                {"schedule_id": schedule.id, "version": schedule.version},
                why=why,
            )
            if (why := self.protection(schedule.sensitive, schedule.command)) is not None
            else None
        )
        now = self._clock.now_ms()
        key = manual_slot_key(schedule.id, now, secrets.token_hex(4))
        with self._changing(actor, Operation.TRIGGER, tenant):
            if approval is not None:
                self.four_eyes.consume(actor, approval)
            self._storage.fire_queue.enqueue(
                [self._new_fire(schedule, key, now, now, RunKind.MANUAL, actor)], available_at=now
            )
            run = self._storage.runs.find_by_slot(tenant, key)
            assert run is not None  # written just now, under a fresh key
            self._record("fire.manual", actor, schedule, slot_key=key, run=run.id)
        log.info("schedule %s/%s triggered by %s (run %d)", tenant, name, actor, run.id)
        return run

    def backfill(
        self,
        name: str,
        *,
        start_ms: int,
        end_ms: int,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        confirmed: bool = False,
    ) -> BackfillReport:
        """Dispatch every slot of the trigger in [start, end) that was never dispatched, as
        backfill runs under the schedule's overlap policy. Slot keys are the trigger's own, so
        a slot fires once however often the range is backfilled."""
        self._authorize(actor, Operation.BACKFILL, tenant)
        _check_backfill_range(start_ms, end_ms)
        now = self._clock.now_ms()
        if end_ms > now:
            raise InvalidInput(
                f"the backfill end {iso_utc(end_ms)} is in the future: a backfill covers past "
                "slots (later ones fire on schedule); give an end at or before now"
            )
        schedule = self._find(name, tenant)
        self._check_payload(schedule)
        slots = _backfill_slots(schedule, name, start_ms, end_ms, confirmed=confirmed)
        fires = [
            self._new_fire(
                schedule,
                slot_key(schedule.id, at, schedule.timezone),
                at,
                due_at(schedule.id, at, schedule.timezone, schedule.jitter_ms),
                RunKind.BACKFILL,
                actor,
            )
            for at in slots
        ]
        approval = self._backfill_approval(schedule, name, tenant, actor, start_ms, end_ms)
        dispatched, already = self._enqueue_backfill(schedule, tenant, fires, actor, approval, now)
        log.info(
            "schedule %s/%s backfilled by %s from %s to %s: %d new run(s), %d already there",
            tenant,
            name,
            actor,
            iso_utc(start_ms),
            iso_utc(end_ms),
            dispatched,
            already,
        )
        return BackfillReport(
            name,
            len(slots),
            dispatched,
            already,
            slots[0] if slots else None,
            slots[-1] if slots else None,
        )

    def _backfill_approval(
        self, schedule: Schedule, name: str, tenant: str, actor: str, start_ms: int, end_ms: int
    ) -> Approval | None:
        """The approval a sensitive schedule's backfill consumes (None: it needs none); bound
        to the range, so an approved backfill of one range is no approval of another."""
        why = self.protection(schedule.sensitive, schedule.command)
        if why is None:
            return None
        return self.four_eyes.check(
            actor,
            GatedOperation.BACKFILL,
            tenant,
            name,
            {
                "schedule_id": schedule.id,
                "version": schedule.version,
                "from": start_ms,
                "to": end_ms,
            },
            why=why,
        )

    def _enqueue_backfill(
        self,
        schedule: Schedule,
        tenant: str,
        fires: list[NewFire],
        actor: str,
        approval: Approval | None,
        now: int,
    ) -> tuple[int, int]:
        """Enqueue the backfill's fires a chunk per transaction (a million slots are not one
        transaction); (new runs, slots the ledger already held)."""
        dispatched = already = 0
        for start in range(0, len(fires), _ENQUEUE_CHUNK):
            chunk = fires[start : start + _ENQUEUE_CHUNK]
            with self._changing(actor, Operation.BACKFILL, tenant):
                if approval is not None and start == 0:
                    self.four_eyes.consume(actor, approval)  # one approval, the whole range
                report = self._storage.fire_queue.enqueue(chunk, available_at=now)
                taken = set(report.already)
                new = [fire for fire in chunk if fire.slot_key not in taken]
                if new:
                    self._record_backfilled(schedule, actor, new, report.inserted)
            dispatched += len(report.inserted)
            already += len(report.already)
        return dispatched, already

    def _record_backfilled(
        self, schedule: Schedule, actor: str, new: list[NewFire], run_ids: Sequence[int]
    ) -> None:
        # One entry per chunk commits to all its runs, as dispatch does.
        fired = [
            (run_id, schedule.id, fire.slot_key, fire.slot_at, fire.due_at)
            for fire, run_id in zip(new, run_ids, strict=True)
        ]
        self._append(
            actor,
            [
                AuditEvent(
                    FIRES_BACKFILLED,
                    actor=actor,
                    tenant=schedule.tenant,
                    schedule_id=schedule.id,
                    data=batch_data(fired),
                )
            ],
        )

    def _check_payload(self, schedule: Schedule) -> None:
        # Checked when this process knows the command (the CLI may run without --app; the
        # consumer checks again before running).
        if schedule.command in self.commands:
            try:
                self.commands.validate(schedule.command, schedule.payload)
            except InvalidInput as exc:
                raise InvalidInput(
                    f"the stored payload of schedule {schedule.name!r} no longer fits its "
                    f"command (the code or the service's settings changed since): {exc}; "
                    "delete and re-add the schedule with a payload that fits"
                ) from None

    @staticmethod
    def _new_fire(
        schedule: Schedule, key: str, at: int, due: int, kind: RunKind, actor: str
    ) -> NewFire:
        return NewFire(
            tenant=schedule.tenant,
            schedule_id=schedule.id,
            schedule_name=schedule.name,
            slot_key=key,
            slot_at=at,
            due_at=due,
            kind=kind,
            command=schedule.command,
            payload=dict(schedule.payload),
            node_id=actor,
        )


def _slots_between(schedule: Schedule, start_ms: int, end_ms: int, limit: int) -> list[int] | None:
    """The trigger's slots in [start, end); None as soon as there are more than `limit`."""
    slots: list[int] = []
    cursor = start_ms - 1
    while True:
        slot = schedule.trigger.slot_after(cursor, schedule.timezone)
        if slot is None or slot.at_ms >= end_ms:
            return slots
        if len(slots) >= limit:
            return None
        slots.append(slot.at_ms)
        cursor = slot.at_ms


def _check_backfill_range(start_ms: int, end_ms: int) -> None:
    if end_ms <= start_ms:
        shape = "empty" if end_ms == start_ms else "reversed"
        raise InvalidInput(
            f"the backfill range is {shape}: the end ({iso_utc(end_ms)}) must be after the "
            f"start ({iso_utc(start_ms)})"
        )


def _backfill_slots(
    schedule: Schedule, name: str, start_ms: int, end_ms: int, *, confirmed: bool
) -> list[int]:
    """The slots to backfill; refused past BACKFILL_CONFIRM_OVER unless confirmed, and past
    BACKFILL_HARD_LIMIT in any case (counting stops there: a range of years of seconds is
    refused without being walked)."""
    limit = BACKFILL_HARD_LIMIT if confirmed else BACKFILL_CONFIRM_OVER
    slots = _slots_between(schedule, start_ms, end_ms, limit)
    if slots is None and not confirmed:
        raise InvalidInput(
            f"the range holds more than {BACKFILL_CONFIRM_OVER} slots of {name!r}: check "
            "the range, or confirm with --yes"
        )
    if slots is None:
        raise InvalidInput(
            f"the range holds more than {BACKFILL_HARD_LIMIT} slots of {name!r}: "
            "backfill it in smaller ranges"
        )
    return slots

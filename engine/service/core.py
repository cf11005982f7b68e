"""The core of ScheduleService: reading, creating, pausing, resuming and deleting schedules.

The CLI, the console, the control socket and Python callers all come through here, so
validation happens once, at the boundary, before anything is stored; with access control every
change is authorised, may wait for a second operator (four-eyes) and is audited in its own
transaction.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.commands import CommandRegistry
from engine.commands.decorators import SOURCE_KEY
from engine.domain.access import ANY_TENANT, EVERY_TENANT, Operation, TenantScope, views_nothing
from engine.domain.approvals import DEFAULT_APPROVAL_TTL_MS, Approval, GatedOperation
from engine.domain.audit import AuditEvent, run_ranges
from engine.domain.clock import Clock
from engine.domain.control_chars import refuse_control_characters
from engine.domain.errors import Conflict, DuplicateName, InvalidInput, NotFound, StaleVersion
from engine.domain.misfire import due_at
from engine.domain.patch import SchedulePatch, apply_patch
from engine.domain.preview import PREVIEW_MAX, PreviewSlot, preview_slots
from engine.domain.run import Run
from engine.domain.schedule import (
    DEFAULT_TENANT,
    NOTE_MAX,
    Schedule,
    ScheduleOrigin,
    ScheduleSpec,
    ScheduleStatus,
    StaticOverride,
    changed_fields,
    same_json,
    validate_jitter,
    validate_metadata,
    validate_name,
    validate_payload,
    validate_timeout,
)
from engine.domain.timeutil import iso_utc, zone
from engine.domain.triggers import CronTrigger, IntervalTrigger, OneShotTrigger, Trigger
from engine.domain.wallclock import local_offset_ms, wall_of
from engine.ports.runs import RunQuery
from engine.ports.schedules import ScheduleQuery
from engine.ports.storage import Storage
from engine.service.four_eyes import FourEyesGate

if TYPE_CHECKING:
    from engine.governance.policy import AccessControl

log = logging.getLogger("vortos.service")

# A patch made without an expected version is applied again to what another operator just
# committed, this many times at most (then StaleVersion: someone edits it in a loop).
PATCH_TRIES = 3


class ServiceCore:
    """State shared by the parts of ScheduleService."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        commands: CommandRegistry,
        access: AccessControl | None = None,
        *,
        approval_ttl_ms: int = DEFAULT_APPROVAL_TTL_MS,
    ) -> None:
        # None: the caller is trusted (Python code that owns the database file); the CLI,
        # the console and the control socket always pass access control.
        self.access = access
        self._storage = storage
        # Four-eyes guards operators' tools (with access control); trusted code is not gated.
        # A request it makes stays open `approval_ttl_ms`.
        self.four_eyes = FourEyesGate(storage, clock, self._append, approval_ttl_ms)
        self._clock = clock
        self.commands = commands

    # -- reads ------------------------------------------------------------------------------
    # With access control, `actor` is who reads: a read names a tenant it may view (else
    # PermissionDenied, before anything is looked up) or is narrowed to the tenants it may.

    def get(self, name: str, *, tenant: str = DEFAULT_TENANT, actor: str | None = None) -> Schedule:
        self._authorize_view(actor, tenant)
        return self._find(name, tenant)

    def schedules(
        self,
        *,
        tenant: str | None = None,
        status: ScheduleStatus | None = None,
        limit: int = 1000,
        offset: int = 0,
        actor: str | None = None,
    ) -> list[Schedule]:
        scope = self.listing_scope(actor, tenant)
        return self._storage.schedules.query(
            ScheduleQuery(
                tenant=tenant, tenants=scope.tenants, status=status, limit=limit, offset=offset
            )
        )

    def runs(self, query: RunQuery, *, actor: str | None = None) -> list[Run]:
        scope = self.listing_scope(actor, query.tenant)
        return self._storage.runs.query(replace(query, tenants=scope.tenants))

    def run(self, run_id: int, *, actor: str | None = None) -> Run:
        """One run by id; a run of a tenant the actor may not view is not found, as if absent."""
        run = self._storage.runs.get(run_id)
        if run is None or not self.scope(actor).allows(run.tenant):
            raise NotFound(f"no run {run_id}: `vortos runs list` shows the runs")
        return run

    def scope(self, actor: str | None, tenant: str | None = None) -> TenantScope:
        """The tenants `actor` may view (within `tenant`, when given: refused if not)."""
        if self.access is None:
            return EVERY_TENANT.narrow(tenant)
        if tenant is not None:
            self._authorize_view(actor, tenant)
        return self.access.scope(self._reader(actor)).narrow(tenant)

    def listing_scope(
        self,
        actor: str | None,
        tenant: str | None = None,
        *,
        so: str = "nothing can be shown to it",
    ) -> TenantScope:
        """`scope`, for a read that lists (schedules, runs, dead letters, approvals, audit
        entries): an account that may view no tenant at all is refused, told why and what to
        ask for, never shown an empty list. A viewer of a tenant that holds nothing yet gets
        its honest empty list."""
        scope = self.scope(actor, tenant)
        if scope.empty:
            raise views_nothing(self._reader(actor), so)
        return scope

    def preview(
        self,
        name: str,
        *,
        tenant: str = DEFAULT_TENANT,
        count: int = 10,
        after_ms: int | None = None,
        actor: str | None = None,
    ) -> list[PreviewSlot]:
        """The next `count` slots after `after_ms` (default: now), marking DST effects."""
        if not 1 <= count <= PREVIEW_MAX:
            raise InvalidInput(f"count {count} is out of range: use 1 to {PREVIEW_MAX}")
        schedule = self.get(name, tenant=tenant, actor=actor)
        return preview_slots(
            schedule, self._clock.now_ms() if after_ms is None else after_ms, count
        )

    # -- changes ----------------------------------------------------------------------------

    def create(self, spec: ScheduleSpec, *, actor: str) -> Schedule:
        """Validate and store a new schedule, active, its cursor at the first slot from now."""
        self._authorize(actor, Operation.CREATE, spec.tenant)
        now = self._clock.now_ms()
        spec = self._sensitive_by_command(spec)
        first = validate_spec(spec, self.commands, now)
        schedule = new_schedule(spec, first, now, ScheduleOrigin.DYNAMIC)
        why = self.protection(spec.sensitive, spec.command)
        approval = None
        if why is not None:
            # A name that is taken is refused as such, not turned into a request.
            if self._storage.schedules.find_by_name(spec.tenant, spec.name) is not None:
                raise self._name_taken(spec)
            approval = self.four_eyes.check(
                actor,
                GatedOperation.CREATE,
                spec.tenant,
                spec.name,
                {"definition": definition(schedule)},
                written={"definition": as_written(schedule)},
                why=why,
            )
            # Approved: the schedule is the one the approver saw (an open anchor as fixed
            # when it was asked for), whatever "now" is at this retry.
            spec = replace(spec, trigger=requested_trigger(spec.trigger, approval))
            schedule = new_schedule(
                spec, _first_slot(spec.trigger, spec.timezone, now), now, ScheduleOrigin.DYNAMIC
            )
        try:
            with self._changing(actor, Operation.CREATE, spec.tenant):
                if approval is not None:
                    self.four_eyes.consume(actor, approval)
                self._storage.schedules.insert(schedule)
                self._record("schedule.created", actor, schedule, definition=definition(schedule))
        except DuplicateName as exc:
            raise self._name_taken(spec, exc) from None
        log.info(
            "schedule %s/%s created by %s (%s, %s)",
            spec.tenant,
            spec.name,
            actor,
            spec.trigger.describe(),
            spec.timezone,
        )
        return schedule

    def update(
        self,
        spec: ScheduleSpec,
        *,
        actor: str,
        expected_version: int | None = None,
    ) -> Schedule:
        """Replace the definition of the schedule `spec` names (in its tenant) with `spec`;
        its status, history and id stay. A new trigger, zone or jitter moves the cursor to the
        first slot after now (the old trigger's missed slots do not fire); otherwise it stays.

        A change to a sensitive schedule, or one that makes a schedule sensitive or no longer
        sensitive, waits for a second operator. Static schedules change in code."""
        self._authorize(actor, Operation.UPDATE, spec.tenant)
        now = self._clock.now_ms()
        first = validate_spec(spec, self.commands, now)
        schedule = self._current(spec.name, spec.tenant, expected_version)
        spec = self._sensitive_by_command(spec, schedule)
        _refuse_static(schedule, "edited")
        changed = _redefine(schedule, spec, first, now)
        if same_json(changed.spec.to_json(), schedule.spec.to_json()):
            return schedule
        why = self.protection(schedule.sensitive or spec.sensitive, schedule.command, spec.command)
        approval = None
        if why is not None:
            approval, spec, changed = self._approved_update(actor, schedule, spec, changed, why)
        with self._changing(actor, Operation.UPDATE, spec.tenant):
            if approval is not None:
                self.four_eyes.consume(actor, approval)
            stored = self._store_update(actor, schedule, changed)
        log.info(
            "schedule %s/%s updated by %s (%s, %s)",
            spec.tenant,
            spec.name,
            actor,
            spec.trigger.describe(),
            spec.timezone,
        )
        return stored

    def _approved_update(
        self, actor: str, schedule: Schedule, spec: ScheduleSpec, changed: Schedule, why: str
    ) -> tuple[Approval, ScheduleSpec, Schedule]:
        """The approved request for this update (else ApprovalRequired), and the update as
        approved: an open anchor is the one the approver saw."""
        known = {"schedule_id": schedule.id, "version": schedule.version}
        before = definition(schedule)
        approval = self.four_eyes.check(
            actor,
            GatedOperation.UPDATE,
            spec.tenant,
            spec.name,
            {**known, "before": before, "definition": definition(changed)},
            written={**known, "before": before, "definition": as_written(changed)},
            why=why,
        )
        trigger = requested_trigger(spec.trigger, approval)
        if trigger != spec.trigger:
            spec = replace(spec, trigger=trigger)
            now = self._clock.now_ms()
            changed = _redefine(schedule, spec, _first_slot(trigger, spec.timezone, now), now)
        return approval, spec, changed

    def _store_update(self, actor: str, schedule: Schedule, changed: Schedule) -> Schedule:
        """Write the update and its audit entry (inside the change's transaction)."""
        # Slots written ahead (the daemon's lookahead) are not due yet: they are the new
        # definition's. Their fires are withdrawn, unrun, and dispatched again from it.
        withdrawn = self._storage.fire_queue.withdraw_ahead(schedule.id, self._clock.now_ms())
        if withdrawn and changed.next_slot_at == schedule.next_slot_at:
            again = min(slot for _, slot in withdrawn)
            changed = replace(
                changed,
                next_slot_at=again,
                next_fire_at=due_at(schedule.id, again, changed.timezone, changed.jitter_ms),
            )
        stored = self._storage.schedules.update(changed, schedule.version)
        before, after = definition(schedule), definition(stored)
        changes: dict[str, Any] = {
            "before": before,
            "definition": after,
            "changed": changed_fields(before, after),
        }
        if withdrawn:  # the ledger check excuses these runs: nothing ran
            changes["withdrawn"] = run_ranges(r for r, _ in withdrawn)
        self._record("schedule.updated", actor, stored, **changes)
        return stored

    def patch(
        self,
        name: str,
        changes: SchedulePatch,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
    ) -> Schedule:
        """Change only what `changes` gives; everything else stays as stored (see
        engine.domain.patch for the rules). As `update` otherwise: the same validation,
        four-eyes and audit entry; the schedule comes back unchanged, its version the same,
        when the patch changes nothing.

        Without `expected_version` the patch applies to the schedule as it is when it is
        made: a change another operator commits in between is kept, not overwritten."""
        if not isinstance(changes, SchedulePatch):
            raise InvalidInput(
                f"changes= must be a SchedulePatch (engine.domain.patch), not "
                f"{type(changes).__name__}"
            )
        self._authorize(actor, Operation.UPDATE, tenant)
        for _ in range(PATCH_TRIES - 1):
            current = self._current(name, tenant, expected_version)
            try:
                return self._patched(current, changes, actor)
            except StaleVersion:
                if expected_version is not None:
                    raise
        return self._patched(self._current(name, tenant, expected_version), changes, actor)

    def _patched(self, current: Schedule, changes: SchedulePatch, actor: str) -> Schedule:
        spec = apply_patch(current.spec, changes, self._clock.now_ms())
        return self.update(spec, actor=actor, expected_version=current.version)

    def pause(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        note: str | None = None,
        expected_version: int | None = None,
    ) -> Schedule:
        """Stop dispatching. Pausing a paused schedule again only replaces its note, if given.

        A static schedule's pause is an override: it outlives deploys (whatever the code
        declares) until an operator resumes the schedule or clears the override."""
        self._authorize(actor, Operation.PAUSE, tenant)
        if note is not None and len(note) > NOTE_MAX:
            raise InvalidInput(f"the note is {len(note)} characters: at most {NOTE_MAX}")
        if note is not None:
            refuse_control_characters(note, "note")
        schedule = self._current(name, tenant, expected_version)
        static = schedule.origin is ScheduleOrigin.STATIC
        if static:
            _refuse_undeclared(schedule, "paused")
        if (
            schedule.status is ScheduleStatus.PAUSED
            and (note is None or note == schedule.pause_note)
            and (not static or _overridden(schedule, ScheduleStatus.PAUSED))
        ):
            return schedule
        now = self._clock.now_ms()
        override = StaticOverride(ScheduleStatus.PAUSED, actor, now, note) if static else None
        with self._changing(actor, Operation.PAUSE, tenant):
            changed = self._storage.schedules.update(
                replace(
                    schedule,
                    status=ScheduleStatus.PAUSED,
                    pause_note=note,
                    updated_at=now,
                    override=override,
                ),
                schedule.version,
            )
            extra = {"override": "paused"} if static else {}
            self._record("schedule.paused", actor, changed, note=note, **extra)
        log.info("schedule %s/%s paused by %s%s", tenant, name, actor, f": {note}" if note else "")
        return changed

    def resume(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
        catch_up: bool = False,
    ) -> Schedule:
        """Dispatch again from the next slot after now: slots missed while paused do not fire,
        unless `catch_up`, which hands them to the schedule's misfire policy (within its
        maximum catch-up age).

        Resuming a static schedule drops an operator's pause; one the code declares paused
        is then force-resumed: an override that outlives deploys until cleared."""
        self._authorize(actor, Operation.RESUME, tenant)
        schedule = self._current(name, tenant, expected_version)
        static = schedule.origin is ScheduleOrigin.STATIC
        if static:
            _refuse_undeclared(schedule, "resumed")
        now = self._clock.now_ms()
        # A static schedule the code declares paused is force-resumed: an override.
        forced = static and schedule.declared_paused
        override = StaticOverride(ScheduleStatus.ACTIVE, actor, now) if forced else None
        if schedule.status is ScheduleStatus.ACTIVE and (
            not static or (schedule.override is None) == (override is None)
        ):
            return schedule
        next_slot = _resumed_cursor(schedule, catch_up, now)
        approval = (
            self.four_eyes.check(
                actor,
                GatedOperation.RESUME,
                tenant,
                name,
                {"schedule_id": schedule.id, "version": schedule.version, "catch_up": catch_up},
                why=why,
            )
            if (why := self.protection(schedule.sensitive, schedule.command)) is not None
            else None
        )
        with self._changing(actor, Operation.RESUME, tenant):
            if approval is not None:
                self.four_eyes.consume(actor, approval)
            resumed = replace(
                schedule,
                status=ScheduleStatus.ACTIVE,
                pause_note=None,
                updated_at=now,
                next_slot_at=next_slot,
                next_fire_at=None
                if next_slot is None
                else due_at(schedule.id, next_slot, schedule.timezone, schedule.jitter_ms),
                override=override,
            )
            changed = self._storage.schedules.update(resumed, schedule.version)
            extra = {"override": "active" if override else "cleared"} if static else {}
            self._record("schedule.resumed", actor, changed, catch_up=catch_up, **extra)
        log.info("schedule %s/%s resumed by %s%s", tenant, name, actor, " (catch-up)" * catch_up)
        return changed

    def delete(
        self,
        name: str,
        *,
        actor: str,
        tenant: str = DEFAULT_TENANT,
        expected_version: int | None = None,
    ) -> Schedule:
        """Remove the schedule; its runs stay in the ledger. Static schedules are refused."""
        self._authorize(actor, Operation.DELETE, tenant)
        schedule = self._current(name, tenant, expected_version)
        _refuse_static(schedule, "deleted")
        why = self.protection(schedule.sensitive, schedule.command)
        approval = (
            self.four_eyes.check(
                actor,
                GatedOperation.DELETE,
                tenant,
                name,
                {"schedule_id": schedule.id, "version": schedule.version},
                why=why,
            )
            if why is not None
            else None
        )
        with self._changing(actor, Operation.DELETE, tenant):
            if approval is not None:
                self.four_eyes.consume(actor, approval)
            self._storage.schedules.delete(schedule.id, tenant, schedule.version)
            self._record("schedule.deleted", actor, schedule)
        log.info("schedule %s/%s deleted by %s", tenant, name, actor)
        return schedule

    # -- helpers ----------------------------------------------------------------------------

    def _name_taken(self, spec: ScheduleSpec, found: DuplicateName | None = None) -> DuplicateName:
        existing = self._storage.schedules.find_by_name(spec.tenant, spec.name)
        if existing is not None and existing.origin is ScheduleOrigin.STATIC:
            return DuplicateName(
                f"{spec.name!r} is the name of a static schedule declared in code "
                f"({existing.metadata.get(SOURCE_KEY, 'in the app')}): choose another name"
            )
        return found or DuplicateName(
            f"a schedule named {spec.name!r} already exists in tenant {spec.tenant!r}: "
            "choose another name, or change the existing one"
        )

    def protection(self, flagged: bool, *commands: str) -> str | None:
        """Why a change needs a second operator's approval ('' for the schedule's own flag),
        or None when it does not. Four-eyes follows what is protected: the schedule's flag,
        or a command declared sensitive in code or by the owner's settings, whatever the
        schedule's flag says. Trusted code (no access control) is not gated."""
        if self.access is None:
            return None
        for command in commands:
            why = self.commands.sensitivity(command)
            if why is not None:
                return f" (its command {command!r} is declared sensitive {why})"
        return "" if flagged else None

    def _sensitive_by_command(
        self, spec: ScheduleSpec, current: Schedule | None = None
    ) -> ScheduleSpec:
        """A schedule running a sensitive command is stored sensitive: every process then
        sees it, even one that does not load the app declaring the command. Clearing the
        flag of such a schedule is refused."""
        why = self.commands.sensitivity(spec.command)
        if why is None or spec.sensitive:
            return spec
        if current is not None and current.sensitive:
            raise InvalidInput(
                f"schedule {spec.name!r} runs {spec.command!r}, which is declared sensitive "
                f"{why}: it cannot be made not sensitive (every change of it needs a second "
                "operator's approval)"
            )
        return replace(spec, sensitive=True)

    def _authorize(self, actor: str, operation: Operation, tenant: str | None) -> None:
        if not isinstance(actor, str) or not actor.strip():
            # Every change is audited as someone's: trusted code names itself too.
            raise InvalidInput("actor= must name who makes the change (e.g. actor='deploy')")
        _valid_tenant(tenant)
        if self.access is not None:
            self.access.authorize(actor, operation, tenant)

    def _authorize_view(self, actor: str | None, tenant: str | None) -> None:
        _valid_tenant(tenant)
        if self.access is not None:
            self.access.authorize(self._reader(actor), Operation.VIEW, tenant)

    def _reader(self, actor: str | None) -> str:
        if actor is None:
            # A programming error, not an operator's: reads through access control say who.
            raise TypeError("this service checks access: pass actor= to its reads")
        return actor

    def _find(self, name: str, tenant: str) -> Schedule:
        # A name no schedule can have is a mistake to say, not an absence to report.
        validate_name(tenant, what="tenant")
        validate_name(name, what="schedule name")
        schedule = self._storage.schedules.find_by_name(tenant, name)
        if schedule is None:
            raise NotFound(
                f"no schedule named {name!r} in tenant {tenant!r}: `vortos schedule list` "
                "shows what exists"
            )
        return schedule

    @contextmanager
    def _changing(self, actor: str, operation: Operation, tenant: str | None) -> Iterator[None]:
        """One transaction for a change, its audit entry and its authorisation (decided again
        on what the transaction sees: grants may have changed since the first look)."""
        with self._storage.atomic():
            self._authorize(actor, operation, tenant)
            yield

    def _append(self, actor: str, events: list[AuditEvent]) -> None:
        """Record a change (inside its transaction); the first change of a database without
        operators makes its actor the first admin, in the same transaction."""
        if self.access is not None:
            self.access.claim_first_admin(actor)
        self._storage.audit.append(events)

    def _record(
        self,
        event: str,
        actor: str,
        schedule: Schedule,
        *,
        slot_key: str | None = None,
        **data: Any,
    ) -> None:
        """The audit entry of a change, inside the change's transaction."""
        self._append(
            actor,
            [
                AuditEvent(
                    event,
                    actor=actor,
                    tenant=schedule.tenant,
                    schedule_id=schedule.id,
                    slot_key=slot_key,
                    data={"name": schedule.name, "version": schedule.version, **data},
                )
            ],
        )

    def _current(self, name: str, tenant: str, expected_version: int | None) -> Schedule:
        # Called after the change was authorised in `tenant`, which includes viewing it.
        if expected_version is not None and expected_version < 1:
            raise InvalidInput(
                f"expected version {expected_version} (expected_version=) is never a "
                "schedule's: versions count from 1"
            )
        schedule = self._find(name, tenant)
        if expected_version is not None and schedule.version != expected_version:
            raise StaleVersion(
                f"schedule {name!r} changed since it was read (version {expected_version}, now "
                f"{schedule.version}): read it again and retry"
            )
        return schedule


def validate_spec(spec: ScheduleSpec, commands: CommandRegistry, now_ms: int) -> int:
    """Check everything about a new schedule that needs no storage; return its first slot.

    Front ends call this before they touch the database, so a refused schedule creates nothing.
    """
    validate_name(spec.name)
    validate_name(spec.tenant, what="tenant")
    zone(spec.timezone)
    validate_payload(dict(spec.payload))
    commands.validate(spec.command, spec.payload)
    validate_metadata(spec.metadata)
    validate_jitter(spec.jitter_ms)
    validate_timeout(spec.timeout_ms)
    return _first_slot(spec.trigger, spec.timezone, now_ms)


def _first_slot(trigger: Trigger, tz: str, now: int) -> int:
    slot = trigger.slot_after(now - 1, tz)
    if slot is None:
        if isinstance(trigger, OneShotTrigger):
            raise InvalidInput(
                f"the instant {iso_utc(trigger.at_ms)} is in the past: give a future one"
            )
        if isinstance(trigger, CronTrigger):
            if trigger.spec.next_wall(wall_of(now + local_offset_ms(now, zone(tz)))) is not None:
                raise InvalidInput(
                    f"cron {trigger.expression!r} never fires in {tz} under the skipped-hour "
                    f"rule {trigger.missing.value!r}: every wall time it names falls in a DST "
                    "gap; choose 'shift' or 'transition' (dst_missing=), or another time"
                )
            raise InvalidInput(
                f"cron {trigger.expression!r} never matches a date (e.g. 31 February): "
                "check the day and month fields"
            )
        raise InvalidInput("the trigger has no future slot")
    return slot.at_ms


def with_definition(schedule: Schedule, spec: ScheduleSpec, now: int) -> Schedule:
    """`schedule` with `spec`'s definition (its id, name, status and cursor kept)."""
    return replace(
        schedule,
        trigger=spec.trigger,
        timezone=spec.timezone,
        command=spec.command,
        payload=dict(spec.payload),
        misfire=spec.misfire,
        overlap=spec.overlap,
        jitter_ms=spec.jitter_ms,
        sensitive=spec.sensitive,
        metadata=dict(spec.metadata),
        retry=spec.retry,
        timeout_ms=spec.timeout_ms,
        updated_at=now,
    )


def _redefine(schedule: Schedule, spec: ScheduleSpec, first_slot: int, now: int) -> Schedule:
    """`schedule` with `spec`'s definition; a new trigger, zone or jitter restarts the cursor
    at `first_slot` (the first slot after now)."""
    changed = with_definition(schedule, spec, now)
    timing = (spec.trigger, spec.timezone, spec.jitter_ms)
    if timing != (schedule.trigger, schedule.timezone, schedule.jitter_ms):
        changed = replace(
            changed,
            next_slot_at=first_slot,
            next_fire_at=due_at(schedule.id, first_slot, spec.timezone, spec.jitter_ms),
        )
    return changed


def _resumed_cursor(schedule: Schedule, catch_up: bool, now: int) -> int | None:
    """Where a resumed schedule's cursor goes: it stays for one already firing (and for a
    catch-up, which hands the missed slots to the misfire policy), else the first slot
    after now."""
    if schedule.status is ScheduleStatus.ACTIVE:
        return schedule.next_slot_at
    if catch_up and schedule.next_slot_at is not None:
        return schedule.next_slot_at
    first = schedule.trigger.slot_after(now - 1, schedule.timezone)
    return None if first is None else first.at_ms


def _valid_tenant(tenant: str | None) -> None:
    """A tenant no schedule can have is refused as a mistake before anyone is asked about
    it (else `--tenant BAD` read as a missing role or an absent schedule)."""
    if tenant is not None and tenant != ANY_TENANT:
        validate_name(tenant, what="tenant")


def _refuse_undeclared(schedule: Schedule, verb: str) -> None:
    if schedule.status is ScheduleStatus.DISABLED:
        raise Conflict(
            f"schedule {schedule.name!r} is disabled: it is no longer declared in the app's "
            f"code, so it cannot be {verb}; declare it again (it returns at the next "
            "`vortos run --app`) or delete it"
        )


def _overridden(schedule: Schedule, state: ScheduleStatus) -> bool:
    return schedule.override is not None and schedule.override.state is state


def _refuse_static(schedule: Schedule, verb: str) -> None:
    # A static schedule the code no longer declares (disabled) is the operator's to remove.
    if schedule.origin is ScheduleOrigin.STATIC and schedule.status is not ScheduleStatus.DISABLED:
        raise Conflict(
            f"schedule {schedule.name!r} is static: it is declared in code "
            f"({schedule.metadata.get(SOURCE_KEY, 'in the app')}) and cannot be {verb} at "
            "runtime; change it there (pause and resume work)"
        )


def as_written(schedule: Schedule) -> dict[str, Any]:
    """The definition as its operator wrote it: an interval given no start leaves its anchor
    open (it is "one period from whenever this is asked")."""
    written = definition(schedule)
    trigger = schedule.trigger
    if isinstance(trigger, IntervalTrigger) and not trigger.anchored:
        written["trigger"] = {**written["trigger"], "anchor_ms": None}
    return written


def requested_trigger(trigger: Trigger, approval: Approval) -> Trigger:
    """`trigger` with an open anchor fixed as in the approved request."""
    if not isinstance(trigger, IntervalTrigger) or trigger.anchored:
        return trigger
    asked = approval.change.get("definition", {}).get("trigger", {})
    anchor = asked.get("anchor_ms")
    if not isinstance(anchor, int) or asked.get("every_ms") != trigger.every_ms:
        return trigger
    return IntervalTrigger(trigger.every_ms, anchor)


def definition(schedule: Schedule) -> dict[str, Any]:
    """What an audit entry and a four-eyes request record of a schedule's definition: its
    spec's one JSON spelling (ScheduleSpec.to_json: every limit of every policy, so an approval
    covers all it allows and an edit of one limit alone is a change), without the name and
    tenant the entry carries itself, and its origin."""
    spelled = schedule.spec.to_json()
    del spelled["name"], spelled["tenant"]
    spelled["trigger"].pop("anchored", None)  # as_written says what was left open
    return {**spelled, "origin": schedule.origin.value}


def new_schedule(spec: ScheduleSpec, first_slot: int, now: int, origin: ScheduleOrigin) -> Schedule:
    """A new active schedule of `spec`, its cursor at `first_slot`."""
    schedule_id = uuid.uuid4().hex
    return Schedule(
        id=schedule_id,
        tenant=spec.tenant,
        name=spec.name,
        trigger=spec.trigger,
        timezone=spec.timezone,
        command=spec.command,
        payload=dict(spec.payload),
        misfire=spec.misfire,
        overlap=spec.overlap,
        jitter_ms=spec.jitter_ms,
        status=ScheduleStatus.ACTIVE,
        sensitive=spec.sensitive,
        metadata=dict(spec.metadata),
        version=1,
        next_slot_at=first_slot,
        next_fire_at=due_at(schedule_id, first_slot, spec.timezone, spec.jitter_ms),
        created_at=now,
        updated_at=now,
        origin=origin,
        retry=spec.retry,
        timeout_ms=spec.timeout_ms,
    )

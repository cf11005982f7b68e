"""Retention: per-tenant overrides and legal holds (admins; every change audited), and
pruning now (`vortos prune`) with the settings the daily sweeper uses."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.commands import CommandRegistry
from engine.domain.access import Operation
from engine.domain.approvals import DEFAULT_APPROVAL_TTL_MS
from engine.domain.audit import AuditEvent
from engine.domain.clock import Clock
from engine.domain.control_chars import refuse_control_characters
from engine.domain.errors import InvalidInput, NotFound
from engine.domain.schedule import NOTE_MAX, validate_name
from engine.ports.retention import RetentionOverride
from engine.ports.storage import Storage
from engine.retention import (
    SWEEP_COMMAND,
    SWEEP_SCHEDULE,
    SWEEP_TENANT,
    PruneReport,
    RetentionSettings,
    RetentionSweeper,
    attach_sweeper,
    validate_days,
)
from engine.retention.sweeper import Wait
from engine.service.core import ServiceCore

if TYPE_CHECKING:
    from engine.governance.policy import AccessControl

log = logging.getLogger("vortos.service")


@dataclass(frozen=True, slots=True)
class RetentionView:
    """The retention in force: the sweeper's settings (and where they come from) and the
    overrides of the tenants the reader may view."""

    settings: RetentionSettings
    source: str
    overrides: list[RetentionOverride]


class RetentionAdmin(ServiceCore):
    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        commands: CommandRegistry,
        access: AccessControl | None = None,
        *,
        approval_ttl_ms: int = DEFAULT_APPROVAL_TTL_MS,
    ) -> None:
        super().__init__(storage, clock, commands, access, approval_ttl_ms=approval_ttl_ms)
        # The built-in sweeper command of this registry prunes this engine's database.
        attach_sweeper(commands, storage, clock)

    def retention_settings(self) -> tuple[RetentionSettings, str]:
        """What the daily sweeper uses (its schedule's payload), and where that comes from;
        the defaults while the sweeper schedule has not been synced."""
        sweeper = self._storage.schedules.find_by_name(SWEEP_TENANT, SWEEP_SCHEDULE)
        if sweeper is not None and sweeper.command == SWEEP_COMMAND:
            try:
                return (
                    RetentionSettings.from_payload(sweeper.payload),
                    f"the sweeper schedule {SWEEP_TENANT}/{SWEEP_SCHEDULE}",
                )
            except InvalidInput as exc:
                log.warning("the sweeper schedule's settings are unusable (%s): defaults", exc)
        return RetentionSettings(), "the defaults"

    def retention(self, *, actor: str | None = None) -> RetentionView:
        scope = self.scope(actor)
        settings, source = self.retention_settings()
        overrides = [o for o in self._storage.retention.overrides() if scope.allows(o.tenant)]
        return RetentionView(settings, source, overrides)

    def set_retention(
        self, tenant: str, days: int, *, actor: str, reason: str | None = None
    ) -> RetentionOverride:
        """Keep `tenant`'s run history `days` days instead of the default; 0 is a legal hold
        (nothing of the tenant is pruned until it is removed). Setting what is already set
        changes nothing."""
        validate_name(tenant, what="tenant")
        validate_days(days)
        if reason is not None and len(reason) > NOTE_MAX:
            raise InvalidInput(f"the reason is {len(reason)} characters: at most {NOTE_MAX}")
        if reason is not None:
            refuse_control_characters(reason, "reason")
        self._authorize(actor, Operation.MANAGE_RETENTION, tenant)
        with self._changing(actor, Operation.MANAGE_RETENTION, tenant):
            before = self._storage.retention.override(tenant)
            if before is not None and (before.days, before.reason) == (days, reason):
                return before
            override = RetentionOverride(tenant, days, reason, actor, self._clock.now_ms())
            self._storage.retention.set_override(override)
            self._record_retention(
                "retention.override_set",
                actor,
                tenant,
                days=days,
                legal_hold=override.legal_hold,
                reason=reason,
                before=_described(before),
            )
        log.info(
            "retention of tenant %s set by %s: %s",
            tenant,
            actor,
            "legal hold" if override.legal_hold else f"{days} days",
        )
        return override

    def remove_retention(self, tenant: str, *, actor: str) -> RetentionOverride:
        """Drop `tenant`'s override (a legal hold included): the default applies again."""
        validate_name(tenant, what="tenant")
        self._authorize(actor, Operation.MANAGE_RETENTION, tenant)
        with self._changing(actor, Operation.MANAGE_RETENTION, tenant):
            before = self._storage.retention.override(tenant)
            if before is None:
                raise NotFound(
                    f"tenant {tenant!r} has no retention override: `vortos retention show` "
                    "lists them"
                )
            self._storage.retention.remove_override(tenant)
            self._record_retention(
                "retention.override_removed", actor, tenant, before=_described(before)
            )
        log.info("retention override of tenant %s removed by %s", tenant, actor)
        return before

    def prune(
        self,
        *,
        actor: str,
        dry_run: bool = False,
        settings: RetentionSettings | None = None,
        wait: Wait | None = None,
    ) -> PruneReport:
        """One sweep now, with the sweeper's settings unless given. A dry run changes nothing
        and reports what would go, for the tenants the actor may view; a real one needs the
        right to manage retention in every tenant, and is audited batch by batch."""
        chosen = settings or self.retention_settings()[0]
        sweeper = RetentionSweeper(self._storage, self._clock)
        if dry_run:
            scope = self.scope(actor)
            report = sweeper.sweep(chosen, actor=actor, trigger="manual", dry_run=True)
            return report.only(scope.tenants)
        self._authorize(actor, Operation.MANAGE_RETENTION, None)

        def record(events: list[AuditEvent]) -> None:
            # Inside each batch's transaction: grants are decided again on what it sees.
            self._authorize(actor, Operation.MANAGE_RETENTION, None)
            self._append(actor, events)

        return sweeper.sweep(chosen, actor=actor, trigger="manual", wait=wait, record=record)

    def _record_retention(self, event: str, actor: str, tenant: str, **data: object) -> None:
        self._append(actor, [AuditEvent(event, actor=actor, tenant=tenant, data=data)])


def _described(override: RetentionOverride | None) -> dict[str, object] | None:
    if override is None:
        return None
    return {
        "days": override.days,
        "reason": override.reason,
        "set_by": override.set_by,
        "set_at": override.set_at,
    }

"""The built-in sweeper: the `vortos.prune` command and the static schedule that runs it daily.

The command runs on a consumer's worker thread like any other, so a sweep never blocks the
daemon: it writes through that thread's own connection, in short batches (see
engine.retention.sweeper). It prunes the database of the engine whose service was built with
the command registry it is in (`attach_sweeper`, called by ScheduleService); its settings are
its payload, so the sweeper schedule shows them, and a change of them is a schedule change,
in the audit chain.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from engine.commands.context import FireContext, PermanentFailure
from engine.commands.decorators import SOURCE_KEY, StaticSchedule
from engine.commands.registry import Command, CommandRegistry, command_from
from engine.domain.clock import Clock
from engine.domain.schedule import MisfireKind, MisfirePolicy, OverlapPolicy, ScheduleSpec
from engine.domain.triggers import CronTrigger
from engine.ports.storage import Storage
from engine.retention.audit_upkeep import archive_after_sweep, attach_anchor
from engine.retention.report import PruneReport
from engine.retention.settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BUDGET_S,
    DEFAULT_DAYS,
    DEFAULT_DEAD_LETTER_DAYS,
    RetentionSettings,
)
from engine.retention.sweeper import RetentionSweeper

log = logging.getLogger("vortos.retention")

SWEEP_COMMAND = "vortos.prune"
SWEEP_SCHEDULE = "vortos.prune"
# Its own tenant: pausing the sweeper (which stops retention for every tenant) takes a grant
# in `system` or in every tenant, not merely one in the tenant an operator works in.
SWEEP_TENANT = "system"
SWEEP_CRON = "17 3 * * *"  # daily, 03:17 UTC: away from the top of the hour
SWEEP_ACTOR = "vortos.retention"  # who the audit chain says pruned
SWEEP_SOURCE = "engine.retention.command.retention_schedule"


class SweepCommand:
    """The command's callable, attached to one database by the engine opened with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: tuple[Storage, Clock] | None = None
        self._on_report: Callable[[PruneReport], None] | None = None

    def attach(
        self,
        storage: Storage,
        clock: Clock,
        on_report: Callable[[PruneReport], None] | None = None,
    ) -> None:
        with self._lock:
            self._target = (storage, clock)
            self._on_report = on_report

    def run(
        self,
        days: int = DEFAULT_DAYS,
        dead_letter_days: int = DEFAULT_DEAD_LETTER_DAYS,
        batch_size: int = DEFAULT_BATCH_SIZE,
        budget_s: int = DEFAULT_BUDGET_S,
        audit_archive_dir: str | None = None,
        audit_archive_days: int | None = None,
        *,
        fire: FireContext,
    ) -> dict[str, Any]:
        """Prune run history past its retention (per-tenant overrides and legal holds
        apply), then, with `audit_archive_dir`, archive and prune the old audit entries.
        Returns the prune report (with the archive's under `audit_archive`), kept as the
        run's output."""
        with self._lock:
            target, on_report = self._target, self._on_report
        if target is None:
            raise PermanentFailure(
                f"the {SWEEP_COMMAND} command is not attached to a database: run it in a "
                "consumer of an engine opened with this command registry (open_engine)"
            )
        storage, clock = target
        mine = storage.runs.get(fire.run_id, fire.tenant)
        if mine is None or mine.slot_key != fire.slot_key:
            # The registry was shared by engines on several files; never prune another one.
            raise PermanentFailure(
                f"the {SWEEP_COMMAND} command is attached to another database than this "
                "fire's: give each engine its own command registry (builtin_commands())"
            )
        settings = RetentionSettings(
            days, dead_letter_days, batch_size, budget_s, audit_archive_dir, audit_archive_days
        )
        report = RetentionSweeper(storage, clock).sweep(
            settings, actor=SWEEP_ACTOR, trigger="scheduled", wait=fire.wait_cancelled
        )
        if on_report is not None:
            try:
                on_report(report)
            except Exception:  # a listener's failure (metrics, say) must not fail the sweep
                log.exception("the prune report listener failed")
        output = report.to_json()
        if not report.truncated:
            archived = archive_after_sweep(storage, clock, settings)
            if archived is not None:
                output["audit_archive"] = archived
        return output


def _check(payload: dict[str, Any]) -> dict[str, Any]:
    RetentionSettings.from_payload(payload)  # ranges, beyond the parameters' types
    return payload


def sweep_command() -> Command:
    """A new, unattached `vortos.prune` command (builtin_commands registers one)."""
    return command_from(
        SWEEP_COMMAND,
        SweepCommand().run,
        "prunes run history past its retention (the built-in daily sweeper)",
        check=_check,
    )


def attach_sweeper(
    commands: CommandRegistry,
    storage: Storage,
    clock: Clock,
    on_report: Callable[[PruneReport], None] | None = None,
) -> None:
    """Point the registry's built-in sweep command at `storage` (a writable one), with
    `on_report` called with each sweep's report (for metrics: per tenant the runs and fires
    removed, the duration, whether it was truncated)."""
    attach_anchor(commands, storage, clock)
    if storage.readonly or SWEEP_COMMAND not in commands:
        return
    owner = getattr(commands.get(SWEEP_COMMAND).run, "__self__", None)
    if isinstance(owner, SweepCommand):
        owner.attach(storage, clock, on_report)


def retention_schedule(settings: RetentionSettings | None = None) -> StaticSchedule:
    """The built-in static schedule of the sweeper: `vortos.prune` in tenant `system`, daily at
    03:17 UTC, with `settings` (default: 30 days, dead letters 90, batches of 5,000, a 240 s
    budget) as its payload. Sync it at start with the app's static schedules, every time:
    a sync disables the static schedules it is not given."""
    chosen = settings or RetentionSettings()
    spec = ScheduleSpec(
        name=SWEEP_SCHEDULE,
        trigger=CronTrigger(SWEEP_CRON),
        command=SWEEP_COMMAND,
        payload=chosen.to_payload(),
        timezone="UTC",
        tenant=SWEEP_TENANT,
        # A sweep missed while nothing ran happens once when the scheduler is back.
        misfire=MisfirePolicy(kind=MisfireKind.LATEST),
        overlap=OverlapPolicy.SKIP,
        metadata={SOURCE_KEY: SWEEP_SOURCE},
    )
    return StaticSchedule(spec, SWEEP_SOURCE)

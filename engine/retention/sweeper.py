"""The retention sweep: prune terminal runs past their tenant's retention, in short batches.

The ledger is walked in id order (the order of dispatch, the primary key's order) in pages
read without the write lock; the runs of a page that may go are deleted, with their fires, in
one short write transaction, together with the audit entries that record it. Between two
such transactions the sweep pauses, so that a daemon's dispatch waiting for the write lock
takes it: dispatch stays on time during a big prune. The walk stops at the first run
dispatched after the newest cutoff (nothing later can be old enough), when its time budget
is spent (reported `truncated`: the next sweep goes on), or when asked to stop.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence

from engine.domain.audit import AuditEvent, run_ranges
from engine.domain.clock import Clock
from engine.domain.timeutil import iso_utc
from engine.ports.retention import RunAge
from engine.ports.storage import Storage
from engine.retention.plan import RetentionPlan
from engine.retention.report import PruneReport, TenantPrune
from engine.retention.settings import RetentionSettings

log = logging.getLogger("vortos.retention")

# Between two write transactions the sweep waits at least this long, and at least as long as
# the last one took. SQLite's busy handler sleeps up to 25 ms between tries while a writer has
# waited under ~0.2 s: a pause longer than that lets every waiting writer in first.
PAUSE_S = 0.03
# A batch's write transaction should take about this long at most: the daemon's dispatch waits
# for it. A slower one halves the next batch (down to MIN_BATCH); a quick one doubles it back
# (up to the configured batch size). On a loaded host a fixed 5,000-run batch can hold the
# write lock for over 100 ms.
TARGET_WRITE_S = 0.04
MIN_BATCH = 250
FIRST_BATCH = MIN_BATCH

# Sleeps up to the given seconds; True when the sweep should stop (wait(0): a mere look).
Wait = Callable[[float], bool]
# Records audit events inside a batch's transaction (and may refuse, raising).
Record = Callable[[list[AuditEvent]], None]


def _sleep(seconds: float) -> bool:
    if seconds > 0:
        time.sleep(seconds)
    return False


class RetentionSweeper:
    """Runs sweeps over one store. Thread-safe as the storage is: each thread writes through
    its own connection, so a sweep can run on a consumer's worker thread beside the daemon."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        pause_s: float = PAUSE_S,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._monotonic = monotonic
        self._pause_s = pause_s

    def sweep(
        self,
        settings: RetentionSettings,
        *,
        actor: str,
        trigger: str = "scheduled",
        dry_run: bool = False,
        wait: Wait | None = None,
        record: Record | None = None,
    ) -> PruneReport:
        """Prune (or, `dry_run`, only count) what `settings` and the tenants' overrides let go.

        Each batch's deletions and its `runs.pruned` entries (one per tenant, in the tenant's
        chain) are one transaction; `record` (default: append to the audit log) is called in
        it. `wait` sleeps between batches (default: time.sleep) and says when to stop. An
        override set during the sweep holds from the next batch on."""
        wait = wait or _sleep
        started = self._monotonic()
        now = self._clock.now_ms()
        report = PruneReport(uuid.uuid4().hex[:12], trigger, dry_run, now, settings)
        store = self._storage.retention
        after = 0
        # Start small: the first batch has no timing to go by, and a large one on a busy host
        # would be the one long stall of the sweep.
        size = min(settings.batch_size, FIRST_BATCH)
        while True:
            plan = RetentionPlan.at(now, settings, store.overrides())
            horizon = plan.horizon
            if horizon is None:
                break  # every tenant keeps everything
            if report.examined and self._monotonic() - started >= settings.budget_s:
                report.stop("budget")
                break
            if wait(0):
                report.stop("cancelled")
                break
            page = store.examine(after, size)
            report.examined += len(page)
            if not page:
                break
            after = page[-1].run_id
            chosen = plan.select(page)
            last = len(page) < size or any(r.dispatched_at >= horizon for r in page)
            if chosen and dry_run:
                report.count(chosen)
            elif chosen:
                began = self._monotonic()
                removed = self._prune(chosen, settings, now, report, actor, record)
                report.count(removed)
                report.batches += 1
                took = self._monotonic() - began
                size = _next_size(size, took, settings.batch_size)
                if not last and wait(max(self._pause_s, took)):
                    report.stop("cancelled")
                    break
            if last:
                break
        report.duration_s = self._monotonic() - started
        _log(report)
        return report

    def _prune(
        self,
        chosen: Sequence[RunAge],
        settings: RetentionSettings,
        now: int,
        report: PruneReport,
        actor: str,
        record: Record | None,
    ) -> list[RunAge]:
        store = self._storage.retention
        with self._storage.atomic():
            # Judged again inside the transaction: a legal hold placed, or a dead letter
            # requeued, since the page was read is respected.
            plan = RetentionPlan.at(now, settings, store.overrides())
            removed = store.delete([r.run_id for r in chosen], still=plan.prunes)
            if removed:
                events = _events(removed, plan, report, actor)
                (record or self._storage.audit.append)(events)
        return removed


def _next_size(size: int, took_s: float, largest: int) -> int:
    """The next batch's size, so that a write transaction takes about TARGET_WRITE_S."""
    if took_s > TARGET_WRITE_S:
        return max(min(MIN_BATCH, largest), size // 2)
    if took_s < TARGET_WRITE_S / 4:
        return min(largest, size * 2)
    return size


def _events(
    removed: list[RunAge], plan: RetentionPlan, report: PruneReport, actor: str
) -> list[AuditEvent]:
    by_tenant: dict[str, list[RunAge]] = {}
    for run in removed:
        by_tenant.setdefault(run.tenant, []).append(run)
    events = []
    for tenant, runs in sorted(by_tenant.items()):
        counts = TenantPrune()
        for run in runs:
            counts.add(run)
        rule = plan.rule(tenant)
        events.append(
            AuditEvent(
                "runs.pruned",
                actor=actor,
                tenant=tenant,
                data={
                    **counts.to_json(),
                    "first_run": runs[0].run_id,
                    "last_run": runs[-1].run_id,
                    # Exactly which: the audit verify excuses these runs, and no other, from
                    # the batches that recorded them.
                    "removed": run_ranges(r.run_id for r in runs),
                    "retention_days": rule.days,
                    "dead_letter_days": rule.dead_letter_days,
                    "overridden": rule.overridden,
                    "as_of": iso_utc(plan.now_ms),
                    "trigger": report.trigger,
                    "sweep": report.sweep_id,
                },
            )
        )
    return events


def _log(report: PruneReport) -> None:
    verb = "would prune" if report.dry_run else "pruned"
    log.info(
        "retention %s %s: %s %d run(s) (%d fire(s), %d dead letter(s)) of %d tenant(s) in %.1f s%s",
        report.trigger,
        report.sweep_id,
        verb,
        report.runs,
        report.fires,
        report.dead_letters,
        len(report.tenants),
        report.duration_s,
        f"; truncated ({report.stopped_by}), the next sweep goes on" if report.truncated else "",
    )

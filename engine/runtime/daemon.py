"""SchedulerDaemon: lead, scan, resolve, dispatch, sleep.

Only the lease holder dispatches, and the dispatch transaction re-checks the lease token, so a
deposed leader cannot write a fire. Standbys sleep until the holder's lease would expire (plus a
node-seeded jitter, so several standbys do not stampede) and try again.
"""

from __future__ import annotations

import logging
import secrets
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from engine.domain.audit import AuditEvent
from engine.domain.clock import Clock
from engine.domain.errors import LeaseError, StorageError, VortosError
from engine.domain.misfire import SlotPlan, plan_slots
from engine.domain.schedule import Schedule
from engine.domain.timeutil import iso_utc
from engine.ports.dispatch import DispatchReport
from engine.ports.lease import LEADER_LEASE
from engine.ports.storage import Storage

log = logging.getLogger("vortos.daemon")

DEFAULT_LEASE_TTL_MS = 15_000
MIN_LEASE_TTL_MS = 1_000
DEFAULT_BATCH = 2_000  # fires per dispatch transaction
# Due schedules of one tenant per dispatch transaction while other tenants have some due.
DEFAULT_TENANT_CAP = 200
MAX_IDLE_MS = 60_000
MAX_LOOKAHEAD_MS = 10_000
# No dispatch once this share of the TTL has passed without a successful renewal: the lease
# may be about to pass to someone else.
RENEWAL_GUARD = 0.9


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    node_id: str
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS
    batch: int = DEFAULT_BATCH
    lease_key: str = LEADER_LEASE
    # Dispatch slots up to this long before they are due. Their fires still become available
    # at the due instant, so nothing runs early; a burst of thousands of slots due at the same
    # instant is then written before that instant instead of after it. A pause or a delete
    # within the lookahead still stops the slot: consumers skip such fires at claim.
    lookahead_ms: int = 0
    # The shortest sleep after a dispatch transaction that found work.
    coalesce_ms: int = 10
    # While other tenants have schedules due, one tenant's backlog takes at most this many of
    # a transaction's due schedules (None or 0: no cap), so it cannot starve the others.
    tenant_cap: int | None = DEFAULT_TENANT_CAP


class SchedulerDaemon:
    """One node's scheduling loop. `step()` is one iteration, for tests on a manual clock."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        config: DaemonConfig,
        on_dispatch: Callable[[DispatchReport], None] | None = None,
    ) -> None:
        if config.lease_ttl_ms < MIN_LEASE_TTL_MS:
            raise ValueError("the lease TTL must be at least 1s")
        if not 0 <= config.lookahead_ms <= MAX_LOOKAHEAD_MS:
            raise ValueError("the lookahead must be between 0 and 10s")
        self._storage = storage
        self._clock = clock
        self.config = config
        self._token = secrets.token_hex(16)
        self._on_dispatch = on_dispatch
        self._stop = threading.Event()
        self.leading = False
        self._last_renewed = 0
        # Standbys wake at the holder's expiry plus this, fixed per node, so they spread out.
        spread = min(1000, config.lease_ttl_ms // 10)
        self._standby_jitter_ms = zlib.crc32(config.node_id.encode()) % (spread + 1)

    @property
    def token(self) -> str:
        return self._token

    def step(self) -> float:
        """Do what is due now; return how many seconds to wait before the next step."""
        now = self._clock.now_ms()
        ttl = self.config.lease_ttl_ms
        if not self.leading:
            return self._try_lead(now)
        if now - self._last_renewed >= ttl // 3 and not self._renew(now):
            return 0.0
        if now - self._last_renewed >= ttl * RENEWAL_GUARD:
            log.warning("lease renewal silent for %d ms: not dispatching", now - self._last_renewed)
            return 0.1
        horizon = now + self.config.lookahead_ms
        next_due = self._storage.dispatcher.next_due_at()
        if next_due is None or next_due > horizon:
            # Nothing due: woken by someone else's commit (consumers settle all the time).
            # A read decides that; a write transaction would only compete with them.
            return self._idle_wait(now, next_due, dispatched=False)
        try:
            report = self._storage.dispatcher.dispatch_due(
                lease_key=self.config.lease_key,
                token=self._token,
                node_id=self.config.node_id,
                now_ms=now,
                limit=self.config.batch,
                resolve=resolver_at(now + self.config.lookahead_ms),
                until_ms=now + self.config.lookahead_ms,
                tenant_cap=self.config.tenant_cap,
            )
        except LeaseError as exc:
            self._lose(f"dispatch refused: {exc}")
            return 0.0
        self._report(report, now)
        if report.truncated or report.scanned >= self.config.batch:
            return 0.0  # more is due: go again at once
        return self._idle_wait(
            now, self._storage.dispatcher.next_due_at(), dispatched=bool(report.dispatched)
        )

    def _idle_wait(self, now: int, next_due: int | None, *, dispatched: bool) -> float:
        """Seconds until the next due slot, the next renewal, or at most MAX_IDLE_MS."""
        wake = now + MAX_IDLE_MS
        if next_due is not None:
            wake = min(wake, next_due - self.config.lookahead_ms)
        wake = min(wake, self._last_renewed + self.config.lease_ttl_ms // 3)
        # Slots due a moment apart go out together: a few milliseconds of lateness instead of
        # a transaction (and its fixed cost) per slot when thousands are spread over a second.
        if dispatched:
            wake = max(wake, now + self.config.coalesce_ms)
        return max(0.0, (wake - self._clock.now_ms()) / 1000)

    def run(self) -> None:
        """Loop until `stop()`; release the lease on the way out."""
        try:
            with self._storage.serving():
                self._loop()
        finally:
            self.release()

    def _loop(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                delay = self.step()
                backoff = 0.5
            except StorageError as exc:
                log.error("storage error: %s (retrying in %.1fs)", exc, backoff)
                delay, backoff = backoff, min(backoff * 2, 30.0)
            if delay <= 0 or self._stop.is_set():
                continue
            # A change by another process may bring a slot forward (leader) or free the
            # lease (standby): wake for it rather than sleep the whole delay.
            self._storage.changes.wait(delay)

    def stop(self) -> None:
        self._stop.set()
        self._storage.changes.notify()

    def release(self) -> None:
        if not self.leading:
            return
        self.leading = False
        try:
            self._storage.leases.release(self.config.lease_key, self._token)
            log.info("%s released the lease", self.config.node_id)
            self._record("leader.released")
        except (LeaseError, StorageError) as exc:
            log.warning("could not release the lease: %s", exc)

    # -- internals --------------------------------------------------------------------------

    def _try_lead(self, now: int) -> float:
        ttl = self.config.lease_ttl_ms
        lease = self._storage.leases.acquire(
            self.config.lease_key, self._token, self.config.node_id, ttl
        )
        if lease is not None:
            self.leading = True
            self._last_renewed = lease.renewed_at
            log.info(
                "%s leads (lease %s, ttl %d ms)", self.config.node_id, self.config.lease_key, ttl
            )
            self._record("leader.acquired", acquired_at=lease.acquired_at, ttl_ms=ttl)
            return 0.0
        holder = self._storage.leases.current(self.config.lease_key)
        wait_ms = ttl // 2 if holder is None else min(ttl // 2, holder.expires_at - now)
        return max(0, wait_ms + self._standby_jitter_ms) / 1000

    def _renew(self, now: int) -> bool:
        try:
            lease = self._storage.leases.renew(
                self.config.lease_key, self._token, self.config.lease_ttl_ms
            )
        except LeaseError as exc:
            self._lose(f"renewal refused: {exc}")
            return False
        except StorageError as exc:
            # Keep trying until the guard stops dispatch; the lease may still be ours.
            log.warning("lease renewal failed: %s", exc)
            return True
        self._last_renewed = lease.renewed_at if lease.renewed_at else now
        return True

    def _lose(self, why: str) -> None:
        if self.leading:
            log.warning("%s lost the lease: %s", self.config.node_id, why)
            self._record("leader.lost", reason=why)
        self.leading = False
        self._token = secrets.token_hex(16)

    def _record(self, event: str, **data: object) -> None:
        """A lease change in the system's audit chain. Dispatch must not wait on it: a failed
        append is logged (and counted by the metrics issue), the lease change stands."""
        try:
            self._storage.audit.append(
                [
                    AuditEvent(
                        event,
                        actor=self.config.node_id,
                        data={"lease": self.config.lease_key, **data},
                    )
                ]
            )
        except VortosError as exc:
            log.warning("could not record %s in the audit chain: %s", event, exc)

    def _report(self, report: DispatchReport, now: int) -> None:
        if log.isEnabledFor(logging.INFO):
            for fire in report.dispatched:
                log.info(
                    "fired %s/%s slot %s late %d ms (run %d)",
                    fire.tenant,
                    fire.schedule_name,
                    iso_utc(fire.slot_at),
                    max(0, now - fire.due_at),
                    fire.run_id,
                )
        for sid, why in report.failed.items():
            log.error("schedule %s held back: its definition cannot be resolved (%s)", sid, why)
        for label, plan in report.plans.items():
            if plan.skipped_missed or plan.dropped_aged:
                log.warning(
                    "schedule %s: %d missed slot(s) not fired by its misfire policy, "
                    "%d older than its maximum catch-up age dropped",
                    label,
                    plan.skipped_missed,
                    plan.dropped_aged,
                )
        for tenant, left in report.capped.items():
            # Debug: during a long backlog this repeats every transaction.
            log.debug("tenant %s capped: %d due schedule(s) wait for the next batch", tenant, left)
        if self._on_dispatch is not None:
            self._on_dispatch(report)


def resolver_at(now_ms: int) -> Callable[[Schedule, int], SlotPlan]:
    """How the daemon decides, at `now_ms`, which slots of a due schedule fire."""

    def resolve(schedule: Schedule, cursor: int) -> SlotPlan:
        return plan_slots(
            schedule_id=schedule.id,
            trigger=schedule.trigger,
            tz=schedule.timezone,
            cursor_ms=cursor,
            now_ms=now_ms,
            policy=schedule.misfire,
            jitter_ms=schedule.jitter_ms,
        )

    return resolve

"""SchedulerDaemon: lead, scan, resolve, dispatch, sleep.

Only the lease holder dispatches, and the dispatch transaction re-checks the lease token, so a
deposed leader cannot write a fire. Standbys sleep until the holder's lease would expire (plus a
node-seeded jitter, so several standbys do not stampede) and try again.

Dispatch transactions that keep failing (the database locked past its busy timeout, say) open a
circuit breaker (engine.runtime.breaker): no dispatch is tried until it half-opens, and since a
failed transaction writes nothing, no cursor moves and no slot is lost meanwhile. What the daemon
does is reported to an observer (engine.observability), a no-op unless one is given.
"""

from __future__ import annotations

import gc
import logging
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from engine.domain.audit import AuditEvent
from engine.domain.clock import Clock
from engine.domain.errors import LeaseError, StorageError, VortosError
from engine.domain.misfire import SlotPlan, plan_slots
from engine.domain.schedule import MisfirePolicy, Schedule, ScheduleStatus
from engine.domain.timeutil import format_duration, iso_utc
from engine.observability.observer import (
    NULL_OBSERVER,
    DispatchFacts,
    LeaderChange,
    Observer,
    recording,
)
from engine.ports.dispatch import DispatchReport
from engine.ports.lease import LEADER_LEASE, LeasePort
from engine.ports.schedules import ScheduleQuery
from engine.ports.storage import Storage
from engine.runtime.breaker import (
    DEFAULT_BREAKER_FAILURES,
    DEFAULT_BREAKER_RECOVERY_MS,
    BreakerState,
    CircuitBreaker,
)
from engine.runtime.storage_retry import StorageRetry

# A dispatch transaction of more fires than this logs one INFO line for them (DEBUG: each).
LOG_EACH_UP_TO = 8

log = logging.getLogger("vortos.daemon")

DEFAULT_LEASE_TTL_MS = 15_000
MIN_LEASE_TTL_MS = 1_000
DEFAULT_BATCH = 2_000  # fires per dispatch transaction
# Due schedules of one tenant per dispatch transaction while other tenants have some due.
DEFAULT_TENANT_CAP = 200
MAX_IDLE_MS = 60_000
MAX_LOOKAHEAD_MS = 10_000
# Slots are dispatched this long before they are due, by default: a burst of thousands of slots
# due at one instant is written before that instant, not after it (see DaemonConfig). Their
# fires become claimable only at the due instant, and a claim skips the fire of a schedule
# paused or deleted meanwhile. Long enough to write 10,000 fires with room to spare.
DEFAULT_LOOKAHEAD_MS = 1_000
# No dispatch once this share of the TTL has passed without a successful renewal: the lease
# may be about to pass to someone else.
RENEWAL_GUARD = 0.9
# After a failed dispatch transaction (the breaker still closed), wait this long before the
# next, doubling per consecutive failure up to MAX_RETRY_MS.
FIRST_RETRY_MS = 500
MAX_RETRY_MS = 30_000
# When the breaker opens, the due schedules it holds back are counted, this many at most (a
# read, ordered by due instant: once per opening, not per step).
HELD_BACK_MAX = 1_000
# While a renewal keeps failing, try it again at most this often.
RENEW_RETRY_MS = 1_000
DISPATCH_BREAKER = "dispatch"
MAX_SHARDS = 64
# How soon to look again at a due schedule the dispatch passed over because another
# transaction held its row.
HELD_ROW_RETRY_MS = 50


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    node_id: str
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS
    batch: int = DEFAULT_BATCH
    lease_key: str = LEADER_LEASE
    # Dispatch slots up to this long before they are due. Their fires still become available
    # at the due instant, so nothing runs early; a burst of thousands of slots due at the same
    # instant is then written before that instant instead of after it. A pause or a delete
    # within the lookahead still stops the slot: consumers skip such fires at claim. Whether a
    # slot was missed is judged at the real instant, never at the lookahead's horizon.
    lookahead_ms: int = DEFAULT_LOOKAHEAD_MS
    # The shortest sleep after a dispatch transaction that found work. With a lookahead the
    # daemon waits longer, up to a quarter of it (see SchedulerDaemon.coalesce_ms).
    coalesce_ms: int = 10
    # While other tenants have schedules due, one tenant's backlog takes at most this many of
    # a transaction's due schedules (None or 0: no cap), so it cannot starve the others.
    tenant_cap: int | None = DEFAULT_TENANT_CAP
    # The dispatch circuit breaker opens after this many consecutive failed dispatch
    # transactions (storage errors; a refused lease is not one), and half-opens after
    # `breaker_recovery_ms`.
    breaker_failures: int = DEFAULT_BREAKER_FAILURES
    breaker_recovery_ms: int = DEFAULT_BREAKER_RECOVERY_MS
    # (index, count): this daemon leads lease shard `index` of `count` and dispatches only the
    # schedules whose stable hash falls in it (PostgreSQL); None: every schedule, one lease.
    shard: tuple[int, int] | None = None


class SchedulerDaemon:
    """One node's scheduling loop. `step()` is one iteration, for tests on a manual clock."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        config: DaemonConfig,
        on_dispatch: Callable[[DispatchReport], None] | None = None,
        observer: Observer | None = None,
        leases: LeasePort | None = None,
        wants_lease: Callable[[], bool] | None = None,
    ) -> None:
        """`leases`: the lease driver to lead with (default: the store's own row); whatever it
        is, it keeps the store's lease row current, which dispatch fences on. `wants_lease`:
        asked before every step; while it says no the daemon does not try to lead, and a
        leader gives its lease up (shards shared out among nodes: engine.runtime.nodes)."""
        if config.lease_ttl_ms < MIN_LEASE_TTL_MS:
            raise ValueError("the lease TTL must be at least 1s")
        if not 0 <= config.lookahead_ms <= MAX_LOOKAHEAD_MS:
            raise ValueError("the lookahead must be between 0 and 10s")
        if config.shard is not None and not 0 <= config.shard[0] < config.shard[1]:
            raise ValueError(f"shard {config.shard[0]} of {config.shard[1]} does not exist")
        self._storage = storage
        self._leases = leases or storage.leases
        self._clock = clock
        self.config = config
        self._token = secrets.token_hex(16)
        self._on_dispatch = on_dispatch
        self._observer = observer or NULL_OBSERVER
        self._wants_lease = wants_lease
        self._stop = threading.Event()
        self.leading = False
        self._last_renewed = 0
        # Standbys wake at the holder's expiry plus this, fixed per node, so they spread out.
        spread = min(1000, config.lease_ttl_ms // 10)
        self._standby_jitter_ms = zlib.crc32(config.node_id.encode()) % (spread + 1)
        self.breaker = CircuitBreaker(
            clock,
            failures=config.breaker_failures,
            recovery_ms=config.breaker_recovery_ms,
            on_change=self._breaker_changed,
        )
        self._count_held_back = False  # set when the breaker opens
        # Until then, slots not yet due are left to gather for the next transaction.
        self._gather_until = 0
        self._observer.daemon_started(config.lease_key, config.node_id)

    @property
    def coalesce_ms(self) -> int:
        """How long slots gather after a dispatch transaction that found work before the next
        one. Slots due a moment apart then go out together: a transaction (and its fixed
        cost) per few milliseconds of slots instead of one per slot. Without a lookahead
        every millisecond of gathering is a millisecond of lateness, so it is short; with
        one, slots are written that long before they are due, and a quarter of it spent
        gathering costs no lateness while cutting the transactions of slots spread over
        the second from about a hundred a second to four."""
        return max(self.config.coalesce_ms, self.config.lookahead_ms // 4)

    @property
    def token(self) -> str:
        return self._token

    @property
    def breaker_state(self) -> BreakerState:
        """The dispatch circuit breaker's state (closed, open, half_open); `breaker` has the
        details (consecutive failures, when an open breaker will probe again)."""
        return self.breaker.state

    def step(self) -> float:
        """Do what is due now; return how many seconds to wait before the next step."""
        started = time.perf_counter()
        try:
            return self._step()
        finally:
            self._observer.tick(time.perf_counter() - started)

    def _step(self) -> float:
        now = self._clock.now_ms()
        ttl = self.config.lease_ttl_ms
        if self._wants_lease is not None and not self._wants_lease():
            if self.leading:
                self.release()  # another node's share now: hand it over at once
            return min(ttl // 3, 1_000) / 1000
        if not self.leading:
            return self._try_lead(now)
        if now - self._last_renewed >= ttl // 3 and not self._renew(now):
            return 0.0
        if now - self._last_renewed >= ttl * RENEWAL_GUARD:
            log.warning("lease renewal silent for %d ms: not dispatching", now - self._last_renewed)
            return 0.1
        horizon = now + self.config.lookahead_ms
        next_due = self._storage.dispatcher.next_due_at(self.config.shard)
        if next_due is None or next_due > horizon:
            # Nothing due: woken by someone else's commit (consumers settle all the time).
            # A read decides that; a write transaction would only compete with them.
            return self._idle_wait(now, next_due, dispatched=False)
        if now < self._gather_until and next_due > now + self.config.coalesce_ms:
            # Woken early (by a commit) while slots written ahead gather: none of them is
            # about to be late, so they wait for the next transaction with the rest.
            wake = min(self._gather_until, next_due - self.config.coalesce_ms)
            return self._wait_until(min(wake, self._last_renewed + ttl // 3))
        if not self.breaker.allow():
            self._hold_back(horizon)
            return self._open_wait(now)
        return self._dispatch(now, horizon)

    def _dispatch(self, now: int, horizon: int) -> float:
        """One dispatch transaction of the slots due up to `horizon` (the lease held, the
        breaker closed); how long to wait after it. One call per transaction, none per fire:
        the per-fire work stays in the store's dispatch and the observer."""
        observer = self._observer
        facts = DispatchFacts(now, time.time_ns(), 0.0, self.config.node_id)
        resolve = resolver_at(now, horizon)
        if observer.active:
            resolve = recording(resolve, facts)
        started = time.perf_counter()
        try:
            with _no_cyclic_gc():
                report = self._storage.dispatcher.dispatch_due(
                    lease_key=self.config.lease_key,
                    token=self._token,
                    node_id=self.config.node_id,
                    now_ms=now,
                    limit=self.config.batch,
                    resolve=resolve,
                    until_ms=horizon,
                    tenant_cap=self.config.tenant_cap,
                    shard=self.config.shard,
                )
        except LeaseError as exc:
            # The store answered: it is not what the breaker guards against.
            self.breaker.succeeded()
            self._failed(exc, facts, started)
            self._lose(f"dispatch refused: {exc}")
            return 0.0
        except StorageError as exc:
            self.breaker.failed()
            self._failed(exc, facts, started)
            return self._retry_wait(now, exc)
        facts.seconds = time.perf_counter() - started
        self.breaker.succeeded()
        # Lateness as of the commit, not of the step's start: a transaction that waited (for
        # a lock, a slow server) says how late its fires really went out.
        self._report(report, max(now, self._clock.now_ms()))
        if observer.active:
            observer.dispatched(report, facts)
        if report.truncated or report.scanned >= self.config.batch:
            return 0.0  # more is due: go again at once
        return self._idle_wait(
            now,
            self._storage.dispatcher.next_due_at(self.config.shard),
            dispatched=bool(report.dispatched),
        )

    def _failed(self, error: Exception, facts: DispatchFacts, started: float) -> None:
        facts.seconds = time.perf_counter() - started
        facts.planned.clear()  # rolled back: none of it happened
        self._observer.dispatch_failed(error, facts)

    def _retry_wait(self, now: int, error: StorageError) -> float:
        """After a failed dispatch transaction: back off, or wait out an open breaker."""
        failures = self.breaker.consecutive_failures
        if self.breaker.state is BreakerState.OPEN:
            log.error(
                "dispatch failed %d times in a row (last: %s): breaker open, no dispatch for %s",
                failures,
                error,
                format_duration(self.config.breaker_recovery_ms),
            )
            return self._open_wait(now)
        wait_ms = min(MAX_RETRY_MS, FIRST_RETRY_MS * 2 ** min(failures - 1, 16))
        log.error(
            "dispatch failed (%d of %d before the breaker opens): %s (retrying in %s)",
            failures,
            self.breaker.failure_threshold,
            error,
            format_duration(wait_ms),
        )
        return self._wait_until(min(now + wait_ms, self._renewal_due(now)))

    def _open_wait(self, now: int) -> float:
        """While the breaker is open: sleep until it half-opens, renewing the lease meanwhile
        (the store may be back for a renewal before the window ends)."""
        retry_at = self.breaker.retry_at_ms
        renew = self._renewal_due(now)
        return self._wait_until(renew if retry_at is None else min(retry_at, renew))

    def _renewal_due(self, now: int) -> int:
        """When to renew next; not sooner than RENEW_RETRY_MS while renewals fail."""
        ttl = self.config.lease_ttl_ms
        return max(self._last_renewed + ttl // 3, now + min(RENEW_RETRY_MS, ttl // 10))

    def _wait_until(self, instant: int) -> float:
        return max(0.0, (instant - self._clock.now_ms()) / 1000)

    def _hold_back(self, horizon: int) -> None:
        """Count the due schedules the breaker holds back, once each time it opens (a read:
        it works while another process holds the write lock)."""
        if not self._count_held_back or not self._observer.active:
            return
        self._count_held_back = False
        try:
            soonest = self._storage.schedules.query(
                ScheduleQuery(
                    status=ScheduleStatus.ACTIVE, limit=min(self.config.batch, HELD_BACK_MAX)
                )
            )
        except StorageError as exc:
            log.debug("could not read the due schedules held back: %s", exc)
            return
        due = [s for s in soonest if s.next_fire_at is not None and s.next_fire_at <= horizon]
        if due:
            self._observer.held_back(due)

    def _breaker_changed(self, state: BreakerState) -> None:
        if state is BreakerState.CLOSED:
            log.warning("dispatch succeeded again: breaker closed")
        elif state is BreakerState.OPEN:
            self._count_held_back = True
        elif state is BreakerState.HALF_OPEN:
            log.warning("breaker half-open: trying one dispatch")
        self._observer.breaker_changed(DISPATCH_BREAKER, state.value)

    def _idle_wait(self, now: int, next_due: int | None, *, dispatched: bool) -> float:
        """Seconds until the next due slot, the next renewal, or at most MAX_IDLE_MS."""
        wake = now + MAX_IDLE_MS
        if next_due is not None:
            wake = min(wake, next_due - self.config.lookahead_ms)
        wake = min(wake, self._last_renewed + self.config.lease_ttl_ms // 3)
        # Slots due a moment apart go out together (see coalesce_ms); with a lookahead, never
        # so long that one would be late for it.
        if dispatched:
            self._gather_until = now + self.coalesce_ms
            wake = max(wake, self._gather_until)
            if next_due is not None and self.config.lookahead_ms > self.config.coalesce_ms:
                wake = min(wake, max(now, next_due - self.config.coalesce_ms))
        elif next_due is not None and next_due <= now:
            # Nothing was dispatched yet something is due: its row is locked by an operator's
            # transaction (PostgreSQL skips locked rows). Look again soon, not in a hot loop.
            wake = max(wake, now + HELD_ROW_RETRY_MS)
        return max(0.0, (wake - self._clock.now_ms()) / 1000)

    def run(self) -> None:
        """Loop until `stop()`; release the lease on the way out."""
        try:
            with self._storage.serving():
                self._loop()
        finally:
            self.release()

    def _loop(self) -> None:
        retry = StorageRetry(log)
        while not self._stop.is_set():
            try:
                delay = self.step()
                retry.succeeded()
                if delay > 0 and not self._stop.is_set():
                    # A change by another process may bring a slot forward (leader) or free
                    # the lease (standby): wake for it rather than sleep the whole delay. The
                    # wait reads the database too, so its failure is retried like a step's.
                    self._storage.changes.wait(delay)
            except StorageError as exc:
                self._stop.wait(retry.failed(exc))  # raises once the file stays unreadable

    def stop(self) -> None:
        self._stop.set()
        self._storage.changes.notify()

    def release(self) -> None:
        if not self.leading:
            return
        self.leading = False
        try:
            self._leases.release(self.config.lease_key, self._token)
            log.info("%s released the lease", self.config.node_id)
            self._observer.leader_changed(self.config.lease_key, LeaderChange.RELEASED)
            self._record("leader.released")
        except (LeaseError, StorageError) as exc:
            log.warning("could not release the lease: %s", exc)

    # -- internals --------------------------------------------------------------------------

    def _try_lead(self, now: int) -> float:
        ttl = self.config.lease_ttl_ms
        lease = self._leases.acquire(self.config.lease_key, self._token, self.config.node_id, ttl)
        if lease is not None:
            self.leading = True
            self._last_renewed = lease.renewed_at
            log.info(
                "%s leads (lease %s, ttl %d ms)", self.config.node_id, self.config.lease_key, ttl
            )
            self._observer.leader_changed(self.config.lease_key, LeaderChange.ACQUIRED)
            self._record("leader.acquired", acquired_at=lease.acquired_at, ttl_ms=ttl)
            return 0.0
        self._observer.lease_contended(self.config.lease_key)
        holder = self._leases.current(self.config.lease_key)
        wait_ms = ttl // 2 if holder is None else min(ttl // 2, holder.expires_at - now)
        wait_ms += self._standby_jitter_ms
        # A driver that learns of a dead holder before its lease expires (the advisory lock,
        # freed when the holder's session ends) asks to be tried this often instead.
        retry_ms = getattr(self._leases, "standby_retry_ms", None)
        if isinstance(retry_ms, int) and retry_ms > 0:
            wait_ms = min(wait_ms, retry_ms)
        return max(0, wait_ms) / 1000

    def _renew(self, now: int) -> bool:
        try:
            lease = self._leases.renew(self.config.lease_key, self._token, self.config.lease_ttl_ms)
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
            self._observer.leader_changed(self.config.lease_key, LeaderChange.LOST)
            self._record("leader.lost", reason=why)
        self.leading = False
        self._token = secrets.token_hex(16)

    def _record(self, event: str, **data: object) -> None:
        """A lease change in the system's audit chain. Dispatch must not wait on it: a failed
        append is logged and counted, the lease change stands."""
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
            self._observer.audit_append_failed(event)

    def _report(self, report: DispatchReport, now: int) -> None:
        fired = report.dispatched
        # A line per fire for a few; for a burst, one line for the transaction at INFO (a
        # line per fire cost more than the fire) and the fires' own at DEBUG.
        each = logging.INFO if len(fired) <= LOG_EACH_UP_TO else logging.DEBUG
        if log.isEnabledFor(each):
            for fire in fired:
                log.log(
                    each,
                    "fired %s/%s slot %s late %d ms (run %d)",
                    fire.tenant,
                    fire.schedule_name,
                    iso_utc(fire.slot_at),
                    max(0, now - fire.due_at),
                    fire.run_id,
                )
        if len(fired) > LOG_EACH_UP_TO and log.isEnabledFor(logging.INFO):
            log.info(
                "fired %d slot(s) from %s to %s, late at most %d ms (runs %d to %d)",
                len(fired),
                iso_utc(min(f.slot_at for f in fired)),
                iso_utc(max(f.slot_at for f in fired)),
                max(0, now - min(f.due_at for f in fired)),
                min(f.run_id for f in fired),
                max(f.run_id for f in fired),
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


class _CyclicGcHold:
    """The cyclic garbage collector held off while dispatch transactions run. A transaction of
    2,000 fires allocates some 20,000 tuples and records, which set off a hundred or so young
    collections (and now and then a full one over every cached definition) for no garbage:
    5-10% of the transaction's time. Reference counting still frees everything; the
    collector runs again as soon as the last transaction is over (the first allocation after
    it collects what was held). Counted, so daemons on several threads (lease shards) share
    it; a collector someone else turned off stays off."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._disabled = False  # by us

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0 and gc.isenabled():
                gc.disable()
                self._disabled = True
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._disabled:
                    self._disabled = False
                    gc.enable()


_no_cyclic_gc = _CyclicGcHold().held


def resolver_at(now_ms: int, until_ms: int | None = None) -> Callable[[Schedule, int], SlotPlan]:
    """How the daemon decides, at `now_ms`, which slots of a due schedule fire: those due by
    `until_ms` (default `now_ms`; later by the lookahead).

    A slot dispatched ahead is on time: whether a slot was missed (its grace) or is too old
    (its maximum age) is judged at `now_ms`, not at `until_ms`, or a lookahead longer than a
    schedule's grace would make every one of its slots "missed" (and, misfire `skip`, never
    fired). plan_slots judges at the instant it is given, so each policy is given to it with
    its grace and age lengthened by the lookahead: the same verdict, reached at `until_ms`."""
    until = now_ms if until_ms is None else until_ms
    ahead = until - now_ms
    widened: dict[MisfirePolicy, MisfirePolicy] = {}

    def judged_now(policy: MisfirePolicy) -> MisfirePolicy:
        found = widened.get(policy)
        if found is None:
            found = widened[policy] = MisfirePolicy(
                policy.kind,
                policy.catch_up_cap,
                policy.max_age_ms + ahead,
                policy.grace_ms + ahead,
            )
        return found

    def resolve(schedule: Schedule, cursor: int) -> SlotPlan:
        return plan_slots(
            schedule_id=schedule.id,
            trigger=schedule.trigger,
            tz=schedule.timezone,
            cursor_ms=cursor,
            now_ms=until,
            policy=judged_now(schedule.misfire) if ahead > 0 else schedule.misfire,
            jitter_ms=schedule.jitter_ms,
        )

    return resolve

"""FireQueueConsumer: claim fires, run their commands on worker threads, settle each one.

One loop thread talks to the store (claim, heartbeat, settle); `concurrency` worker threads
run commands. Long commands are kept claimed by heartbeats; a consumer that dies simply stops
heartbeating, and its fires are claimed again after the TTL.

Execution is at least once: each settlement is written exactly once (fenced by its claim's
token), but a consumer that dies after a command returned and before its settlement committed
leaves the fire to be claimed, and run, again (FireContext.idempotency_key makes that
harmless). Such deaths are counted apart from failures (ConsumerConfig.consumer_deaths); runs
past their time limit are stopped by the watchdog (engine.runtime.time_limits).

Group commit. Every step writes one transaction: everything that finished since the last one
is settled in it (whatever claims the fires came from), and the next claim is taken in the same
transaction. Workers wake the loop only when a batch worth a transaction has finished or their
queue runs low, and a finished fire waits at most SETTLE_LINGER_MS for its settle.

Prefetch. Once the consumer has seen its commands finish quickly, a claim takes more fires
than there are free workers: as many as the workers are expected to start within
PREFETCH_WAIT_MS (the average run time so far, or the oldest running command's time if that is
longer), at most `prefetch`. The next claim is taken while the workers run the queue, before it
runs dry. A prefetched fire is claimed like a running one (overlap and pause were checked at
its claim; its claim is heartbeated), and its expected wait is far inside the claim TTL
(at least 1 s): the deadline still means that a consumer that dies gives its fires up. A fire
asked to stop (cancel-other) before a worker took it is settled without running.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.commands.context import FireContext
from engine.commands.registry import CommandRegistry
from engine.domain.clock import Clock
from engine.domain.errors import StorageError
from engine.domain.retry import RetryPolicy
from engine.domain.run import RunState
from engine.domain.timeutil import format_duration, iso_utc
from engine.observability.observer import NULL_OBSERVER, Observer
from engine.ports.enqueuer import Enqueuer
from engine.ports.fire_queue import Claim, Fire, FireQuery, Outcome, Settlement, SettleReport
from engine.ports.storage import Storage
from engine.runtime.executor import (
    CancelReason,
    abandoned_too_often,
    execute,
    hand_over,
    timed_out,
    unstarted,
)
from engine.runtime.storage_retry import StorageRetry
from engine.runtime.time_limits import TimeLimits

log = logging.getLogger("vortos.consumer")

DEFAULT_CONCURRENCY = 4
# At most this many fires claimed beyond the free workers (see the module's docstring).
DEFAULT_PREFETCH = 256
MAX_PREFETCH = 4096
# A prefetched fire is expected to start within this long of its claim: far inside any claim
# TTL (MIN_CLAIM_TTL_MS), so that a claim's deadline keeps its meaning.
PREFETCH_WAIT_MS = 100
# Prefetch only once this many runs were timed: a few fast ones say little about the rest.
PREFETCH_AFTER_RUNS = 32
# The weight of the newest run in the average run time.
RUN_TIME_WEIGHT = 0.2
# Workers wake the loop when this many settlements wait (or their queue runs low, or they go
# idle); the loop settles at the latest this long after a fire finished.
SETTLE_BATCH = 64
SETTLE_LINGER_MS = 5
# Fires waiting in the queue are asked whether they were cancelled this often (running ones
# at every step).
QUEUED_CANCEL_LOOK_S = 0.2
# A settle transaction logs a line per completed run up to this many, one for all above it
# (a run that failed, was cancelled, skipped or dead-lettered always has its own line).
LOG_EACH_UP_TO = 8
DEFAULT_CLAIM_TTL_MS = 60_000
MIN_CLAIM_TTL_MS = 1_000
DEFAULT_GRACE_MS = 30_000
DEFAULT_CONSUMER_DEATHS = 10
MAX_CONSUMER_DEATHS = 1000
# With nothing to do, look at the queue at least this often (a change by another process
# wakes the consumer sooner).
IDLE_WAIT_MS = 1_000


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    consumer_id: str
    concurrency: int = DEFAULT_CONCURRENCY
    claim_ttl_ms: int = DEFAULT_CLAIM_TTL_MS
    grace_ms: int = DEFAULT_GRACE_MS
    idle_wait_ms: int = IDLE_WAIT_MS
    prefetch: int = DEFAULT_PREFETCH  # 0: claim only for free workers
    # How many times a fire's consumer may vanish (killed, frozen past its claim) before the
    # fire is dead-lettered: counted apart from its failures (setting consumer_deaths).
    consumer_deaths: int = DEFAULT_CONSUMER_DEATHS

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= 256:
            raise ValueError("consumer concurrency must be between 1 and 256")
        if not 0 <= self.prefetch <= MAX_PREFETCH:
            raise ValueError(f"the consumer prefetch must be between 0 and {MAX_PREFETCH}")
        if self.claim_ttl_ms < MIN_CLAIM_TTL_MS:
            raise ValueError("the claim TTL must be at least 1s")
        if self.grace_ms < 0:
            raise ValueError("the shutdown grace must not be negative")
        if not 1 <= self.consumer_deaths <= MAX_CONSUMER_DEATHS:
            raise ValueError(
                f"consumer_deaths must be between 1 and {MAX_CONSUMER_DEATHS}, "
                f"not {self.consumer_deaths}"
            )


@dataclass(slots=True)
class _InFlight:
    fire: Fire
    token: str
    ctx: FireContext
    claimed_till: int
    # Its time limit (ms; None: none), looked up by the loop thread when it was claimed: a
    # worker thread does not read the store for it (on PostgreSQL each thread that reads
    # keeps a pooled connection, and 16 workers beside the loop ran the pool dry).
    limit_ms: int | None = None
    # perf_counter when a worker took it, and how long the command ran (None: it did not
    # run); both set by its worker thread.
    started: float | None = None
    ran_s: float | None = None

    @property
    def finished_at(self) -> float:
        """perf_counter when its command ended (or would have started)."""
        return (self.started or 0.0) + (self.ran_s or 0.0)


@dataclass(slots=True)
class ConsumerStats:
    claimed: int = 0
    settled: int = 0
    stale: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)


SettleListener = Callable[[list[Settlement], SettleReport], None]


class FireQueueConsumer:
    """`run()` loops until `stop()`; `step()` is one iteration, for tests on a manual clock."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        commands: CommandRegistry,
        config: ConsumerConfig,
        on_settle: SettleListener | None = None,
        observer: Observer | None = None,
        enqueuer: Enqueuer | None = None,
    ) -> None:
        self._storage = storage
        # With an enqueuer, fires are handed to its transport instead of run here.
        self._enqueuer = enqueuer
        self._clock = clock
        self._commands = commands
        # An enqueuer takes every command: the broker's workers know them.
        self._claimable: list[str] | None = None if enqueuer is not None else commands.names()
        self.config = config
        self._on_settle = on_settle
        self._observer = observer or NULL_OBSERVER
        self._inflight: dict[int, _InFlight] = {}
        self._jobs: queue.SimpleQueue[_InFlight | None] = queue.SimpleQueue()
        # Appended by workers, taken by the loop (deque appends and pops are atomic).
        self._done: deque[tuple[_InFlight, Settlement]] = deque()
        # Settlements taken from _done whose transaction failed: tried again first, so a
        # finished command is never mistaken for a running one (and never run again).
        self._unsent: dict[str, list[Settlement]] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        # Workers wake the loop once their queue is down to this (set with each claim).
        self._refill_at = 0
        # How long commands run: the average of the runs timed so far, and how many.
        self._run_s = 0.0
        self._timed = 0
        # The last claim took fewer fires than asked: nothing more is claimable until a
        # commit elsewhere, a poke, or the next wake-up (see _may_claim).
        self._drained = False
        self._looked_queued = 0.0  # monotonic time queued fires were last asked about
        # The commands' time limits and their watchdog (engine.runtime.time_limits).
        self.time_limits = TimeLimits(storage.schedules)
        self.stats = ConsumerStats()

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker threads (idempotent)."""
        with self._lock:
            if self._workers:
                return
            for n in range(self.config.concurrency):
                worker = threading.Thread(target=self._work, name=f"vortos-worker-{n}", daemon=True)
                worker.start()
                self._workers.append(worker)

    def run(self) -> None:
        """Claim and run fires until `stop()`; then finish or give back what is in flight."""
        self.start()
        retry = StorageRetry(log)
        try:
            while not self._stopping.is_set():
                try:
                    delay = self._step()
                    retry.succeeded()
                    if delay > 0 and not self._stopping.is_set():
                        # The wait reads the database too: its failure is retried like a
                        # step's (a claimed fire is safe meanwhile: its claim expires).
                        woke = self._storage.changes.wait(delay, self._wake)
                        if not woke or not self._wake.is_set():
                            # The time came, or another process committed: look again.
                            self._drained = False
                except StorageError as exc:
                    # Raises once the file stays unreadable: in-flight fires are then not
                    # settled here, and are claimed again when their claims expire.
                    self._stopping.wait(retry.failed(exc))
                self._wake.clear()
            self.drain(self.config.grace_ms / 1000)
        finally:
            self.close()

    def poke(self) -> None:
        """Look at the queue now: a daemon in this process just dispatched (another process's
        commit is noticed through the change feed)."""
        self._drained = False
        self._wake.set()

    def stop(self) -> None:
        """Stop claiming; `run()` then drains within the grace and returns."""
        self._stopping.set()
        self._wake.set()

    def close(self, join_s: float | None = None) -> None:
        """Stop the worker threads (after the current command, for the ones busy). With
        `join_s`, wait up to that long for each of them to end."""
        self.time_limits.close()
        with self._lock:
            workers, self._workers = self._workers, []
            for _ in workers:
                self._jobs.put(None)
        if join_s is not None:
            for worker in workers:
                worker.join(join_s)

    @property
    def busy(self) -> int:
        """Fires claimed and not yet settled (running, or waiting for a worker)."""
        return len(self._inflight)

    @property
    def unsettled(self) -> int:
        """Fires whose command finished and whose settlement is not written yet."""
        return len(self._done) + sum(len(batch) for batch in self._unsent.values())

    # -- one iteration ----------------------------------------------------------------------

    def step(self) -> float:
        """Settle what finished, heartbeat what runs, claim for idle workers (and, once the
        commands are known to be quick, ahead of them); return how long to wait (seconds)
        before the next step."""
        self._drained = False  # a caller stepping by hand always looks at the queue
        return self._step()

    def _step(self) -> float:
        self.start()
        self._heartbeat()
        self._watch_cancellations()
        if self._stopping.is_set():
            self._send(self._collect_finished())
            decided = 0
        else:
            decided = self._settle_and_claim()
        if decided:
            return 0.0
        now = self._clock.now_ms()
        wake = now + self.config.idle_wait_ms
        if self._inflight:
            soonest = min(f.claimed_till for f in self._inflight.values())
            wake = min(wake, soonest - self._renew_margin())
            if self._done:
                # A finished fire waits for its settle at most SETTLE_LINGER_MS.
                waited = time.perf_counter() - self._done[0][0].finished_at
                return max(0.001, SETTLE_LINGER_MS / 1000 - waited)
        if self._drained or len(self._inflight) < self.config.concurrency:
            upcoming = self._storage.fire_queue.next_available_at()
            if upcoming is not None:
                wake = min(wake, upcoming)
        return max(0.0, (wake - now) / 1000)

    def drain(self, grace_s: float) -> None:
        """Wait up to `grace_s` (real time) for in-flight fires to finish and settle them; ask
        the rest to stop and give them back (release) so another consumer runs them."""
        deadline = time.monotonic() + grace_s
        while self._inflight and time.monotonic() < deadline:
            self._quietly(self.settle_finished)
            self._quietly(self._heartbeat)
            if self._inflight:
                self._wake.wait(min(0.05, max(0.0, deadline - time.monotonic())))
                self._wake.clear()
        self._quietly(self.settle_finished)
        if not self._inflight:
            return
        finished = {s.run_id for batch in self._unsent.values() for s in batch}
        by_token: dict[str, list[Settlement]] = {}
        for item in list(self._inflight.values()):
            if item.fire.run_id in finished:
                continue  # done, only its settlement is missing: never give it back
            item.ctx.cancel(CancelReason.SHUTDOWN)
            by_token.setdefault(item.token, []).append(
                Settlement(item.fire.run_id, Outcome.RELEASE, RunState.DISPATCHED)
            )
        if by_token:
            log.warning(
                "%d fire(s) still running after the %s grace: released for another consumer",
                sum(len(batch) for batch in by_token.values()),
                format_duration(round(grace_s * 1000)),
            )
            self._quietly(lambda: self._send(by_token))
        if finished:
            log.error(
                "%d finished fire(s) could not be settled (the database stayed unavailable): "
                "after their claim expires they will be claimed, and run, again",
                len(finished),
            )

    @staticmethod
    def _quietly(action: Callable[[], object]) -> None:
        try:
            action()
        except StorageError as exc:
            log.warning("while stopping: %s", exc)

    def settle_finished(self) -> int:
        """Settle every fire whose command has finished; return how many."""
        finished = self._collect_finished()
        self._send(finished)
        return sum(len(batch) for batch in finished.values())

    def _collect_finished(self) -> dict[str, list[Settlement]]:
        """What finished (and what could not be sent before), by claim token; the run times
        go into the average."""
        by_token, self._unsent = self._unsent, {}
        done = self._done
        while done:
            item, settlement = done.popleft()
            by_token.setdefault(item.token, []).append(settlement)
            if item.ran_s is not None:
                self._timed += 1
                self._run_s += (item.ran_s - self._run_s) * (
                    1.0 if self._timed == 1 else RUN_TIME_WEIGHT
                )
        return by_token

    def _send(self, finished: dict[str, list[Settlement]]) -> None:
        """Settle `finished`, every claim's together, in one transaction."""
        if not finished:
            return
        try:
            reports, _ = self._storage.fire_queue.settle_and_claim(
                finished, consumer=self.config.consumer_id, ttl_ms=self.config.claim_ttl_ms, limit=0
            )
        except StorageError:
            self._keep(finished)
            raise
        for token, settlements in finished.items():
            self._settled(settlements, reports[token])
        finished.clear()

    def _keep(self, finished: dict[str, list[Settlement]]) -> None:
        for token, settlements in finished.items():
            self._unsent.setdefault(token, []).extend(settlements)

    # -- internals --------------------------------------------------------------------------

    def _prefetch(self) -> int:
        """How many fires to claim beyond the workers: what they are expected to start within
        PREFETCH_WAIT_MS, judged by the runs timed so far and the oldest one running."""
        if self.config.prefetch == 0 or self._timed < PREFETCH_AFTER_RUNS:
            return 0
        slowest = self._run_s
        now = time.perf_counter()
        for item in self._inflight.values():
            if item.started is not None and item.ran_s is None:
                slowest = max(slowest, now - item.started)
        per_worker = PREFETCH_WAIT_MS / 1000 / max(slowest, 1e-6)
        return min(self.config.prefetch, int(self.config.concurrency * per_worker))

    def _ripe(self) -> bool:
        """Whether the finished fires are worth a transaction now: a batch of them, or all
        that is in flight, or one that has waited SETTLE_LINGER_MS."""
        done = self._done
        if not done:
            return bool(self._unsent)
        if len(done) >= SETTLE_BATCH or len(done) >= len(self._inflight):
            return True
        return time.perf_counter() - done[0][0].finished_at >= SETTLE_LINGER_MS / 1000

    def _low(self, ahead: int) -> int:
        """With `ahead` fires prefetched, the queue is refilled once down to this."""
        return min(self.config.concurrency, ahead // 2)

    def _settle_and_claim(self) -> int:
        """Settle what finished and claim for the free workers (and ahead of them), in one
        transaction."""
        unsent = sum(len(batch) for batch in self._unsent.values())
        # Running or waiting, and the workers still held by commands that ignored their
        # cancellation past their time limit (their runs are settled; their threads are not
        # free).
        held = len(self._inflight) - len(self._done) - unsent + self.time_limits.ignoring
        concurrency = self.config.concurrency
        ahead = self._prefetch()
        want = concurrency + ahead - held
        # Claim in batches: when the workers' queue is low (or the workers are free), not for
        # every fire that finished.
        if want <= 0 or self._drained or (ahead and self._jobs.qsize() > self._low(ahead)):
            if self._ripe():
                self._send(self._collect_finished())
            return 0
        finished = self._collect_finished()
        try:
            reports, claim = self._storage.fire_queue.settle_and_claim(
                finished,
                consumer=self.config.consumer_id,
                ttl_ms=self.config.claim_ttl_ms,
                limit=want,
                commands=self._claimable,
            )
        except StorageError:
            self._keep(finished)
            raise
        for token, settlements in finished.items():
            self._settled(settlements, reports[token])
        unrun = len(claim.skipped) + len(claim.cancelled)
        self._drained = len(claim.fires) + unrun < want
        for rid, why in {**claim.skipped, **claim.cancelled}.items():
            log.info("run %d not run: %s", rid, why)
        if self._observer.active:
            self._observer.claimed(claim, self._unrun(claim))
        self._refill_at = self._low(ahead) if ahead else 0
        refused: list[Settlement] = []
        inflight, jobs, token, till = self._inflight, self._jobs, claim.token, claim.claimed_till
        if claim.fires:
            self.time_limits.look_up(claim.fires)  # one read for the claim, not one per schedule
        for fire in claim.fires:
            poisoned = (
                abandoned_too_often(fire, self.config.consumer_deaths, self._clock)
                if fire.abandoned_count
                else None
            )
            item = _InFlight(fire, token, _context(fire), till, self._limit_ms(fire))
            # In flight until settled (a poisoned one too, for its settlement below).
            inflight[fire.run_id] = item
            if poisoned is not None:
                refused.append(poisoned)
            else:
                jobs.put(item)
        self.stats.claimed += len(claim.fires)
        if refused:
            self._send({claim.token: refused})
        # Fires skipped or cancelled at claim took room in the batch: more may be waiting.
        return len(claim.fires) + unrun

    def _unrun(self, claim: Claim) -> list[Fire]:
        """The fires a claim skipped or cancelled, read for the observer's labels (a read,
        only when there are some)."""
        ids = (*claim.skipped, *claim.cancelled)
        if not ids:
            return []
        try:
            return self._storage.fire_queue.read(FireQuery(run_ids=ids, limit=len(ids)))
        except StorageError as exc:
            log.debug("could not read the fires skipped at claim: %s", exc)
            return []

    def _renew_margin(self) -> int:
        return self.config.claim_ttl_ms * 2 // 3

    def _heartbeat(self) -> None:
        if not self._inflight:
            return
        now = self._clock.now_ms()
        margin = self._renew_margin()
        due: dict[str, list[int]] = {}
        for rid, item in self._inflight.items():
            if item.claimed_till - now <= margin:
                due.setdefault(item.token, []).append(rid)
        for token, ids in due.items():
            report = self._storage.fire_queue.heartbeat(token, self.config.claim_ttl_ms, ids)
            till = self._clock.now_ms() + self.config.claim_ttl_ms
            for rid in report.extended:
                if rid in self._inflight:
                    self._inflight[rid].claimed_till = till
            for rid in report.cancel_requested:
                if rid in self._inflight:
                    self._inflight[rid].ctx.cancel(CancelReason.OVERLAP)
            for rid in report.stale:
                lost = self._inflight.get(rid)
                if lost is not None:
                    log.warning(
                        "run %d: the claim was taken over by another consumer; stopping it", rid
                    )
                    lost.ctx.cancel(CancelReason.LOST_CLAIM)

    def _watch_cancellations(self) -> None:
        """Pass cancel-other requests to running commands promptly, and now and then to fires
        waiting for a worker (a read, not a write)."""
        if not self._inflight:
            return
        every = time.monotonic()
        queued_too = every - self._looked_queued >= QUEUED_CANCEL_LOOK_S
        if queued_too:
            self._looked_queued = every
        running = [
            rid
            for rid, item in self._inflight.items()
            if item.ran_s is None
            and not item.ctx.cancelled
            and (queued_too or item.started is not None)
        ]
        if not running:
            return
        for rid in self._storage.fire_queue.cancel_requested(running):
            item = self._inflight.get(rid)
            if item is not None:
                item.ctx.cancel(CancelReason.OVERLAP)

    def _settled(self, settlements: list[Settlement], report: SettleReport) -> None:
        observe = self._observer.active
        stale = set(report.stale) if observe and report.stale else ()
        talk = log.isEnabledFor(logging.INFO)
        inflight = self._inflight
        by_outcome = self.stats.by_outcome
        plain: list[Fire] = []  # completed without an error, logged together when many
        for s in settlements:
            item = inflight.pop(s.run_id, None)
            state = s.run_state.value
            by_outcome[state] = by_outcome.get(state, 0) + 1
            if item is None:
                continue
            if observe:
                self._observer.settled(item.fire, s, item.ran_s, acked=s.run_id not in stale)
            if not talk:
                continue
            if s.run_state is RunState.COMPLETED and s.error is None:
                plain.append(item.fire)
            else:
                _log_run(item.fire, state, s.error)
        if len(plain) > LOG_EACH_UP_TO:
            # Thousands of fires a second would be thousands of lines: one for the batch.
            first, last = plain[0], plain[-1]
            log.info(
                "%d runs completed (runs %d to %d, slots %s to %s)",
                len(plain),
                first.run_id,
                last.run_id,
                iso_utc(min(f.slot_at for f in plain)),
                iso_utc(max(f.slot_at for f in plain)),
            )
        else:
            for fire in plain:
                _log_run(fire, RunState.COMPLETED.value, None)
        self.stats.settled += len(report.acked)
        self.stats.stale += len(report.stale)
        for rid in report.stale:
            log.warning("run %d: settlement was stale (another consumer owns the fire)", rid)
        if self._on_settle is not None:
            self._on_settle(settlements, report)

    def _retry_policy(self, fire: Fire) -> RetryPolicy:
        schedule = self._storage.schedules.get(fire.schedule_id)
        return RetryPolicy() if schedule is None else schedule.retry

    def _work(self) -> None:
        runner = asyncio.Runner()
        jobs, done, wake = self._jobs, self._done, self._wake
        observer = self._observer
        try:
            while True:
                item = jobs.get()
                if item is None:
                    return
                item.started = started = time.perf_counter()
                if item.ctx.cancel_reason in _NOT_TO_START:
                    # Superseded (cancel-other), or given back at a shutdown, before it started.
                    settlement = unstarted(item.fire, item.ctx, self._clock)
                elif observer.active:
                    with observer.running(item.fire) as watch:
                        settlement, limit = self._run(item, runner.run)
                        item.ran_s = time.perf_counter() - started
                        watch.finished(settlement, item.ran_s)
                else:
                    settlement, limit = self._run(item, runner.run)
                    item.ran_s = time.perf_counter() - started
                if limit is not None and not self.time_limits.returned(limit):
                    # Past its limit it ignored the request to stop: the watchdog settled
                    # the run already. This result is dropped (settled exactly once).
                    if observer.active:
                        observer.commands_ignoring_cancel(self.time_limits.ignoring)
                    continue
                done.append((item, settlement))
                # Wake the loop: for the first settlement waiting (it starts the linger), for
                # a batch worth a transaction, and before the queue runs dry.
                waiting = len(done)
                if waiting == 1 or waiting >= SETTLE_BATCH or jobs.qsize() <= self._refill_at:
                    wake.set()
        finally:
            runner.close()

    def _run(self, item: _InFlight, runner: Callable[[Any], Any]) -> tuple[Settlement, Any]:
        """The run's settlement, and the watchdog's handle when it has a time limit."""
        fire = item.fire
        command = self._commands.get(fire.command) if fire.command in self._commands else None
        enqueuer = self._enqueuer

        def retry() -> RetryPolicy:
            # Asked only when an attempt failed. The policy as the loop thread read it at the
            # claim: a worker that read the store itself would hold a pooled connection from
            # then on (PostgreSQL), and 16 failing workers beside the loop ran the pool dry,
            # each waiting out the pool's timeout and then settling with the default policy.
            known = self.time_limits.known_retry_policy(fire)
            if known is not None:
                return known
            try:
                return self._retry_policy(fire)
            except StorageError:
                return RetryPolicy()

        if enqueuer is not None:
            return hand_over(enqueuer, fire, retry, self._clock), None
        limit_ms = item.limit_ms
        handle = None
        if limit_ms is not None:
            item.ctx.timeout_ms = limit_ms
            handle = self.time_limits.watch(
                fire,
                limit_ms,
                on_expiry=lambda: item.ctx.cancel(CancelReason.TIMEOUT),
                on_ignored=lambda: self._settle_ignoring(item, limit_ms),
            )
        return execute(command, fire, item.ctx, retry, self._clock, runner), handle

    def _limit_ms(self, fire: Fire) -> int | None:
        """The time limit of a run of `fire` (on the loop thread, at its claim)."""
        if self._enqueuer is not None:
            self.time_limits.limit_ms(fire, None)  # its retry policy read here, not by a worker
            return None  # handed over, not run here
        command = self._commands.get(fire.command) if fire.command in self._commands else None
        return self.time_limits.limit_ms(fire, None if command is None else command.timeout_ms)

    def _settle_ignoring(self, item: _InFlight, limit_ms: int) -> None:
        """On the watchdog's thread: the command of `item` ignored its cancellation past its
        time limit; its run is settled timed_out without it (retried per its policy, as read
        at its claim: this thread does not read the store)."""
        item.ran_s = time.perf_counter() - (item.started or time.perf_counter())
        policy = self.time_limits.retry_policy(item.fire)
        self._done.append((item, timed_out(item.fire, policy, self._clock, limit_ms, ignored=True)))
        if self._observer.active:
            self._observer.commands_ignoring_cancel(self.time_limits.ignoring)
        self._wake.set()


def _log_run(fire: Fire, state: str, error: str | None) -> None:
    log.info(
        "run %d %s/%s slot %s attempt %d: %s%s",
        fire.run_id,
        fire.tenant,
        fire.schedule_name,
        iso_utc(fire.slot_at),
        fire.attempts,
        state,
        f" ({error})" if error else "",
    )


# A fire waiting for a worker is not started once asked to stop for these. (One whose claim
# was lost runs, as a running one goes on: its settle is stale and counted so.)
_NOT_TO_START = frozenset({CancelReason.OVERLAP, CancelReason.SHUTDOWN})


def _context(fire: Fire) -> FireContext:
    return FireContext(
        run_id=fire.run_id,
        tenant=fire.tenant,
        schedule_id=fire.schedule_id,
        schedule_name=fire.schedule_name,
        slot_key=fire.slot_key,
        slot_at=fire.slot_at,
        kind=fire.kind,
        attempt=fire.attempts,
    )

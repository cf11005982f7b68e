"""Time limits of commands run by a consumer: which limit applies to a run, and the watchdog
that enforces it.

A run's limit is its schedule's `timeout_ms` when the schedule sets one, else its command's
(`@schedulable(timeout=)`), else none. Limits are real elapsed time (like a process
command's own timeout), measured from the moment a worker starts the command.

On expiry the watchdog asks the command to stop (`FireContext.cancel` with
CancelReason.TIMEOUT): a cooperative command (one that checks `fire.cancelled`, waits with
`fire.wait_cancelled`, or is async and lets its task be cancelled) or a process command (its
process group is sent SIGTERM, then SIGKILL) ends, and the executor settles its run
`timed_out`. One that has not returned CANCEL_GRACE_MS later is ignoring the request: a
Python thread cannot be killed, so the watchdog settles the run `timed_out` itself (its
overlap slot frees, it is retried per its schedule's policy), logs it, and counts the command
as ignoring cancellation until it returns; its worker thread stays busy meanwhile (the
consumer claims for one worker fewer). When it does return, its result is dropped: the run
was settled once already, and is settled exactly once (the settlement is also fenced by the
claim's token in the store).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

from engine.domain.errors import StorageError
from engine.domain.retry import RetryPolicy
from engine.domain.timeutil import format_duration
from engine.ports.fire_queue import Fire
from engine.ports.schedules import ScheduleStore

log = logging.getLogger("vortos.consumer")

# After its limit, how long a command asked to stop has to return before it is reported as
# ignoring the request (longer than a process command's SIGTERM-to-SIGKILL grace).
CANCEL_GRACE_MS = 3_000
# A schedule's timeout is read again at most this often per schedule (an edit applies to
# runs started after that).
SCHEDULE_LOOK_S = 5.0


class _Phase(Enum):
    RUNNING = "running"
    RETURNED = "returned"
    TAKEN = "taken"  # the watchdog settled it: the command's own return is dropped


class _Watched:
    __slots__ = ("fire", "limit_ms", "on_expiry", "on_ignored", "phase", "started")

    def __init__(
        self,
        fire: Fire,
        limit_ms: int,
        on_expiry: Callable[[], None],
        on_ignored: Callable[[], None],
    ) -> None:
        self.fire = fire
        self.limit_ms = limit_ms
        self.on_expiry = on_expiry
        self.on_ignored = on_ignored
        self.phase = _Phase.RUNNING
        self.started = time.monotonic()


class TimeLimits:
    """The limits of one consumer's runs, and its watchdog thread (started with the first
    limited run)."""

    def __init__(self, schedules: ScheduleStore, grace_ms: int = CANCEL_GRACE_MS) -> None:
        self._schedules = schedules
        self._grace_s = grace_ms / 1000
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, int, _Watched]] = []  # (when, seq, step, run)
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        # schedule id -> (read at, its timeout, its retry policy); touched by the loop thread
        # only (the watchdog reads the retry policy of a fire claimed, so looked up, before).
        self._schedules_seen: dict[str, tuple[float, int | None, RetryPolicy]] = {}
        self._ignoring: dict[int, _Watched] = {}
        self.timed_out = 0  # runs this watchdog stopped (asked to stop), ever

    # -- which limit ------------------------------------------------------------------------

    def look_up(self, fires: Iterable[Fire]) -> None:
        """Read the schedules of `fires` not read lately, in one query (a claim's worth, on
        the loop thread): `limit_ms` and the retry policies are then answered from memory,
        so a claim of fires of many schedules costs one read, not one per schedule."""
        now = time.monotonic()
        seen = self._schedules_seen
        stale = {
            f.schedule_id
            for f in fires
            if (cached := seen.get(f.schedule_id)) is None or now - cached[0] >= SCHEDULE_LOOK_S
        }
        if not stale:
            return
        try:
            found = self._schedules.execution_limits(stale)
        except StorageError:
            return  # each is asked again, one by one, by limit_ms (the last one known kept)
        for sid in stale:
            timeout_ms, retry = found.get(sid, (None, RetryPolicy()))
            seen[sid] = (now, timeout_ms, retry)

    def limit_ms(self, fire: Fire, command_limit_ms: int | None) -> int | None:
        """The limit of a run of `fire`: its schedule's, else its command's, else None."""
        own = self._schedule_timeout(fire.schedule_id)
        return own if own is not None else command_limit_ms

    def retry_policy(self, fire: Fire) -> RetryPolicy:
        """The retry policy of `fire`'s schedule as last read for its limit (no read of the
        store: the watchdog's thread settles with it, and on PostgreSQL every thread that
        reads holds a pooled connection)."""
        seen = self._schedules_seen.get(fire.schedule_id)
        return RetryPolicy() if seen is None else seen[2]

    def known_retry_policy(self, fire: Fire) -> RetryPolicy | None:
        """The retry policy of `fire`'s schedule as read at its claim, None if never read."""
        seen = self._schedules_seen.get(fire.schedule_id)
        return None if seen is None else seen[2]

    def _schedule_timeout(self, schedule_id: str) -> int | None:
        now = time.monotonic()
        cached = self._schedules_seen.get(schedule_id)
        if cached is not None and now - cached[0] < SCHEDULE_LOOK_S:
            return cached[1]
        try:
            schedule = self._schedules.get(schedule_id)
        except StorageError:
            return None if cached is None else cached[1]  # the last one known
        if schedule is None:
            self._schedules_seen[schedule_id] = (now, None, RetryPolicy())
            return None
        self._schedules_seen[schedule_id] = (now, schedule.timeout_ms, schedule.retry)
        return schedule.timeout_ms

    # -- the watchdog -----------------------------------------------------------------------

    @property
    def ignoring(self) -> int:
        """Commands past their limit that ignored the request to stop and still hold their
        worker thread."""
        with self._lock:
            return len(self._ignoring)

    def ignoring_runs(self) -> list[tuple[Fire, float]]:
        """Each command ignoring its cancellation, with how long (s) it has run."""
        now = time.monotonic()
        with self._lock:
            return [(w.fire, now - w.started) for w in self._ignoring.values()]

    def watch(
        self,
        fire: Fire,
        limit_ms: int,
        *,
        on_expiry: Callable[[], None],
        on_ignored: Callable[[], None],
    ) -> Any:
        """Watch a run that starts now: `on_expiry` (ask it to stop) once `limit_ms` passed,
        then `on_ignored` (settle it without the command) if it has not returned within the
        grace. Both are called on the watchdog's thread. The handle goes to `returned`."""
        watched = _Watched(fire, limit_ms, on_expiry, on_ignored)
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="vortos-time-limits", daemon=True
                )
                self._thread.start()
            heapq.heappush(
                self._heap, (watched.started + limit_ms / 1000, next(self._seq), 1, watched)
            )
            self._wake.notify()
        return watched

    def returned(self, handle: Any) -> bool:
        """The command of `handle` (from `watch`) returned: True when its result settles the
        run, False when the watchdog settled it already (the result is dropped)."""
        watched: _Watched = handle
        with self._lock:
            if watched.phase is _Phase.TAKEN:
                late = self._ignoring.pop(watched.fire.run_id, None) is not None
            else:
                watched.phase = _Phase.RETURNED
                return True
        if late:
            ran = round((time.monotonic() - watched.started) * 1000)
            log.warning(
                "run %d (%s/%s): the command that ignored its cancellation returned after %s "
                "(its limit %s); its result is dropped, the run was settled timed_out",
                watched.fire.run_id,
                watched.fire.tenant,
                watched.fire.schedule_name,
                format_duration(ran),
                format_duration(watched.limit_ms),
            )
        return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._heap.clear()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = None if not self._heap else self._heap[0][0] - time.monotonic()
                    self._wake.wait(wait)
                if self._closed:
                    return
                _, _, step, watched = heapq.heappop(self._heap)
                if watched.phase is not _Phase.RUNNING:
                    continue  # it returned in time
                if step == 1:
                    self.timed_out += 1
                    heapq.heappush(
                        self._heap,
                        (time.monotonic() + self._grace_s, next(self._seq), 2, watched),
                    )
                else:
                    watched.phase = _Phase.TAKEN
                    self._ignoring[watched.fire.run_id] = watched
            if step == 1:
                log.warning(
                    "run %d (%s/%s): over its time limit of %s: asked to stop",
                    watched.fire.run_id,
                    watched.fire.tenant,
                    watched.fire.schedule_name,
                    format_duration(watched.limit_ms),
                )
                self._call(watched.on_expiry)
            else:
                log.error(
                    "run %d (%s/%s): the command ignored its cancellation %s after its time "
                    "limit of %s: the run is settled timed_out without it; its worker thread "
                    "stays busy until it returns (a Python thread cannot be killed: make the "
                    "command check fire.cancelled, or run it as a process command)",
                    watched.fire.run_id,
                    watched.fire.tenant,
                    watched.fire.schedule_name,
                    format_duration(round(self._grace_s * 1000)),
                    format_duration(watched.limit_ms),
                )
                self._call(watched.on_ignored)

    @staticmethod
    def _call(action: Callable[[], None]) -> None:
        try:
            action()
        except Exception:  # the watchdog must outlive a failing callback
            log.exception("time limits: a callback failed")

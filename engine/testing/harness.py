"""A scheduler in a test: the real daemon and consumer, a temporary database, a manual clock.

`scheduler_harness` opens an engine on a SQLite file in a temporary directory, with a
ManualClock at `start`, registers the app's commands and syncs its static schedules. Tests
create dynamic schedules through the real `ScheduleService` (`h.service`) and move time with
`h.advance` / `h.run_until`: the clock jumps from one instant where something is due (a slot,
a retry, a rescheduled fire) to the next, never second by second, and at each one the daemon
dispatches what is due and the consumer runs the claimed fires to completion before time moves
again. A simulated week of hourly slots takes well under a second.

Commands run on the consumer's worker thread (there is one, joined at the end), as in
production; the test's thread waits for each to finish.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.api import Engine, open_engine
from engine.commands import (
    App,
    Command,
    StaticSchedule,
    builtin_commands,
    load_app,
)
from engine.commands.decorators import command_of, schedules_of
from engine.domain.clock import ManualClock
from engine.domain.errors import InvalidInput
from engine.domain.run import RunKind, RunState
from engine.domain.schedule import DEFAULT_TENANT
from engine.domain.timeutil import DAY_MS, iso_utc, local, utc
from engine.ports.dispatch import DispatchReport
from engine.ports.fire_queue import Fire, FireQuery
from engine.ports.runs import RunQuery
from engine.runtime.consumer import FireQueueConsumer
from engine.runtime.daemon import SchedulerDaemon
from engine.service import ScheduleService
from engine.testing.expectations import (
    Duration,
    Instant,
    RunRecord,
    completed_with,
    duration_ms,
    fires_mismatch,
    instant_ms,
    ran_once_mismatch,
)

# Who the harness is, in the audit chain and the run ledger.
ACTOR = "vortos.testing"
NODE_ID = "vortos-testing"
# Longer than any simulated stretch a test plausibly covers, so a jump of the clock never lets
# the lease lapse (which would only add lost/acquired entries to the audit chain).
LEASE_TTL_MS = 3650 * DAY_MS
# Real seconds a command may run before the harness gives up on it (it is asked to stop).
RUN_TIMEOUT_S = 60.0
# Guards against a loop that makes no progress at one instant (a command that reschedules
# itself with no delay, say): far above anything a test does at one instant.
MAX_ROUNDS = 10_000
LEDGER_LIMIT = 10_000_000

CommandLike = Callable[..., Any] | Command


class SchedulerHarness:
    """The engine of a test, and the verbs to move its time and check what it did.

    Made by `scheduler_harness`. `engine`, `service` (a `ScheduleService`) and `clock` (a
    `ManualClock`) are the real objects: create, pause or trigger schedules through
    `service` with any actor. Time moves only through `advance` and `run_until` (or the
    assertions that run the engine over a window).
    """

    def __init__(self, engine: Engine, clock: ManualClock) -> None:
        self.engine = engine
        self.clock = clock
        self.service: ScheduleService = engine.service
        self._reports: list[DispatchReport] = []  # what the daemon's last step dispatched
        self._daemon: SchedulerDaemon = engine.daemon(
            node_id=NODE_ID, lease_ttl_ms=LEASE_TTL_MS, on_dispatch=self._dispatched
        )
        # One worker: fires run one after another, in the order they were claimed, so a
        # test sees the same sequence every time.
        self._consumer: FireQueueConsumer = engine.consumer(consumer_id=NODE_ID, concurrency=1)

    # -- time ------------------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        """The harness's current instant, an aware datetime in UTC."""
        return utc(self.clock.now_ms())

    def advance(self, duration: Duration) -> None:
        """Move time forward by `duration` ('1h', '7d', seconds, a timedelta), running
        everything that falls due on the way and at the end."""
        self.run_until(utc(self.clock.now_ms() + duration_ms(duration)))

    def run_until(self, instant: Instant) -> None:
        """Move time forward to `instant` (an offset-less one is UTC), stopping at every
        instant where a slot is due or a fire becomes available: the daemon dispatches, then
        the consumer runs what it can claim, until nothing more is due there."""
        target = instant_ms(instant)
        now = self.clock.now_ms()
        if target < now:
            raise InvalidInput(
                f"{iso_utc(target)} is before the harness's clock ({iso_utc(now)}): time "
                "only moves forward"
            )
        self._settle_now()
        while (upcoming := self._next_event()) is not None and upcoming <= target:
            self.clock.set(upcoming)
            self._settle_now()
        if self.clock.now_ms() < target:
            self.clock.set(target)
            self._settle_now()

    # -- reads -----------------------------------------------------------------------------

    def runs(
        self,
        schedule: str | None = None,
        *,
        command: str | Callable[..., Any] | None = None,
        tenant: str | None = None,
        state: RunState | None = None,
    ) -> list[RunRecord]:
        """The runs so far, oldest first, with their command and payload: of the schedule
        named `schedule` (in any tenant unless `tenant` is given), of `command` (a name or
        a @schedulable function), in `state`."""
        name = None if command is None else command_name(command)
        found = self.service.runs(RunQuery(tenant=tenant, state=state, limit=LEDGER_LIMIT))
        runs = sorted(
            (r for r in found if schedule is None or r.schedule_name == schedule),
            key=lambda r: r.id,
        )
        fires = self._fires(tenant)
        records = []
        for run in runs:
            fire = fires.get(run.id)  # a run and its fire are written and pruned together
            if fire is None or (name is not None and fire.command != name):
                continue
            records.append(
                RunRecord(
                    id=run.id,
                    schedule=run.schedule_name,
                    tenant=run.tenant,
                    kind=run.kind,
                    state=run.state,
                    command=fire.command,
                    payload=dict(fire.payload),
                    slot_at=utc(run.slot_at),
                    attempts=run.attempts,
                    error=run.error,
                    output=run.output,
                )
            )
        return records

    def fires(self, schedule: str, *, tenant: str = DEFAULT_TENANT) -> list[datetime]:
        """The slot instants the daemon has dispatched for `schedule` so far, oldest first,
        as aware datetimes in the schedule's zone (manual and backfill runs left out)."""
        stored = self.service.get(schedule, tenant=tenant)
        return [local(ms, stored.timezone) for ms in self._slots(stored.id, tenant)]

    # -- assertions ------------------------------------------------------------------------

    def assert_fires_at(
        self,
        schedule: str,
        expected: Iterable[Instant],
        *,
        within: Duration,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        """Run the engine from now over `within` and assert that `schedule` fired exactly at
        the `expected` slot instants meanwhile (ISO strings or datetimes; one without an
        offset is a wall time in the schedule's zone). The window ends `within` from now,
        inclusive; a slot due now that has not fired yet counts. Manual and backfill runs do
        not count. On a mismatch the message lists both, what is missing and what was not
        expected. The clock stays at the window's end."""
        stored = self.service.get(schedule, tenant=tenant)
        wanted = [instant_ms(x, stored.timezone) for x in expected]
        start = self.clock.now_ms()
        end = start + duration_ms(within, what="within")
        before = self._newest_run_id()
        self.run_until(utc(end))
        fired = self._slots(stored.id, tenant, after_run=before)
        message = fires_mismatch(
            f"{tenant}/{schedule}", stored.timezone, (start, end), wanted, fired
        )
        if message is not None:
            raise AssertionError(message)

    def assert_ran_once(
        self,
        command: str | Callable[..., Any],
        payload: Mapping[str, Any] | None = None,
        *,
        tenant: str | None = None,
    ) -> RunRecord:
        """Assert that exactly one run of `command` (a name or a @schedulable function)
        completed with `payload` (compared as stored: the schedule's validated payload; None
        means any payload), and return it. Does not move time. On a mismatch the message says
        how many completed and lists every run of the command, with its state and payload."""
        name = command_name(command)
        runs = self.runs(command=name, tenant=tenant)
        message = ran_once_mismatch(
            name, payload, runs, {r.command for r in self.runs(tenant=tenant)}
        )
        if message is not None:
            raise AssertionError(message)
        (run,) = [r for r in runs if completed_with(r, payload)]
        return run

    # -- driving ---------------------------------------------------------------------------

    def _settle_now(self) -> None:
        """Dispatch what is due now and run what can be claimed now, until neither finds
        anything. The consumer's last step comes after every command ended, so a fire a
        command enqueued (a trigger) was seen by it; a schedule a command made due is seen
        by the next dispatch, and then the consumer looks again."""
        self._dispatch_due()
        self._run_claimable()
        for _ in range(MAX_ROUNDS):
            if not self._dispatch_due():
                return
            self._run_claimable()
        raise RuntimeError(
            f"still dispatching at {iso_utc(self.clock.now_ms())} after {MAX_ROUNDS} rounds: "
            "does a command make its own schedule due every time it runs?"
        )

    def _dispatch_due(self) -> bool:
        """Step the daemon until it leads and nothing is due now; whether it dispatched."""
        now = self.clock.now_ms()
        dispatcher = self.engine.storage.dispatcher
        dispatched = False
        for _ in range(MAX_ROUNDS):
            due = dispatcher.next_due_at()
            if self._daemon.leading and (due is None or due > now):
                return dispatched
            leading = self._daemon.leading
            self._reports.clear()
            self._daemon.step()
            report = self._reports[-1] if self._reports else None
            dispatched = dispatched or report is not None
            if (
                leading
                and due is not None
                and dispatcher.next_due_at() == due
                and (report is None or not report.dispatched)
            ):
                # The daemon passed over what is due (it logs why): time could never move on.
                why = "" if report is None else "; ".join(report.failed.values())
                raise RuntimeError(
                    f"the daemon made no progress at {iso_utc(now)}: a schedule due at "
                    f"{iso_utc(due)} was not dispatched{f' ({why})' if why else ''}"
                )
        raise RuntimeError(f"the daemon did not finish dispatching at {iso_utc(now)}")

    def _run_claimable(self) -> None:
        """Step the consumer, running each claimed fire to completion, until a step decides
        nothing."""
        for _ in range(MAX_ROUNDS):
            # A step returns 0 exactly when it claimed, skipped or cancelled a fire: with
            # nothing in flight, it otherwise waits for a fire available after now.
            wait = self._consumer.step()
            if self._consumer.busy:
                self._finish_running()
            if wait > 0:
                return
        raise RuntimeError(
            f"the consumer kept claiming at {iso_utc(self.clock.now_ms())} after {MAX_ROUNDS} "
            "fires: does a command reschedule itself with no delay?"
        )

    def _finish_running(self) -> None:
        """Wait for the claimed fires' commands and settle them. `drain` is the consumer's
        own wait: woken by its worker the moment a command ends, no polling."""
        started = time.monotonic()
        self._consumer.drain(RUN_TIMEOUT_S)
        if time.monotonic() - started >= RUN_TIMEOUT_S:
            raise RuntimeError(
                f"a command ran longer than {RUN_TIMEOUT_S:.0f} s (real time) at "
                f"{iso_utc(self.clock.now_ms())}: it was asked to stop and its fire given "
                "back; commands under the harness must not wait for the clock"
            )

    def _next_event(self) -> int | None:
        """The soonest instant after now when a slot is due or a fire becomes available."""
        due = self.engine.storage.dispatcher.next_due_at()
        available = self.engine.storage.fire_queue.next_available_at()
        upcoming = [t for t in (due, available) if t is not None]
        return min(upcoming) if upcoming else None

    def _dispatched(self, report: DispatchReport) -> None:
        self._reports.append(report)

    def _slots(self, schedule_id: str, tenant: str, *, after_run: int = 0) -> list[int]:
        runs = self.service.runs(
            RunQuery(tenant=tenant, schedule_id=schedule_id, limit=LEDGER_LIMIT)
        )
        return sorted(r.slot_at for r in runs if r.kind is RunKind.SCHEDULED and r.id > after_run)

    def _newest_run_id(self) -> int:
        newest = self.service.runs(RunQuery(limit=1))
        return newest[0].id if newest else 0

    def _fires(self, tenant: str | None) -> dict[int, Fire]:
        found = self.engine.storage.fire_queue.read(FireQuery(tenant=tenant, limit=LEDGER_LIMIT))
        return {f.run_id: f for f in found}

    def close(self) -> None:
        """Stop the consumer's worker (and wait for it: none outlives the test) and give up
        the lease."""
        self._consumer.close(join_s=RUN_TIMEOUT_S)
        self._daemon.release()


@contextmanager
def scheduler_harness(
    *,
    start: Instant,
    app: App | ModuleType | str | None = None,
    commands: Iterable[CommandLike] = (),
) -> Iterator[SchedulerHarness]:
    """An engine on a temporary SQLite file, its clock a ManualClock at `start` (an
    offset-less instant is UTC), with the built-in commands, the `app`'s (an `App`, a
    module, or module names as for `--app`) and `commands` (@schedulable functions or
    `Command`s). The static schedules (@scheduled) of the app and of `commands` are synced
    at `start`; the built-in retention sweep is not, so it never shows among the runs. The
    directory is removed at the end.

        with scheduler_harness(app=myjobs, start="2026-01-05T00:00:00Z") as h:
            h.assert_fires_at("send-invoices", ["2026-01-05T03:00:00+01:00"], within="1d")
    """
    clock = ManualClock(instant_ms(start))
    loaded = _app(app)
    registry = loaded.register_into(builtin_commands())
    declared = list(loaded.static)
    for item in commands:
        command, static = _command(item)
        registry.add(command)
        declared.extend(static)
    with tempfile.TemporaryDirectory(prefix="vortos-harness-") as directory:
        db = Path(directory) / "vortos.db"
        with open_engine(db, clock=clock, commands=registry) as engine:
            engine.service.sync_static(_unique(declared), actor=ACTOR)
            harness = SchedulerHarness(engine, clock)
            try:
                yield harness
            finally:
                harness.close()


def command_name(command: str | Callable[..., Any]) -> str:
    """A command's name, given as the name or as its @schedulable function."""
    if isinstance(command, str):
        return command
    found = command_of(command)
    if found is None:
        raise InvalidInput(
            f"{getattr(command, '__qualname__', command)!r} is not a command: mark it "
            "@schedulable, or give the command's name"
        )
    return found.name


def _app(app: App | ModuleType | str | None) -> App:
    if app is None:
        return App()
    if isinstance(app, App):
        return app
    if isinstance(app, ModuleType):
        return load_app(app.__name__)  # already imported: collected, not imported again
    return load_app(app)


def _command(item: CommandLike) -> tuple[Command, list[StaticSchedule]]:
    if isinstance(item, Command):
        return item, []
    found = command_of(item)
    if found is None:
        raise InvalidInput(
            f"{getattr(item, '__qualname__', item)!r} is not a command: mark it @schedulable"
        )
    return found, schedules_of(item)


def _unique(declared: list[StaticSchedule]) -> list[StaticSchedule]:
    """The static schedules, each once (a function given both in the app and in
    `commands`); two different ones with the same name are refused."""
    seen: dict[tuple[str, str], StaticSchedule] = {}
    for item in declared:
        key = (item.spec.tenant, item.spec.name)
        other = seen.setdefault(key, item)
        if other != item:
            raise InvalidInput(
                f"two static schedules are named {item.spec.name!r} in tenant "
                f"{item.spec.tenant!r} ({other.source} and {item.source}): pass name=... "
                "to @scheduled"
            )
    return list(seen.values())

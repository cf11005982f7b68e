"""Observer: what the runtime tells about itself, for metrics and traces.

The daemon, the consumer and (through the same object) retention and the dead-man detector call
these hooks after the fact, with what they did. This base class does nothing, so the engine runs
as a library with no metrics and no tracing and pays one method call per hook; a metrics or a
tracing observer overrides the hooks it needs. Hooks must never raise into the runtime and must
be cheap: they run on the dispatch and consume paths.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType

from engine.domain.misfire import SlotPlan
from engine.domain.schedule import Schedule
from engine.ports.dispatch import DispatchReport, Resolver
from engine.ports.fire_queue import Claim, Fire, Outcome, Settlement


class LeaderChange(StrEnum):
    ACQUIRED = "acquired"
    LOST = "lost"  # a renewal or a dispatch was refused: someone else may hold it now
    RELEASED = "released"  # given up on purpose (shutdown)


class DeadmanVerdict(StrEnum):
    """What the dead-man detector concluded about one schedule."""

    FIRED = "fired"  # dispatched within its tolerance
    OVERDUE = "overdue"  # its last dispatch is older than the tolerance allows
    NEVER_FIRED = "never_fired"  # known for longer than the tolerance, and never dispatched
    INDETERMINATE = "indeterminate"  # not enough known to judge


class PruneTrigger(StrEnum):
    SCHEDULED = "scheduled"  # the retention sweeper's own schedule
    MANUAL = "manual"  # an operator's `vortos prune`


@dataclass(frozen=True, slots=True)
class ScheduleVerdict:
    tenant: str
    schedule: str  # the schedule's name (unique within its tenant)
    # One of DeadmanVerdict's values (the detector's own enum of the same values will do).
    verdict: str


@dataclass(slots=True)
class DispatchFacts:
    """What a dispatch transaction's report does not say: when it ran, how long it took, and
    which plan each resolved schedule got (for misfires and already-dispatched slots)."""

    now_ms: int  # the daemon's clock at the start of the transaction
    started_ns: int  # the wall clock (time.time_ns) at its start, for spans
    seconds: float  # how long the transaction took
    node_id: str
    planned: list[tuple[Schedule, SlotPlan]] = field(default_factory=list)


def recording(resolve: Resolver, facts: DispatchFacts) -> Resolver:
    """`resolve`, also noting each schedule's plan in `facts` (an append per due schedule)."""
    planned = facts.planned

    def resolve_and_note(schedule: Schedule, cursor: int) -> SlotPlan:
        plan = resolve(schedule, cursor)
        planned.append((schedule, plan))
        return plan

    return resolve_and_note


def run_result(settlement: Settlement) -> str:
    """What an attempt came to, in one word: completed, failed, dead_lettered, cancelled,
    skipped, retry (failed, to be tried again), rescheduled or released (given back)."""
    if settlement.outcome is Outcome.FAIL:
        return "retry"
    if settlement.outcome is Outcome.RESCHEDULE:
        return "rescheduled"
    if settlement.outcome is Outcome.RELEASE:
        return "released"
    return settlement.run_state.value


class RunWatch:
    """Watches one run of a command (see `Observer.running`). This one does nothing."""

    def __enter__(self) -> RunWatch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def finished(self, settlement: Settlement, seconds: float) -> None:
        """The command returned (or raised) and this is the settlement it led to."""


NO_WATCH = RunWatch()


class Observer:
    """Hooks the runtime calls; every one does nothing here. Subclass and override.

    `active` is False only for the do-nothing observer: the runtime then skips the work of
    gathering facts nobody reads (the plans of a dispatch, the fires skipped at a claim).
    """

    active = True

    # -- the daemon -------------------------------------------------------------------------

    def daemon_started(self, lease: str, node_id: str) -> None:
        """A daemon will contend for `lease` (lets labelled series start at zero)."""

    def tick(self, seconds: float) -> None:
        """One pass of the daemon's loop (`step()`) took `seconds`."""

    def dispatched(self, report: DispatchReport, facts: DispatchFacts) -> None:
        """A dispatch transaction committed."""

    def dispatch_failed(self, error: Exception, facts: DispatchFacts) -> None:
        """A dispatch transaction failed (rolled back: nothing of it was written)."""

    def held_back(self, due: Sequence[Schedule]) -> None:
        """Due schedules the daemon did not dispatch because its breaker was open."""

    def breaker_changed(self, breaker: str, state: str) -> None:
        """A circuit breaker moved to `state` (closed, open or half_open)."""

    def lease_contended(self, lease: str) -> None:
        """An attempt to take `lease` found another holder."""

    def leader_changed(self, lease: str, change: LeaderChange) -> None: ...

    def audit_append_failed(self, event: str) -> None:
        """An audit entry (`event`, such as leader.acquired) could not be appended."""

    # -- plug-ins ---------------------------------------------------------------------------

    def plugin_failed(self, port: str, plugin: str, reason: str) -> None:
        """A secondary plug-in's call raised (error), hung (timeout), or an event for it was
        dropped (see engine.runtime.isolation)."""

    # -- the consumer -----------------------------------------------------------------------

    def claimed(self, claim: Claim, unrun: Sequence[Fire]) -> None:
        """A claim committed. `unrun` are the fires it skipped or cancelled instead (their
        reasons are in `claim.skipped` and `claim.cancelled`); given only to active
        observers."""

    def running(self, fire: Fire) -> RunWatch:
        """Entered around one run of a command, on the worker thread that runs it."""
        return NO_WATCH

    def settled(
        self, fire: Fire, settlement: Settlement, ran_s: float | None, *, acked: bool
    ) -> None:
        """A settlement was written (`acked`) or found stale (another claim owns the fire).
        `ran_s` is how long the command ran, None when it did not run (given back at
        shutdown, or dead-lettered for having been abandoned too often)."""

    def commands_ignoring_cancel(self, count: int) -> None:
        """How many commands of this consumer are past their time limit, ignored the request
        to stop, and still hold their worker thread (engine.runtime.time_limits)."""

    # -- retention --------------------------------------------------------------------------

    def runs_pruned(self, tenant: str, count: int) -> None:
        """Retention deleted `count` terminal runs of `tenant`."""

    def prune_finished(self, seconds: float, trigger: PruneTrigger) -> None:
        """A prune pass (all its batches) ended after `seconds`."""

    # -- the dead-man detector --------------------------------------------------------------

    def deadman_verdicts(self, verdicts: Iterable[ScheduleVerdict]) -> None:
        """The detector's latest verdicts, one per schedule it judged: they replace the
        previous set (a schedule absent from `verdicts` is no longer reported)."""


class NullObserver(Observer):
    """The observer of an engine used without metrics or tracing."""

    active = False


NULL_OBSERVER = NullObserver()


class Observers(Observer):
    """Several observers as one (metrics and tracing, say)."""

    def __init__(self, *observers: Observer) -> None:
        self.members = [o for o in observers if o.active]
        self.active = bool(self.members)

    def daemon_started(self, lease: str, node_id: str) -> None:
        for o in self.members:
            o.daemon_started(lease, node_id)

    def tick(self, seconds: float) -> None:
        for o in self.members:
            o.tick(seconds)

    def dispatched(self, report: DispatchReport, facts: DispatchFacts) -> None:
        for o in self.members:
            o.dispatched(report, facts)

    def dispatch_failed(self, error: Exception, facts: DispatchFacts) -> None:
        for o in self.members:
            o.dispatch_failed(error, facts)

    def held_back(self, due: Sequence[Schedule]) -> None:
        for o in self.members:
            o.held_back(due)

    def breaker_changed(self, breaker: str, state: str) -> None:
        for o in self.members:
            o.breaker_changed(breaker, state)

    def lease_contended(self, lease: str) -> None:
        for o in self.members:
            o.lease_contended(lease)

    def leader_changed(self, lease: str, change: LeaderChange) -> None:
        for o in self.members:
            o.leader_changed(lease, change)

    def audit_append_failed(self, event: str) -> None:
        for o in self.members:
            o.audit_append_failed(event)

    def plugin_failed(self, port: str, plugin: str, reason: str) -> None:
        for o in self.members:
            o.plugin_failed(port, plugin, reason)

    def claimed(self, claim: Claim, unrun: Sequence[Fire]) -> None:
        for o in self.members:
            o.claimed(claim, unrun)

    def running(self, fire: Fire) -> RunWatch:
        watches = [w for w in (o.running(fire) for o in self.members) if w is not NO_WATCH]
        if not watches:
            return NO_WATCH
        return watches[0] if len(watches) == 1 else _Watches(watches)

    def settled(
        self, fire: Fire, settlement: Settlement, ran_s: float | None, *, acked: bool
    ) -> None:
        for o in self.members:
            o.settled(fire, settlement, ran_s, acked=acked)

    def commands_ignoring_cancel(self, count: int) -> None:
        for o in self.members:
            o.commands_ignoring_cancel(count)

    def runs_pruned(self, tenant: str, count: int) -> None:
        for o in self.members:
            o.runs_pruned(tenant, count)

    def prune_finished(self, seconds: float, trigger: PruneTrigger) -> None:
        for o in self.members:
            o.prune_finished(seconds, trigger)

    def deadman_verdicts(self, verdicts: Iterable[ScheduleVerdict]) -> None:
        given = list(verdicts)
        for o in self.members:
            o.deadman_verdicts(given)


class _Watches(RunWatch):
    def __init__(self, watches: list[RunWatch]) -> None:
        self._watches = watches
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> RunWatch:
        for watch in self._watches:
            self._stack.enter_context(watch)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.__exit__(kind, value, tb)

    def finished(self, settlement: Settlement, seconds: float) -> None:
        for watch in self._watches:
            watch.finished(settlement, seconds)

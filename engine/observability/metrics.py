"""Prometheus metrics: an observer that counts what the runtime reports.

Each PrometheusMetrics has its own registry (never prometheus_client's global one), so several
engines, or several tests, can run in one process. Every family is named `vortos_*` with its
unit in the name and is listed, with its labels, in the README's "Metrics and tracing" table.
Schedule and tenant label values pass a cardinality guard (see guard.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine.domain.errors import LeaseError
from engine.domain.misfire import due_at
from engine.domain.overlap import SKIPPED_BUFFER, SKIPPED_OVERLAP
from engine.domain.run import RunState
from engine.domain.schedule import MisfireKind, Schedule
from engine.observability.guard import (
    DEFAULT_MAX_SCHEDULES,
    DEFAULT_MAX_TENANTS,
    OVERFLOW,
    CardinalityGuard,
)
from engine.observability.observer import (
    DeadmanVerdict,
    DispatchFacts,
    LeaderChange,
    Observer,
    PruneTrigger,
    ScheduleVerdict,
)
from engine.ports.dispatch import DispatchReport
from engine.ports.fire_queue import Claim, Fire, Outcome, Settlement

# Fire results (vortos_fires_total{result}).
DISPATCHED = "dispatched"
ALREADY_DISPATCHED = "already_dispatched"
SKIPPED_FOR_OVERLAP = "skipped_overlap"
DEFERRED_JITTER = "deferred_jitter"
CIRCUIT_OPEN = "circuit_open"
DROPPED_CATCHUP_AGE = "dropped_catchup_age"

DISPATCH_BREAKER = "dispatch"
BREAKER_STATES = ("closed", "half_open", "open")  # the gauge's values 0, 1, 2
LEADER_EVENTS = ("leader.acquired", "leader.lost", "leader.released")

LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
TICK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
RUN_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
PRUNE_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800)

_OVERLAP_SKIPS = frozenset({SKIPPED_OVERLAP, SKIPPED_BUFFER})


Resolve = Callable[[tuple[str, ...]], tuple[tuple[str, ...], bool]]


class _Children:
    """The children of one labelled family, looked up by raw values (the schedule's tenant and
    name, say) and cached once the cardinality guard admitted them: prometheus_client's
    `labels()` validates and locks on every call, and the guard is a set lookup more; a dict
    lookup is what the dispatch path can pay per fire. Values the guard refused are resolved
    on every call, so each observation under __overflow__ is counted."""

    def __init__(self, family: Any, resolve: Resolve) -> None:
        self._family = family
        self._resolve = resolve
        self._admitted: dict[tuple[str, ...], Any] = {}  # raw values -> child
        self._children: dict[tuple[str, ...], Any] = {}  # label values -> child

    def __call__(self, *raw: str) -> Any:
        child = self._admitted.get(raw)
        if child is None:
            values, admitted = self._resolve(raw)
            child = self._children.get(values)
            if child is None:
                child = self._children[values] = self._family.labels(*values)
            if admitted:
                self._admitted[raw] = child
        return child


class PrometheusMetrics(Observer):
    """The runtime's metrics in `self.registry`; serve them with `serve_metrics` (server.py)
    and add the scrape-time gauges with `watch` (gauges.py)."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        max_schedules: int = DEFAULT_MAX_SCHEDULES,
        max_tenants: int = DEFAULT_MAX_TENANTS,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # In the order a scrape lists them (the registry keeps registration order).
        self._cardinality_guards(r, max_schedules, max_tenants)
        self._dispatch_families(r)
        self._leadership_families(r)
        self._run_families(r)
        self._upkeep_families(r)
        self._cache_children()

    def _cardinality_guards(
        self, r: CollectorRegistry, max_schedules: int, max_tenants: int
    ) -> None:
        """The overflow counter and the cardinality guards that feed it."""
        self.label_overflow = Counter(
            "vortos_metric_label_overflow_total",
            "Observations reported under the __overflow__ label value because the cardinality "
            "guard's cap of distinct schedules (or tenants) was reached.",
            ["label"],
            registry=r,
        )
        # Each guard counts its own refusals: both label values exist from the first scrape.
        self._schedules = CardinalityGuard(
            max_schedules, self.label_overflow.labels("schedule").inc
        )
        self._tenants = CardinalityGuard(max_tenants, self.label_overflow.labels("tenant").inc)

    def _dispatch_families(self, r: CollectorRegistry) -> None:
        """What becomes of due slots, and the daemon's loop and transactions."""
        self.fires = Counter(
            "vortos_fires_total",
            "Due slots by what became of them: dispatched, already_dispatched, skipped_overlap, "
            "dropped_catchup_age; deferred_jitter and circuit_open count slots held back.",
            ["result", "schedule", "tenant"],
            registry=r,
        )
        self.misfires = Counter(
            "vortos_misfires_total",
            "Slots resolved later than their misfire grace, by the schedule's misfire policy "
            "and whether the policy fired or skipped them.",
            ["policy", "action", "schedule", "tenant"],
            registry=r,
        )
        self.lateness = Histogram(
            "vortos_dispatch_lateness_seconds",
            "From a slot's due instant to the commit of its dispatch.",
            ["tenant"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.tick_duration = Histogram(
            "vortos_tick_duration_seconds",
            "One pass of the daemon's loop: lease upkeep, due scan and dispatch transaction.",
            buckets=TICK_BUCKETS,
            registry=r,
        )
        self.dispatch_failures = Counter(
            "vortos_dispatch_failures_total",
            "Dispatch transactions that failed: storage (counted by the breaker) or lease "
            "(refused: this node no longer leads).",
            ["error"],
            registry=r,
        )

    def _leadership_families(self, r: CollectorRegistry) -> None:
        """The lease and the dispatch circuit breaker."""
        self.lease_contention = Counter(
            "vortos_lease_contention_total",
            "Attempts to take the lease that found another holder.",
            ["lease"],
            registry=r,
        )
        self.leader_changes = Counter(
            "vortos_leader_changes_total",
            "This process taking (acquired), losing (lost) or giving up (released) the lease.",
            ["lease", "change"],
            registry=r,
        )
        self.leader = Gauge(
            "vortos_leader", "1 while this process holds the lease.", ["lease"], registry=r
        )
        self.breaker_state = Gauge(
            "vortos_breaker_state",
            "A circuit breaker's state: 0 closed, 1 half-open, 2 open.",
            ["breaker"],
            registry=r,
        )
        self.breaker_transitions = Counter(
            "vortos_breaker_transitions_total",
            "Circuit breaker state changes, by the state entered.",
            ["breaker", "state"],
            registry=r,
        )

    def _run_families(self, r: CollectorRegistry) -> None:
        """What the consumers report: runs, attempts, dead letters, claims."""
        self.runs = Counter(
            "vortos_runs_total",
            "Runs that ended, by outcome: completed, failed, dead_lettered, timed_out, "
            "cancelled, skipped.",
            ["outcome", "schedule", "tenant"],
            registry=r,
        )
        self.run_duration = Histogram(
            "vortos_run_duration_seconds",
            "How long a command ran, per attempt.",
            ["schedule", "tenant"],
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "vortos_retries_total",
            "Failed attempts given another try after their backoff.",
            ["schedule", "tenant"],
            registry=r,
        )
        self.dead_letters = Counter(
            "vortos_dead_letters_total",
            "Fires dead-lettered: retries_exhausted, or abandoned (their consumers vanished "
            "too often).",
            ["reason", "schedule", "tenant"],
            registry=r,
        )
        self.stale_settles = Counter(
            "vortos_stale_settles_total",
            "Settlements refused because another claim owns the fire (nothing changed).",
            registry=r,
        )
        self.abandoned_claims = Counter(
            "vortos_abandoned_claims_total",
            "Fires this process took over from a claim that expired unsettled.",
            registry=r,
        )
        self.consumer_deaths = Counter(
            "vortos_consumer_deaths_total",
            "Attempts that ended with their consumer gone (killed, frozen past its claim), "
            "counted when another consumer takes the fire over: apart from failures, against "
            "the consumer_deaths budget.",
            ["schedule", "tenant"],
            registry=r,
        )
        self.runs_timed_out = Counter(
            "vortos_runs_timed_out_total",
            "Attempts that outran their time limit (each a failed attempt: retried, or the "
            "run ends timed_out).",
            ["schedule", "tenant"],
            registry=r,
        )
        self.ignoring_cancel = Gauge(
            "vortos_commands_ignoring_cancel",
            "Commands past their time limit that ignored the request to stop and still hold "
            "a worker thread of this process.",
            registry=r,
        )

    def _upkeep_families(self, r: CollectorRegistry) -> None:
        """Audit appends, secondary plug-ins, retention and the dead-man detector."""
        self.audit_failures = Counter(
            "vortos_audit_append_failures_total",
            "Audit entries that could not be appended (the change they record stands).",
            ["event"],
            registry=r,
        )
        self.plugin_failures = Counter(
            "vortos_plugin_failures_total",
            "Calls to a secondary plug-in (an audit sink, a metrics backend) that raised "
            "(error), ran past plugin_timeout (timeout), or events dropped while it was "
            "behind (dropped). Firing never waits for these plug-ins.",
            ["port", "plugin", "reason"],
            registry=r,
        )
        self.pruned_runs = Counter(
            "vortos_runs_pruned_total",
            "Terminal runs deleted by retention.",
            ["tenant"],
            registry=r,
        )
        self.prune_duration = Histogram(
            "vortos_prune_duration_seconds",
            "One retention pass, all its batches.",
            ["trigger"],
            buckets=PRUNE_BUCKETS,
            registry=r,
        )
        for trigger in PruneTrigger:  # every trigger's series from the first scrape, at zero
            self.prune_duration.labels(trigger.value)
        self.deadman = Gauge(
            "vortos_deadman_verdict",
            "Schedules with this dead-man verdict (fired, overdue, never_fired, "
            "indeterminate): 1 or 0 per schedule, a count under __overflow__.",
            ["schedule", "tenant", "verdict"],
            registry=r,
        )
        # The series of the last verdicts, to remove those of schedules gone since.
        self._deadman_lock = threading.Lock()
        self._deadman_series: set[tuple[str, str, str]] = set()

    def _cache_children(self) -> None:
        """The labelled families' child caches (see _Children), for the per-fire paths."""
        # Each called with the family's leading labels, then the tenant (and schedule name).
        self._fires = _Children(self.fires, self._by_schedule)
        self._misfires = _Children(self.misfires, self._by_schedule)
        self._lateness = _Children(self.lateness, self._by_tenant)
        self._runs = _Children(self.runs, self._by_schedule)
        self._run_duration = _Children(self.run_duration, self._by_schedule)
        self._retries = _Children(self.retries, self._by_schedule)
        self._dead_letters = _Children(self.dead_letters, self._by_schedule)
        self._deaths = _Children(self.consumer_deaths, self._by_schedule)
        self._timed_out = _Children(self.runs_timed_out, self._by_schedule)
        self._pruned = _Children(self.pruned_runs, self._by_tenant)

    # -- labels -----------------------------------------------------------------------------

    def _tenant(self, tenant: str) -> str:
        return tenant if self._tenants.admit(tenant) else OVERFLOW

    def _series(self, tenant: str, schedule: str) -> tuple[str, str]:
        """The (schedule, tenant) label values of one schedule, through the guards."""
        if self._schedules.admit((tenant, schedule)):
            return schedule, tenant
        return OVERFLOW, self._tenant(tenant)

    def _by_schedule(self, raw: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
        *leading, tenant, name = raw
        schedule, tenant_label = self._series(tenant, name)
        return (*leading, schedule, tenant_label), schedule != OVERFLOW

    def _by_tenant(self, raw: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
        *leading, tenant = raw
        label = self._tenant(tenant)
        return (*leading, label), label != OVERFLOW

    # -- the daemon -------------------------------------------------------------------------

    def daemon_started(self, lease: str, node_id: str) -> None:
        self.lease_contention.labels(lease)
        for change in LeaderChange:
            self.leader_changes.labels(lease, change.value)
        self.leader.labels(lease).set(0)
        self.breaker_state.labels(DISPATCH_BREAKER).set(0)
        for state in BREAKER_STATES:
            self.breaker_transitions.labels(DISPATCH_BREAKER, state)
        for error in ("storage", "lease"):
            self.dispatch_failures.labels(error)
        for event in LEADER_EVENTS:
            self.audit_failures.labels(event)

    def tick(self, seconds: float) -> None:
        self.tick_duration.observe(seconds)

    def dispatched(self, report: DispatchReport, facts: DispatchFacts) -> None:
        now = facts.now_ms
        # From the due instant to the commit: the transaction ended `seconds` after `now`.
        commit_lag = facts.seconds
        fires, lateness = self._fires, self._lateness
        for fire in report.dispatched:
            tenant, name = fire.tenant, fire.schedule_name
            fires(DISPATCHED, tenant, name).inc()
            if fire.due_at != fire.slot_at:
                fires(DEFERRED_JITTER, tenant, name).inc()
            late = (now - fire.due_at) / 1000 + commit_lag
            lateness(tenant).observe(late if late > 0 else 0.0)
        for schedule, plan in facts.planned:
            if plan.skipped_missed or plan.dropped_aged:
                self._missed(schedule, plan.skipped_missed, plan.dropped_aged)
            if plan.fire and now - plan.fire[0] > schedule.misfire.grace_ms:
                late_fired = _late(schedule, plan.fire, now)
                if late_fired:
                    self._misfire(schedule, "fired", late_fired)
        if report.already_dispatched:
            self._already_dispatched(report, facts)

    def _missed(self, schedule: Schedule, skipped: int, dropped: int) -> None:
        if skipped:
            self._misfire(schedule, "skipped", skipped)
        if dropped:
            self._fires(DROPPED_CATCHUP_AGE, schedule.tenant, schedule.name).inc(dropped)

    def _misfire(self, schedule: Schedule, action: str, count: int) -> None:
        policy: MisfireKind = schedule.misfire.kind
        self._misfires(policy.value, action, schedule.tenant, schedule.name).inc(count)

    def _already_dispatched(self, report: DispatchReport, facts: DispatchFacts) -> None:
        """Planned slots the ledger already held: a crash after a commit, a stale cursor."""
        landed = {(f.schedule_id, f.slot_at) for f in report.dispatched}
        for schedule, plan in facts.planned:
            taken = sum(1 for slot in plan.fire if (schedule.id, slot) not in landed)
            if taken:
                self._fires(ALREADY_DISPATCHED, schedule.tenant, schedule.name).inc(taken)

    def dispatch_failed(self, error: Exception, facts: DispatchFacts) -> None:
        self.dispatch_failures.labels(_error_kind(error)).inc()

    def held_back(self, due: Sequence[Schedule]) -> None:
        for schedule in due:
            self._fires(CIRCUIT_OPEN, schedule.tenant, schedule.name).inc()

    def breaker_changed(self, breaker: str, state: str) -> None:
        self.breaker_state.labels(breaker).set(BREAKER_STATES.index(state))
        self.breaker_transitions.labels(breaker, state).inc()

    def lease_contended(self, lease: str) -> None:
        self.lease_contention.labels(lease).inc()

    def leader_changed(self, lease: str, change: LeaderChange) -> None:
        self.leader_changes.labels(lease, change.value).inc()
        self.leader.labels(lease).set(1 if change is LeaderChange.ACQUIRED else 0)

    def audit_append_failed(self, event: str) -> None:
        self.audit_failures.labels(event).inc()

    def plugin_failed(self, port: str, plugin: str, reason: str) -> None:
        self.plugin_failures.labels(port, plugin, reason).inc()

    # -- the consumer -----------------------------------------------------------------------

    def claimed(self, claim: Claim, unrun: Sequence[Fire]) -> None:
        for fire in unrun:
            tenant, name = fire.tenant, fire.schedule_name
            why = claim.skipped.get(fire.run_id)
            if why is not None:
                self._runs(RunState.SKIPPED.value, tenant, name).inc()
                if why in _OVERLAP_SKIPS:
                    self._fires(SKIPPED_FOR_OVERLAP, tenant, name).inc()
            elif fire.run_id in claim.cancelled:
                self._runs(RunState.CANCELLED.value, tenant, name).inc()
        taken_over = [fire for fire in claim.fires if _taken_over(fire)]
        if taken_over:
            self.abandoned_claims.inc(len(taken_over))
            for fire in taken_over:
                self._deaths(fire.tenant, fire.schedule_name).inc()

    def settled(
        self, fire: Fire, settlement: Settlement, ran_s: float | None, *, acked: bool
    ) -> None:
        tenant, name = fire.tenant, fire.schedule_name
        if ran_s is not None:
            self._run_duration(tenant, name).observe(ran_s)
        outcome = settlement.outcome
        if not acked:
            if outcome is not Outcome.RELEASE:  # a lost claim's give-back is expected
                self.stale_settles.inc()
            return
        if settlement.timed_out:
            self._timed_out(tenant, name).inc()
        if outcome is Outcome.FAIL:
            self._retries(tenant, name).inc()
        elif outcome in (Outcome.COMPLETE, Outcome.DISCARD):
            self._runs(settlement.run_state.value, tenant, name).inc()
            if settlement.run_state is RunState.DEAD_LETTERED:
                reason = "abandoned" if ran_s is None else "retries_exhausted"
                self._dead_letters(reason, tenant, name).inc()

    def commands_ignoring_cancel(self, count: int) -> None:
        self.ignoring_cancel.set(count)

    # -- retention --------------------------------------------------------------------------

    def runs_pruned(self, tenant: str, count: int) -> None:
        if count > 0:
            self._pruned(tenant).inc(count)

    def prune_finished(self, seconds: float, trigger: PruneTrigger) -> None:
        self.prune_duration.labels(PruneTrigger(trigger).value).observe(seconds)

    # -- the dead-man detector --------------------------------------------------------------

    def deadman_verdicts(self, verdicts: Iterable[ScheduleVerdict]) -> None:
        values: dict[tuple[str, str, str], int] = {}
        for v in verdicts:
            schedule, tenant = self._series(v.tenant, v.schedule)
            given = DeadmanVerdict(v.verdict)  # the detector's own enum has the same values
            for verdict in DeadmanVerdict:
                key = (schedule, tenant, verdict.value)
                values[key] = values.get(key, 0) + (verdict is given)
        with self._deadman_lock:
            for gone in self._deadman_series - values.keys():
                self.deadman.remove(*gone)
            for key, value in values.items():
                self.deadman.labels(*key).set(value)
            self._deadman_series = set(values)


def _late(schedule: Schedule, slots: Sequence[int], now: int) -> int:
    """How many of `slots` were resolved later than the schedule's misfire grace."""
    grace, jitter = schedule.misfire.grace_ms, schedule.jitter_ms
    if jitter <= 0:
        return sum(1 for slot in slots if now - slot > grace)
    return sum(
        1 for slot in slots if now - due_at(schedule.id, slot, schedule.timezone, jitter) > grace
    )


def _taken_over(fire: Fire) -> bool:
    """Whether this claim took the fire over from an expired one. A takeover records the old
    claim's deadline, which is never before the fire became available; any later settlement
    that makes the fire available again (a retry, a reschedule, a requeue) moves
    `available_at` past it. (A fire given back at shutdown after a takeover keeps both, so its
    next claim counts again: rare, and on the side of reporting.)"""
    return fire.last_abandoned_at is not None and fire.last_abandoned_at >= fire.available_at


def _error_kind(error: Exception) -> str:
    return "lease" if isinstance(error, LeaseError) else "storage"

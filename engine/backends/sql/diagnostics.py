"""Diagnostics on either SQL backend: the tables the doctor reads, the fire queue's age and
what `vortos db info` counts, one SQL for both. The facts about the database itself (PRAGMAs,
the server, its clock) are each backend's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from engine.backends.sql import SqlPool, first
from engine.ports.diagnostics import ExecutionFacts, OverLimit, QueueFacts

P = TypeVar("P", bound=SqlPool[Any])

TABLES = (
    "schedules",
    "runs",
    "fire_queue",
    "leases",
    "audit_entries",
    "audit_checkpoints",
    "audit_verified",
    "operator_grants",
    "approvals",
    "audit_sink_positions",
    "plugin_health",
)


def unreadable_tables(
    read: Callable[[str], object],
    error: type[Exception],
    describe: Callable[[Exception], str],
) -> dict[str, str]:
    """Each of TABLES that `read` cannot read (raising the driver's `error`), with why."""
    problems: dict[str, str] = {}
    for table in TABLES:
        try:
            read(f"SELECT 1 FROM {table} LIMIT 1")
        except error as exc:
            problems[table] = f"{type(exc).__name__}: {describe(exc)}"
    return problems


def store_counts(one: Callable[[str], Any]) -> dict[str, Any]:
    """What `vortos db info` counts, each through `one` (a query's single value)."""
    return {
        "schedules": one("SELECT count(*) FROM schedules"),
        "active_schedules": one("SELECT count(*) FROM schedules WHERE status = 'active'"),
        "runs": one("SELECT count(*) FROM runs"),
        "fire_queue_open": one(
            "SELECT count(*) FROM fire_queue WHERE completed_at IS NULL AND discarded_at IS NULL"
        ),
    }


class SqlDiagnostics(Generic[P]):
    """The doctor's reads of the queue and the schedules; a backend adds the facts about the
    database itself."""

    def __init__(self, pool: P) -> None:
        self._pool = pool

    def queue_facts(self, now_ms: int) -> QueueFacts:
        now = self._pool.dialect.param("now")
        waiting = (
            "FROM fire_queue WHERE completed_at IS NULL AND discarded_at IS NULL "
            f"AND available_at <= {now} AND (lease_token IS NULL OR consumed_till <= {now})"
        )
        # One statement, so one snapshot: the four facts agree with each other.
        found = first(
            self._pool,
            f"SELECT (SELECT min(available_at) {waiting}), (SELECT count(*) {waiting}), "
            "(SELECT max(started_at) FROM runs), "
            "(SELECT count(*) FROM fire_queue WHERE discarded_at IS NOT NULL)",
            {"now": now_ms},
        )
        assert found is not None
        oldest, count, last, dead = found
        return QueueFacts(
            oldest_waiting_at=None if oldest is None else int(oldest),
            waiting=int(count),
            last_claim_at=None if last is None else int(last),
            dead_letters=int(dead),
        )

    def execution_facts(
        self, now_ms: int, since_ms: int, ignored_marker: str, deaths_at_least: int
    ) -> ExecutionFacts:
        p = self._pool.dialect.param
        args = {
            "now": now_ms,
            "since": since_ms,
            "marker": f"%{ignored_marker}%",
            "deaths": deaths_at_least,
        }
        # Few rows each: running runs (the consumers' width) and recent oddities.
        over = self._pool.read(
            "SELECT r.id, r.tenant, r.schedule_name, r.started_at, s.timeout_ms FROM runs r "
            "JOIN schedules s ON s.id = r.schedule_id WHERE r.state = 'running' "
            f"AND s.timeout_ms IS NOT NULL AND r.started_at + s.timeout_ms < {p('now')} "
            "ORDER BY r.started_at LIMIT 20",
            args,
        )
        ignored = self._pool.read(
            "SELECT id, schedule_name FROM runs WHERE finished_at >= "
            f"{p('since')} AND error LIKE {p('marker')} ORDER BY id DESC LIMIT 20",
            args,
        )
        open_fires = "f.completed_at IS NULL AND f.discarded_at IS NULL"
        # Open or not: a fire dead-lettered for its deaths a minute ago is the finding most
        # worth a warning, not a reason for none.
        abandoned = first(
            self._pool,
            f"SELECT count(*) FROM fire_queue f WHERE f.last_abandoned_at >= {p('since')}",
            args,
        )
        near = self._pool.read(
            "SELECT f.run_id, r.schedule_name, f.abandoned_count - f.abandoned_at_requeue "
            f"FROM fire_queue f JOIN runs r ON r.id = f.run_id WHERE {open_fires} AND "
            f"f.abandoned_count - f.abandoned_at_requeue >= {p('deaths')} "
            "ORDER BY f.run_id LIMIT 20",
            args,
        )
        return ExecutionFacts(
            over_limit=[
                OverLimit(int(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4])) for r in over
            ],
            ignored_cancel=[(int(r[0]), str(r[1])) for r in ignored],
            abandoned_since=0 if abandoned is None else int(abandoned[0]),
            near_death_budget=[(int(r[0]), str(r[1]), int(r[2])) for r in near],
        )

    def zones_in_use(self) -> list[str]:
        found = self._pool.read("SELECT DISTINCT timezone FROM schedules ORDER BY 1")
        return [str(r[0]) for r in found]

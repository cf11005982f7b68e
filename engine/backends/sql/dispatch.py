"""Dispatch on either SQL backend: the plan of a batch, the lease fence's verdict, and the
decoded definitions of recently due schedules, one for both.

How a batch is scanned, locked and written (SQLite's single writer and its run ids handed out
in advance; PostgreSQL's row locks and one statement writing everything) stays in each backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from engine.backends.codec import SCHEDULE_COLUMNS, schedule_from_row
from engine.backends.sql import Row, SqlPool, first, scalar
from engine.domain.audit import FIRES_DISPATCHED, AuditEvent, FiredRun, batch_data
from engine.domain.errors import InvalidInput, LeaseExpired, LeaseNotOwned, VortosError
from engine.domain.misfire import due_at
from engine.domain.schedule import Schedule, canonical_json
from engine.domain.slots import slot_key
from engine.ports.dispatch import DispatchedFire, DispatchReport, Resolver

P = TypeVar("P", bound=SqlPool[Any])

ACTIVE = "status = 'active' AND next_fire_at IS NOT NULL"
# A row of the due scan: (id, version, cursor, tenant, next_fire_at), as fairness reads it.
DUE_COLUMNS = "id, version, next_slot_at, tenant, next_fire_at"
# The tenants with any active schedule, one index seek each (a skip scan), not a table scan.
TENANTS = (
    "WITH RECURSIVE t(name) AS ("
    f"SELECT (SELECT min(tenant) FROM schedules WHERE {ACTIVE}) "
    f"UNION ALL SELECT (SELECT min(tenant) FROM schedules WHERE {ACTIVE} AND tenant > t.name) "
    "FROM t WHERE t.name IS NOT NULL) SELECT name FROM t WHERE name IS NOT NULL"
)
# A schedule whose definition cannot be read or resolved is looked at again after this long.
RETRY_BROKEN_MS = 60_000
# Decoded definitions of recently due schedules. Bounded: the daemon must not hold every
# schedule in memory when a million are stored.
CACHE_SIZE = 50_000

# A planned fire (its run id 0 until the run is written), with its command and payload.
Planned = tuple[DispatchedFire, str, str]
# A cursor move: (next_slot_at, next_fire_at, schedule id).
Advance = tuple[int | None, int | None, str]


def fired(runs: Sequence[DispatchedFire]) -> list[AuditEvent]:
    """The audit entries of a dispatch transaction's fires: one per tenant, committing to all
    of its runs (engine.domain.audit.batch_data), not one per fire."""
    by_tenant: dict[str, list[FiredRun]] = {}
    actor = ""
    for run in runs:
        actor = run.node_id
        by_tenant.setdefault(run.tenant, []).append(
            (run.run_id, run.schedule_id, run.slot_key, run.slot_at, run.due_at)
        )
    return [
        AuditEvent(FIRES_DISPATCHED, actor=actor, tenant=tenant, data=batch_data(tenant_runs))
        for tenant, tenant_runs in sorted(by_tenant.items())
    ]


def check_fence(lease_key: str, token: str, now_ms: int, lease: tuple[Any, int] | None) -> None:
    """Refuse to dispatch unless `lease` (the lease row's token and expiry, None when there is
    no row) is `token`'s and still live at `now_ms`."""
    if lease is None or lease[0] != token:
        raise LeaseNotOwned(f"lease {lease_key} is not held by this node")
    if lease[1] <= now_ms:
        raise LeaseExpired(f"lease {lease_key} expired before dispatch")


def check_shard(shard: tuple[int, int] | None) -> None:
    """Refuse a shard (index, count) that does not exist."""
    if shard is not None and (shard[1] < 1 or not 0 <= shard[0] < shard[1]):
        raise InvalidInput(
            f"shard {shard[0]} of {shard[1]} does not exist: shards are numbered 0 to count - 1"
        )


def plan_due(
    due: Sequence[Row],
    definition: Callable[[str, int], tuple[Schedule, str]],
    resolve: Resolver,
    now_ms: int,
    node_id: str,
    limit: int,
    report: DispatchReport,
) -> tuple[list[Planned], list[Advance]]:
    """Without I/O but through `definition` (schedule id, version -> the schedule and its
    payload as stored): the fires of the due schedules (rows of the due scan, soonest first),
    at most about `limit`, and the cursor moves; what was skipped, dropped, held back or left
    for the next transaction goes into `report`."""
    planned: list[Planned] = []
    advances: list[Advance] = []
    for sid, version, cursor, _tenant, _due in due:
        if len(planned) >= limit:
            report.truncated = True  # the rest stay due for the next transaction
            break
        report.scanned += 1
        try:
            schedule, payload = definition(sid, version)
            plan = resolve(schedule, cursor)
        except (VortosError, ValueError, KeyError, TypeError) as exc:
            # One unreadable definition must not stop every other schedule: hold it back for
            # a while, cursor untouched, and say so.
            report.failed[sid] = f"{type(exc).__name__}: {exc}"
            advances.append((cursor, now_ms + RETRY_BROKEN_MS, sid))
            continue
        if plan.skipped_missed or plan.dropped_aged:
            report.plans[f"{schedule.tenant}/{schedule.name}"] = plan
        report.skipped_missed += plan.skipped_missed
        report.dropped_aged += plan.dropped_aged
        tenant, name, tz = schedule.tenant, schedule.name, schedule.timezone
        for slot_at in plan.fire:
            key = slot_key(sid, slot_at, tz)
            due_instant = due_at(sid, slot_at, tz, schedule.jitter_ms)
            fire = DispatchedFire(0, tenant, sid, name, key, slot_at, due_instant, now_ms, node_id)
            planned.append((fire, schedule.command, payload))
        advances.append((plan.next_slot_at, plan.next_fire_at, sid))
    return planned, advances


class SqlDispatcher(ABC, Generic[P]):
    """The decoded definitions a dispatcher keeps, and when the next schedule is due; a
    backend adds `dispatch_due` and its shard condition (`_shard`)."""

    def __init__(self, pool: P) -> None:
        self._pool = pool
        # By schedule id: (version, schedule, payload as stored), least recently used first.
        self._definitions: OrderedDict[str, tuple[int, Schedule, str]] = OrderedDict()

    @abstractmethod
    def _shard(self, shard: tuple[int, int] | None) -> tuple[str, dict[str, int]]:
        """The due scan's condition keeping `shard`'s schedules, and its named arguments
        (none when not sharded); refuses a shard that does not exist."""

    def next_due_at(self, shard: tuple[int, int] | None = None) -> int | None:
        sharded, shard_args = self._shard(shard)
        sql = f"SELECT min(next_fire_at) FROM schedules WHERE {ACTIVE}{sharded}"
        found = scalar(self._pool, sql, shard_args)
        return None if found is None else int(found)

    def _load_definitions(self, conn: Any, due: Sequence[Row]) -> None:
        """Read, in one statement, the definitions of the due schedules not cached at their
        current version (a daemon just started: every one) inside the dispatch transaction.
        One that cannot be decoded is left for `_definition`, which reads it alone and says
        why."""
        missing = [
            r[0]
            for r in due
            if (cached := self._definitions.get(r[0])) is None or cached[0] != r[1]
        ]
        if not missing:
            return
        d = self._pool.dialect
        sql = f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE {d.one_of('id', d.mark, 'text')}"
        for row in conn.execute(sql, (d.bind_list(missing),)).fetchall():
            try:
                schedule = schedule_from_row(row)
            except VortosError:
                self._definitions.pop(row[0], None)
                continue
            self._remember(schedule, row[7])

    def _remember(self, schedule: Schedule, stored: str | None = None) -> tuple[Schedule, str]:
        """Keep `schedule` with its payload as stored (`stored`: the column as read, which is
        canonical JSON already)."""
        payload = canonical_json(dict(schedule.payload)) if stored is None else stored
        self._definitions[schedule.id] = (schedule.version, schedule, payload)
        self._definitions.move_to_end(schedule.id)
        if len(self._definitions) > CACHE_SIZE:
            self._definitions.popitem(last=False)
        return schedule, payload

    def _definition(self, schedule_id: str, version: int) -> tuple[Schedule, str]:
        """The schedule at `version` and its payload as stored (plan_due's `definition`).
        Not cached (never read, undecodable, or evicted by a batch larger than the cache), it
        is read alone, inside the dispatch transaction: the due scan just returned it."""
        cached = self._definitions.get(schedule_id)
        if cached is not None and cached[0] == version:
            self._definitions.move_to_end(schedule_id)
            return cached[1], cached[2]
        row = first(
            self._pool,
            f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE id = {self._pool.dialect.mark}",
            (schedule_id,),
        )
        assert row is not None
        return self._remember(schedule_from_row(row), row[7])

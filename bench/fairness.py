"""What the per-tenant cap of a dispatch transaction buys, and what it costs.

The daemon's `tenant_cap` (default 200 of a batch of 2,000): while one tenant holds more than the
cap of a full batch, every other tenant with due schedules gets up to the cap of that
transaction, found through its own index range, and the rest goes to the soonest due. Each
scenario runs with the cap and without it (`tenant_cap=None`), in one process, on copies of one
backlog file, three times each, alternating which goes first; the real daemon drains it on a
frozen manual clock (nothing new falls due), each `step()` one real dispatch transaction.

1. Noisy neighbour: tenant `a` has N schedules with one slot due at T (N = 100,000; `--quick`:
   10,000); ten tenants `b`..`k` have 10 schedules each, due at T + 1 ms, so in due order they
   sit behind all of `a`'s backlog. Measured: dispatch transactions and wall time until the last
   of `b`..`k`'s fires is dispatched (the commit of its transaction), and until everything is.
2. Alone: tenant `a` alone with N due: dispatch throughput with and without the cap (the cap
   must not slow a tenant that has nobody to share with).

Every run checks exactly-once: as many runs in the ledger as slots, each slot key once, and
each tenant's runs as many as its schedules.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import apsw

from bench._common import (
    bulk_insert,
    cores,
    count_of,
    interval_rows,
    machine_busy_s,
    new_database,
    now_ms,
    num,
    parse_args,
    print_table,
    quiet_logging,
    scratch_dir,
)
from bench.audit import copy_database
from engine import DaemonConfig, ManualClock, SchedulerDaemon, open_engine
from engine.backends.codec import SCHEDULE_COLUMNS
from engine.backends.sqlite.dispatch import SqliteDispatcher
from engine.ports.dispatch import DispatchReport
from engine.runtime.daemon import DEFAULT_BATCH, DEFAULT_TENANT_CAP

HOUR_MS = 3_600_000
NOISY = "a"
OTHERS = tuple("bcdefghijk")  # ten tenants
OTHER_SCHEDULES = 10  # each
REPS = 3
_TENANT = [c.strip() for c in SCHEDULE_COLUMNS.split(",")].index("tenant")


def tenant_rows(
    tenant: str, count: int, *, anchor_ms: int, prefix: str
) -> Iterator[tuple[Any, ...]]:
    """`count` hourly schedules of `tenant`, each with one slot due at `anchor_ms`."""
    for row in interval_rows(count, every_ms=HOUR_MS, anchor_ms=anchor_ms, prefix=prefix):
        values = list(row)
        values[_TENANT] = tenant
        yield tuple(values)


def backlog(folder: Path, name: str, count: int, due_ms: int, *, others: bool) -> Path:
    """Tenant `a`'s `count` schedules due at `due_ms`; with `others`, ten tenants' ten each at
    `due_ms + 1`."""
    db = new_database(folder / f"{name}.db")
    bulk_insert(db, tenant_rows(NOISY, count, anchor_ms=due_ms, prefix="a"))
    if others:
        for tenant in OTHERS:
            rows = tenant_rows(tenant, OTHER_SCHEDULES, anchor_ms=due_ms + 1, prefix=tenant)
            bulk_insert(db, rows)
    return db


def expected_per_tenant(count: int, *, others: bool) -> dict[str, int]:
    return {NOISY: count, **(dict.fromkeys(OTHERS, OTHER_SCHEDULES) if others else {})}


@dataclass(frozen=True, slots=True)
class Drain:
    cap: int | None
    fires: int
    transactions: int
    seconds: float  # to the commit of the last dispatch transaction
    others_transactions: int  # transactions until the last of b..k's fires (0: none)
    others_seconds: float  # wall time until then
    others_in_first: int  # b..k's fires in the first transaction
    fair_seconds: float  # spent choosing the transaction's share per tenant (`_fair`)
    exact: bool

    @property
    def per_second(self) -> float:
        return self.fires / self.seconds


def drain(path: Path, now: int, cap: int | None, expected: dict[str, int]) -> Drain:
    """Step the real daemon until the backlog is dispatched; time each dispatch's commit."""
    fires = transactions = others_tx = others_first = 0
    others_left = sum(n for t, n in expected.items() if t != NOISY)
    started = last = others_at = 0.0

    def count(report: DispatchReport) -> None:
        nonlocal fires, transactions, others_tx, others_first, others_left, last, others_at
        if not report.dispatched:
            return
        last = time.perf_counter()  # on_dispatch runs after the commit
        fires += len(report.dispatched)
        transactions += 1
        theirs = sum(1 for fire in report.dispatched if fire.tenant != NOISY)
        if transactions == 1:
            others_first = theirs
        others_left -= theirs
        if theirs and others_left == 0:
            others_tx, others_at = transactions, last

    fair_seconds = 0.0
    choose = SqliteDispatcher._fair

    def timed_fair(*args: Any) -> Any:
        nonlocal fair_seconds
        begun = time.perf_counter()
        try:
            return choose(*args)
        finally:
            fair_seconds += time.perf_counter() - begun

    clock = ManualClock(now)
    engine = open_engine(path, clock=clock)
    engine.storage.audit.keys()  # the key file is made here, not inside the timed part
    config = DaemonConfig(node_id="bench-1", tenant_cap=cap)
    daemon = SchedulerDaemon(engine.storage, clock, config, on_dispatch=count)
    # Benchmark only: the same selection, timed (a few perf_counter calls per transaction).
    with mock.patch.object(SqliteDispatcher, "_fair", staticmethod(timed_fair)):
        try:
            daemon.step()  # takes the lease
            started = time.perf_counter()
            while True:
                before = fires
                daemon.step()
                if fires == before:
                    break
        finally:
            engine.close()
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = count_of(conn, "SELECT count(*) FROM runs")
        keys = count_of(conn, "SELECT count(DISTINCT slot_key) FROM runs")
        per_tenant = dict(conn.execute("SELECT tenant, count(*) FROM runs GROUP BY tenant"))
    finally:
        conn.close()
    total = sum(expected.values())
    exact = fires == rows == keys == total and per_tenant == expected
    return Drain(
        cap,
        fires,
        transactions,
        last - started,
        others_tx,
        others_at - started if others_tx else float("nan"),
        others_first,
        fair_seconds,
        exact,
    )


def with_and_without(
    folder: Path, template: Path, now: int, expected: dict[str, int]
) -> list[Drain]:
    """`REPS` rounds of one drain with the cap and one without, alternating which goes first."""
    results = []
    for rep in range(REPS):
        caps = (DEFAULT_TENANT_CAP, None) if rep % 2 == 0 else (None, DEFAULT_TENANT_CAP)
        for cap in caps:
            db = copy_database(template, folder / f"run-{rep}-{cap}.db")
            results.append(drain(db, now, cap, expected))
            for leftover in folder.glob(db.name + "*"):
                leftover.unlink()
    return results


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ranged(values: Sequence[float], scale: float = 1.0, digits: int = 0) -> str:
    """`median (min-max)` of `values` times `scale`."""
    scaled = [v * scale for v in values]
    low, high = min(scaled), max(scaled)
    return f"{num(median(scaled), digits)} ({low:,.{digits}f}-{high:,.{digits}f})"


def choosing(drains: Sequence[Drain]) -> str:
    """Milliseconds per transaction the cap spends choosing each tenant's share."""
    if not drains[0].cap:
        return "-"
    return num(median([1000 * d.fair_seconds / d.transactions for d in drains]), 2)


def label(cap: int | None) -> str:
    return f"cap {cap}" if cap else "no cap"


def exactly_once(drains: Sequence[Drain]) -> str:
    return "yes" if all(d.exact for d in drains) else "NO"


def noisy_rows(drains: Sequence[Drain]) -> list[list[str]]:
    table = []
    by_cap = {}
    for cap in (DEFAULT_TENANT_CAP, None):
        mine = [d for d in drains if d.cap == cap]
        by_cap[cap] = mine
        txs = sorted({d.others_transactions for d in mine})
        totals = sorted({d.transactions for d in mine})
        table.append(
            [
                label(cap),
                num(mine[0].fires),
                "/".join(num(t) for t in sorted({d.others_in_first for d in mine})),
                "/".join(num(t) for t in txs),
                ranged([d.others_seconds for d in mine], 1000, 1),
                "/".join(num(t) for t in totals),
                ranged([d.seconds for d in mine], 1, 2),
                ranged([d.per_second for d in mine]),
                choosing(mine),
                exactly_once(mine),
            ]
        )
    capped, free = by_cap[DEFAULT_TENANT_CAP], by_cap[None]

    def ratio(get: Any) -> str:
        return f"{median([get(d) for d in capped]) / median([get(d) for d in free]):.3f}x"

    table.append(
        [
            "cap / no cap",
            "",
            "",
            ratio(lambda d: d.others_transactions),
            ratio(lambda d: d.others_seconds),
            ratio(lambda d: d.transactions),
            ratio(lambda d: d.seconds),
            ratio(lambda d: d.per_second),
            "",
            "",
        ]
    )
    return table


def alone_rows(drains: Sequence[Drain]) -> list[list[str]]:
    table = []
    rates = {}
    for cap in (DEFAULT_TENANT_CAP, None):
        mine = [d for d in drains if d.cap == cap]
        rates[cap] = median([d.per_second for d in mine])
        table.append(
            [
                label(cap),
                num(mine[0].fires),
                "/".join(num(t) for t in sorted({d.transactions for d in mine})),
                ranged([d.seconds for d in mine], 1, 2),
                ranged([d.per_second for d in mine]),
                choosing(mine),
                exactly_once(mine),
            ]
        )
    ratio = rates[DEFAULT_TENANT_CAP] / rates[None]
    table.append(["cap / no cap", "", "", "", f"{ratio:.3f}x", "", ""])
    return table


def main() -> None:
    args = parse_args(__doc__ or "")
    quiet_logging()
    count = 10_000 if args.quick else 100_000
    cpu0, wall0, busy0 = time.process_time(), time.perf_counter(), machine_busy_s()
    with scratch_dir() as folder:
        now = now_ms()
        due = now - 500
        templates = folder / "templates"
        templates.mkdir()
        noisy_db = backlog(templates, "noisy", count, due, others=True)
        alone_db = backlog(templates, "alone", count, due, others=False)
        noisy = with_and_without(folder, noisy_db, now, expected_per_tenant(count, others=True))
        alone = with_and_without(folder, alone_db, now, expected_per_tenant(count, others=False))
    others = machine_busy_s() - busy0 - (time.process_time() - cpu0)
    others_share = others / ((time.perf_counter() - wall0) * cores())

    small = len(OTHERS) * OTHER_SCHEDULES
    print_table(
        f"Noisy neighbour: tenant {NOISY} has {count:,} schedules due at T, tenants "
        f"{OTHERS[0]}..{OTHERS[-1]} {OTHER_SCHEDULES} each ({small} in all) at T + 1 ms; one "
        f"node, SQLite WAL, batches of {DEFAULT_BATCH:,}; median of {REPS} runs (range), "
        "alternating which runs first; times from the first dispatch step to a transaction's "
        "commit",
        [
            "tenant cap",
            "fires",
            f"{OTHERS[0]}..{OTHERS[-1]} in 1st tx",
            f"tx until last of {OTHERS[0]}..{OTHERS[-1]}",
            f"ms until last of {OTHERS[0]}..{OTHERS[-1]}",
            "tx until all",
            "s until all",
            "fires/s",
            "ms/tx choosing shares",
            "exactly once",
        ],
        noisy_rows(noisy),
    )
    print_table(
        f"Alone: tenant {NOISY} alone with {count:,} schedules due; median of {REPS} runs "
        "(range), alternating which runs first",
        [
            "tenant cap",
            "fires",
            "transactions",
            "s until all",
            "fires/s",
            "ms/tx choosing shares",
            "exactly once",
        ],
        alone_rows(alone),
    )
    print(f"other processes used {100 * others_share:.0f}% of the {cores()} cores meanwhile")


if __name__ == "__main__":
    main()

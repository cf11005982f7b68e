"""Dispatch throughput for a backlog of 100,000 due slots on one node (`--quick`: 10,000).

Against the raw limit of the same machine, measured in the same run: single-row
`INSERT ... ON CONFLICT DO NOTHING` transactions per second (apsw, WAL, synchronous=NORMAL,
BEGIN IMMEDIATE, one row per transaction) on a scratch table. Target: at least 50% of that rate
per fire, which only batching many slots into each transaction can reach.

Two backlogs: one due slot on each of N schedules, and N/100 schedules each 100 slots behind
with misfire `each` (catching up; with the daemon's default lookahead each also has its next
slot, due within it, dispatched too). The daemon runs with its defaults on a frozen manual clock,
so nothing new falls due while the backlog drains; each `step()` is one real dispatch
transaction.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

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
    verdict,
)
from engine import (
    DaemonConfig,
    ManualClock,
    MisfireKind,
    MisfirePolicy,
    SchedulerDaemon,
    open_engine,
)
from engine.ports.dispatch import DispatchReport
from engine.runtime.daemon import DEFAULT_LOOKAHEAD_MS

HOUR_MS = 3_600_000


def raw_transactions_per_second(path: Path, count: int) -> float:
    """One claim-once row per transaction, keys shaped like slot keys."""
    conn = apsw.Connection(str(path))
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("CREATE TABLE claims (id INTEGER PRIMARY KEY, k TEXT NOT NULL UNIQUE)")
        keys = [f"{uuid.uuid4().hex}@2026-01-01T00:00:00+00:00" for _ in range(count)]
        started = time.perf_counter()
        for key in keys:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO claims (k) VALUES (?) ON CONFLICT DO NOTHING", (key,))
            conn.execute("COMMIT")
        return count / (time.perf_counter() - started)
    finally:
        conn.close()


@dataclass(frozen=True, slots=True)
class Drain:
    fires: int
    transactions: int
    seconds: float
    ledger_rows: int
    distinct_keys: int

    @property
    def per_second(self) -> float:
        return self.fires / self.seconds


def drain(path: Path, clock: ManualClock) -> Drain:
    """Step the real daemon until the backlog is dispatched; time the dispatching steps."""
    fires = transactions = 0

    def count(report: DispatchReport) -> None:
        nonlocal fires, transactions
        fires += len(report.dispatched)
        transactions += 1 if report.dispatched else 0

    engine = open_engine(path, clock=clock)
    daemon = SchedulerDaemon(
        engine.storage, clock, DaemonConfig(node_id="bench-1"), on_dispatch=count
    )
    daemon.step()  # takes the lease
    started = time.perf_counter()
    while True:
        before = fires
        daemon.step()
        if fires == before:
            break
    seconds = time.perf_counter() - started
    engine.close()
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    rows = count_of(conn, "SELECT count(*) FROM runs")
    keys = count_of(conn, "SELECT count(DISTINCT slot_key) FROM runs")
    conn.close()
    return Drain(fires, transactions, seconds, rows, keys)


def backlog_of_schedules(folder: Path, count: int, now: int) -> Path:
    """`count` hourly schedules, each with one slot due half a second ago."""
    db = new_database(folder / "schedules.db")
    bulk_insert(db, interval_rows(count, every_ms=HOUR_MS, anchor_ms=now - 500, prefix="s"))
    return db


def backlog_of_catch_up(folder: Path, count: int, now: int) -> Path:
    """`count / 100` schedules every second, 100 slots behind, misfire `each` with cap 100."""
    db = new_database(folder / "catchup.db")
    policy = MisfirePolicy(kind=MisfireKind.EACH, catch_up_cap=100)
    anchor = now - 99_500
    rows = interval_rows(count // 100, every_ms=1000, anchor_ms=anchor, prefix="c", misfire=policy)
    bulk_insert(db, rows)
    return db


def catch_up_fires(count: int) -> int:
    """The fires `backlog_of_catch_up(folder, count, now)` dispatches with the daemon's defaults:
    100 slots behind on each schedule, and its next one (due in half a second) within the
    default lookahead."""
    ahead = 1 if DEFAULT_LOOKAHEAD_MS >= 500 else 0
    return count // 100 * (100 + ahead)


def main() -> None:
    args = parse_args(__doc__ or "")
    quiet_logging()
    count = 10_000 if args.quick else 100_000
    cpu0, wall0, busy0 = time.process_time(), time.perf_counter(), machine_busy_s()
    with scratch_dir() as folder:
        raw = raw_transactions_per_second(folder / "raw.db", count)
        now = now_ms()
        ahead = catch_up_fires(count) - count
        results = [
            (
                f"{count:,} schedules, 1 due slot each",
                backlog_of_schedules(folder, count, now),
                count,
            ),
            (
                f"{count // 100:,} schedules x 100 missed slots (each)"
                + (" + 1 within the lookahead" if ahead else ""),
                backlog_of_catch_up(folder, count, now),
                catch_up_fires(count),
            ),
        ]
        drains = [(label, drain(db, ManualClock(now)), n) for label, db, n in results]
    others = machine_busy_s() - busy0 - (time.process_time() - cpu0)
    others_share = others / ((time.perf_counter() - wall0) * cores())

    table = [
        [
            "raw: 1-row INSERT ON CONFLICT DO NOTHING, 1 per tx",
            num(count),
            "-",
            num(raw, 0),
            "100%",
            "-",
        ]
    ]
    for label, d, expected in drains:
        exact = d.fires == expected and d.ledger_rows == d.distinct_keys == expected
        table.append(
            [
                f"Vortos dispatch: {label}",
                num(d.fires),
                num(d.transactions),
                num(d.per_second, 0),
                f"{100 * d.per_second / raw:.0f}%",
                "yes" if exact else "NO",
            ]
        )
    print_table(
        f"Dispatch throughput, backlog of {count:,} due slots, one node, SQLite WAL",
        ["what", "rows/fires", "transactions", "per second", "of raw tx/s", "exactly once"],
        table,
    )
    worst = min(d.per_second for _, d, _ in drains)
    print(f"target >= 50% of the raw transaction rate per fire: {verdict(worst >= 0.5 * raw)}")
    print(f"other processes used {100 * others_share:.0f}% of the {cores()} cores meanwhile")


if __name__ == "__main__":
    main()

"""Due-scan cost with 10k, 100k and 1M stored schedules, 100 of them due (`--quick`: 10k, 100k).

The other schedules are due a day from now. For each size a fresh daemon process opens the file
and takes the lease; it times the due-scan query alone and then twenty daemon steps, each
dispatching the 100 due slots of one second (a manual clock moves one second per step), and
reports its peak RSS: the scan reads through the index on the next fire instant, so both the
time and the memory must stay flat as the number stored grows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import apsw

from bench._common import (
    bulk_insert,
    current_rss_mib,
    interval_rows,
    new_database,
    now_ms,
    num,
    peak_rss_mib,
    print_table,
    quiet_logging,
    run_child,
    scratch_dir,
)
from engine import DaemonConfig, ManualClock, SchedulerDaemon, open_engine
from engine.ports.dispatch import DispatchReport

DUE = 100
TICKS = 20
SCANS = 200
DAY_MS = 86_400_000
# The daemon's due-scan query (engine/backends/sqlite/dispatch.py), with its batch limit.
DUE_SCAN = (
    "SELECT id, version, next_slot_at FROM schedules "
    "WHERE status = 'active' AND next_fire_at IS NOT NULL AND next_fire_at <= ? "
    "ORDER BY next_fire_at LIMIT 1000"
)


def build(folder: Path, size: int, now: int) -> tuple[Path, float]:
    db = new_database(folder / f"scan-{size}.db")
    started = time.perf_counter()
    bulk_insert(db, interval_rows(DUE, every_ms=1000, anchor_ms=now - 500, prefix="hot"))
    cold = interval_rows(size - DUE, every_ms=DAY_MS, anchor_ms=now + DAY_MS, prefix="cold")
    bulk_insert(db, cold)
    return db, time.perf_counter() - started


def time_scan(db: Path, now: int) -> tuple[float, int, str]:
    """Median microseconds of the due-scan query on its own connection, rows, query plan."""
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.execute("PRAGMA cache_size = -65536")
        plan = " / ".join(
            str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {DUE_SCAN}", (now,))
        )
        found = len(list(conn.execute(DUE_SCAN, (now,))))
        samples = []
        for _ in range(SCANS):
            started = time.perf_counter()
            list(conn.execute(DUE_SCAN, (now,)))
            samples.append(time.perf_counter() - started)
        return statistics.median(samples) * 1e6, found, plan
    finally:
        conn.close()


def daemon_side(db: Path, now: int) -> dict[str, Any]:
    """Runs in its own process: open, lead, scan, dispatch twenty ticks, report."""
    clock = ManualClock(now)
    fired: list[int] = []

    def count(report: DispatchReport) -> None:
        fired.append(len(report.dispatched))

    engine = open_engine(db, clock=clock)
    daemon = SchedulerDaemon(
        engine.storage, clock, DaemonConfig(node_id="bench-1"), on_dispatch=count
    )
    daemon.step()  # takes the lease
    scan_us, found, plan = time_scan(db, now)
    steps_ms = []
    for _ in range(TICKS):
        started = time.perf_counter()
        daemon.step()
        steps_ms.append(1000 * (time.perf_counter() - started))
        clock.advance(1.0)
    engine.close()
    return {
        "scan_us": scan_us,
        "found": found,
        "plan": plan,
        "first_step_ms": steps_ms[0],
        "step_ms": statistics.median(steps_ms[1:]),
        "fires": fired,
        "rss_now_mib": current_rss_mib(),
        "peak_rss_mib": peak_rss_mib(),
    }


def measure(size: int) -> dict[str, Any]:
    with scratch_dir() as folder:
        now = now_ms()
        db, build_s = build(folder, size, now)
        result = run_child(
            __file__,
            ["--db", str(db), "--now", str(now)],
            f"the daemon process for {size:,} schedules",
        )
        result["build_s"] = build_s
        result["file_mib"] = db.stat().st_size / 2**20
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10k and 100k only")
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--now", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet_logging()
    if args.db is not None:
        print(json.dumps(daemon_side(args.db, args.now)))
        return
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    rows: list[list[object]] = []
    plans = set()
    base: dict[str, Any] | None = None
    for size in sizes:
        r = measure(size)
        base = base or r
        plans.add(r["plan"])
        every_tick = all(n == DUE for n in r["fires"])
        rows.append(
            [
                num(size),
                num(r["file_mib"]),
                f"{num(r['scan_us'])} ({r['scan_us'] / base['scan_us']:.1f}x)",
                num(r["first_step_ms"], 2),
                f"{num(r['step_ms'], 2)} ({r['step_ms'] / base['step_ms']:.1f}x)",
                "yes" if every_tick else f"NO {r['fires']}",
                num(r["peak_rss_mib"]),
                num(r["rss_now_mib"]),
            ]
        )
    print_table(
        f"Due scan with {DUE} of N stored schedules due; a daemon process per size "
        "(ratios against the smallest size)",
        [
            "stored",
            "file MiB",
            "scan query us (median)",
            "first step ms",
            "step ms, 100 fires (median)",
            f"{DUE} fired each tick",
            "daemon peak RSS MiB",
            "RSS after ticks",
        ],
        rows,
    )
    for plan in sorted(plans):
        print(f"query plan: {plan}")


if __name__ == "__main__":
    main()

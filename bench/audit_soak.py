"""Does the database stop growing under a steady load once retention and audit archiving are on?

The real daemon and a real consumer (threads of this process) on a SQLite file, N interval
`noop` schedules, each firing once per real second: a constant N fires per second for the
whole run. Retention needs days to pass, so the engine's clock runs SPEED times faster than the
wall clock (1 day of the engine's time is 24 h / SPEED of ours) and the schedules' interval is
SPEED seconds of engine time, i.e. one real second: the write load per real second is what N
schedules every second give, only the instants stamped on rows move faster. Lease and claim
TTLs are raised so that they stay the same in real time. The built-in retention sweeper runs
hourly (engine time) with a 1-day window and `audit_archive_dir` set, so each sweep prunes the
runs and fires older than a day and archives and prunes the audit entries older than a day;
the anchors schedule appends signed heads hourly. The database file (+ -wal) is sampled every
real minute; after the first retention/archive cycle its size must stay within 10% of the
first sample after it.

N = 200 for 10 minutes (`--quick`: 2 minutes), SPEED = 720 (a day every 2 real minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from pathlib import Path

import apsw

from bench._common import (
    bulk_insert,
    count_of,
    interval_rows,
    new_database,
    print_table,
    quiet_logging,
    reanchor,
    scratch_dir,
    verdict,
)
from engine import MisfirePolicy, open_engine
from engine.commands.decorators import StaticSchedule
from engine.domain.triggers import CronTrigger
from engine.retention import RetentionSettings, retention_schedule
from engine.retention.audit_upkeep import anchor_schedule

MIB = 1024 * 1024
FLAT = 0.10


class ScaledClock:
    """The engine's time running `speed` times faster than the wall clock, from now."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def now_ms(self) -> int:
        return int((self._wall0 + (time.monotonic() - self._mono0) * self.speed) * 1000)

    def wait(self, wake: threading.Event, seconds: float) -> bool:
        return wake.wait(max(0.0, seconds) / self.speed)


def _sizes(db: Path) -> tuple[int, int]:
    wal = db.with_name(db.name + "-wal")
    return db.stat().st_size, wal.stat().st_size if wal.exists() else 0


def _counts(db: Path) -> tuple[int, int]:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return (
            count_of(conn, "SELECT count(*) FROM runs"),
            count_of(conn, "SELECT count(*) FROM audit_entries"),
        )
    finally:
        conn.close()


def _hourly_sweeper(settings: RetentionSettings) -> StaticSchedule:
    """The built-in sweeper, hourly instead of daily: a window of one day then holds between
    24 and 25 hours of history, not between 24 and 48."""
    static = retention_schedule(settings)
    spec = dataclasses.replace(static.spec, trigger=CronTrigger("17 * * * *"))
    return StaticSchedule(spec, static.source)


def soak(schedules: int, minutes: int, speed: float, folder: Path) -> bool:
    db = new_database(folder / "vortos.db")
    archive_dir = folder / "archive"
    every_ms = int(speed * 1000)  # one real second of the engine's time
    clock = ScaledClock(speed)
    start = clock.now_ms()
    # Misfire grace and catch-up age kept to their real-time meaning (a minute, a day).
    misfire = MisfirePolicy(grace_ms=int(60_000 * speed), max_age_ms=int(86_400_000 * speed))
    rows = interval_rows(schedules, every_ms=every_ms, anchor_ms=start, prefix="s", misfire=misfire)
    bulk_insert(db, rows)
    reanchor(db, every_ms=every_ms, first_ms=start + every_ms, spread_ms=every_ms)
    settings = RetentionSettings(days=1, audit_archive_dir=str(archive_dir), audit_archive_days=1)
    engine = open_engine(db, clock=clock)
    engine.service.sync_static(
        [_hourly_sweeper(settings), anchor_schedule()], actor="bench", complete=False
    )
    daemon = engine.daemon(node_id="soak", lease_ttl_ms=int(15_000 * speed))
    consumer = engine.consumer(
        consumer_id="soak", claim_ttl_ms=int(min(86_400_000, 60_000 * speed))
    )
    stop = threading.Event()

    def lead() -> None:
        # daemon.run() and consumer.run() wait real seconds for what the step says are the
        # clock's: stepped here, each wait is scaled to the clock.
        with engine.storage.serving():
            while not stop.is_set():
                stop.wait(min(daemon.step() / speed, 0.05))
        daemon.release()

    def consume() -> None:
        consumer.start()
        while not stop.is_set():
            stop.wait(min(consumer.step() / speed, 0.02))
        consumer.drain(10)
        consumer.close(10)

    threads = [
        threading.Thread(target=lead, name="daemon", daemon=True),
        threading.Thread(target=consume, name="consumer", daemon=True),
    ]
    for thread in threads:
        thread.start()
    table: list[list[object]] = []
    totals: list[tuple[int, bool]] = []  # (bytes, archived by then)
    began = time.monotonic()
    try:
        for minute in range(1, minutes + 1):
            time.sleep(max(0.0, began + 60 * minute - time.monotonic()))
            if not all(t.is_alive() for t in threads):
                raise RuntimeError("the daemon or the consumer died: see the traceback above")
            main, wal = _sizes(db)
            runs, entries = _counts(db)
            files = len(list(archive_dir.glob("*.jsonl"))) if archive_dir.exists() else 0
            archived = files > 0
            totals.append((main + wal, archived))
            day = (clock.now_ms() - start) / 86_400_000
            table.append(
                [
                    minute,
                    f"{day:.1f}",
                    f"{main / MIB:.1f}",
                    f"{wal / MIB:.1f}",
                    f"{(main + wal) / MIB:.1f}",
                    f"{runs:,}",
                    f"{entries:,}",
                    files,
                ]
            )
            print(f"minute {minute}: {table[-1]}", flush=True)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        engine.close()
    print_table(
        f"audit soak: {schedules} schedules firing every real second, engine clock x{speed:g}, "
        "retention 1 day swept hourly, audit archived past 1 day",
        [
            "MINUTE",
            "ENGINE DAY",
            "DB MiB",
            "WAL MiB",
            "TOTAL MiB",
            "RUNS",
            "AUDIT ROWS",
            "ARCHIVE FILES",
        ],
        table,
    )
    after = [size for size, archived in totals if archived]
    # The first sample after the first cycle is the baseline; the rest must stay within 10%.
    if len(after) < 3:
        print("too few samples after the first retention/archive cycle: run longer")
        return False
    base = after[1]  # the first full minute after the cycle began
    spread = max(abs(s - base) / base for s in after[1:])
    ok = spread <= FLAT
    print(
        f"after the first cycle: {base / MIB:.1f} MiB, largest departure {spread:.1%} "
        f"(limit {FLAT:.0%}): {verdict(ok)}"
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2 minutes instead of 10")
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--minutes", type=int, default=None)
    parser.add_argument("--speed", type=float, default=720.0)
    args = parser.parse_args()
    quiet_logging()
    minutes = args.minutes or (2 if args.quick else 10)
    with scratch_dir() as folder:
        soak(args.schedules, minutes, args.speed, folder)


if __name__ == "__main__":
    main()

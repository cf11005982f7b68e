"""End-to-end latency: from a slot's instant to its command starting, at 100 fires per second.

100 interval schedules every 1 s run a command that records the wall clock when it starts and
its fire's `slot_at` (from its FireContext). A child process does what `vortos run` does: the
daemon dispatches and pokes the consumer after each dispatch, and the consumer, with
`--consumers` worker threads (4, the default, and 16), claims, runs and settles; system clock,
one SQLite file. Twice: every schedule on one
anchor (each second 100 slots fall due at the same instant) and anchors spread evenly over the
second. 20 s of slots (`--quick`: 6 s), after a lead in which the daemon takes its lease.

Besides the command's own start, the run ledger says where the time went: `dispatched_at` (the
dispatch transaction's start) and `started_at` (the claim transaction's start), each minus the
slot instant.

If APScheduler 3.11 is installed (benchmark-only: `pip install 'apscheduler>=3.11,<4'
sqlalchemy`), the same 100 jobs run in a BackgroundScheduler with SQLAlchemyJobStore on SQLite
(WAL, synchronous=NORMAL) and its default executor (10 threads), beside Vortos: the job records
the wall clock when it starts, minus the run time it was scheduled for.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apsw

from bench._common import (
    apscheduler_on_sqlite,
    cores,
    machine_busy_s,
    now_ms,
    num,
    peak_rss_mib,
    percentile,
    print_table,
    quiet_logging,
    run_child,
    scratch_dir,
)
from engine import FireContext, IntervalTrigger, ScheduleSpec, builtin_commands, open_engine
from engine.ports.dispatch import DispatchReport

SCHEDULES = 100
LEAD_MS = 2_000  # from the end of setup to the first measured slot
DRAIN_S = 5.0  # after the window, how long the last slots may take to start
CONSUMERS = (4, 16)  # `vortos run --consumers`: 4 is the default
COMMAND = "bench-record"

# (schedule id, slot instant, wall clock in ms when the command started), from worker threads.
_STARTED: list[tuple[str, int, float]] = []


def record(fire: FireContext) -> None:
    """The command: note when it started, for which slot."""
    _STARTED.append((fire.schedule_id, fire.slot_at, time.time_ns() / 1e6))


def _spread(values: list[float]) -> list[float]:
    """p50, p90, p99, max (NaN when empty)."""
    top = max(values) if values else math.nan
    return [percentile(values, 50), percentile(values, 90), percentile(values, 99), top]


def _anchor(i: int, first: int, spread: bool) -> int:
    return first + (i * 1000 // SCHEDULES if spread else 0)


def vortos_side(seconds: int, spread: bool, consumers: int) -> dict[str, Any]:
    """`vortos run` in this process: the daemon and a consumer, each on its own thread."""
    commands = builtin_commands()
    commands.register(COMMAND, record, "records when it started")
    with scratch_dir() as folder:
        db = folder / "e2e.db"
        engine = open_engine(db, commands=commands)
        first = (now_ms() + LEAD_MS) // 1000 * 1000 + 1000
        last = first + seconds * 1000 - 1  # `seconds` slots of every schedule
        for i in range(SCHEDULES):
            trigger = IntervalTrigger(every_ms=1000, anchor_ms=_anchor(i, first, spread))
            spec = ScheduleSpec(name=f"e2e-{i:03d}", trigger=trigger, command=COMMAND)
            engine.service.create(spec, actor="bench")
        if now_ms() >= first - 500:
            raise RuntimeError("creating the schedules took longer than the lead time")
        consumer = engine.consumer(consumer_id="bench-e2e", concurrency=consumers)

        def dispatched(report: DispatchReport) -> None:
            if report.dispatched:
                consumer.poke()  # as `vortos run` does: run the new fires now

        daemon = engine.daemon(node_id="bench-e2e", on_dispatch=dispatched)
        threads = [
            threading.Thread(target=consumer.run, name="vortos-consumer"),
            threading.Thread(target=daemon.run, name="vortos-daemon"),
        ]
        for thread in threads:
            thread.start()
        time.sleep(max(0.0, first / 1000 - time.time()))
        cpu0, wall0, busy0 = time.process_time(), time.time(), machine_busy_s()
        expected = SCHEDULES * seconds

        def in_window() -> int:
            return sum(1 for _, slot, _ in list(_STARTED) if first <= slot <= last)

        end, give_up = (last + 1) / 1000, (last + 1) / 1000 + DRAIN_S
        while time.time() < give_up and (time.time() < end or in_window() < expected):
            time.sleep(0.02)
        if not all(thread.is_alive() for thread in threads):
            raise RuntimeError("the daemon or consumer thread died: see its traceback above")
        cpu_s, wall_s = time.process_time() - cpu0, time.time() - wall0
        others = machine_busy_s() - busy0 - cpu_s
        daemon.stop()
        consumer.stop()
        for thread in threads:
            thread.join(timeout=60)
        engine.close()
        ledger = _ledger(db, first, last)
    started = [(sid, slot, at) for sid, slot, at in _STARTED if first <= slot <= last]
    ran = {(sid, slot) for sid, slot, _ in started}
    return {
        "expected": expected,
        "ran": len(ran),
        "duplicates": len(started) - len(ran),
        "missed": expected - len(ran),
        "start": _spread([at - slot for _, slot, at in started]),
        **ledger,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "others": others / max(1e-9, wall_s * cores()),
        "peak_rss_mib": peak_rss_mib(),
    }


def _ledger(db: Path, first: int, last: int) -> dict[str, list[float]]:
    """Dispatch and claim instants of the window's runs, minus their slot instant."""
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        found = list(
            conn.execute(
                "SELECT dispatched_at - slot_at, started_at - slot_at FROM runs "
                "WHERE slot_at BETWEEN ? AND ?",
                (first, last),
            )
        )
    finally:
        conn.close()
    return {
        "dispatched": _spread([float(r[0]) for r in found]),
        "claimed": _spread([float(r[1]) for r in found if r[1] is not None]),
    }


def aps_record(i: int) -> None:
    """The APScheduler job: note when job `i` started."""
    _STARTED.append((f"j{i}", 0, time.time_ns() / 1e6))


def apscheduler_side(seconds: int, spread: bool) -> dict[str, Any]:
    """The same jobs in APScheduler 3.11: BackgroundScheduler, SQLAlchemyJobStore on SQLite."""
    from apscheduler.triggers.interval import IntervalTrigger as ApsInterval  # noqa: PLC0415

    with scratch_dir() as folder:
        scheduler, store = apscheduler_on_sqlite(folder)
        scheduler.start(paused=True)
        first = (now_ms() + LEAD_MS) // 1000 * 1000 + 1000
        last = first + seconds * 1000 - 1
        for i in range(SCHEDULES):
            start = datetime.fromtimestamp(_anchor(i, first, spread) / 1000, UTC)
            trigger = ApsInterval(seconds=1, start_date=start, timezone=UTC)
            scheduler.add_job(aps_record, trigger, args=(i,), id=f"j{i}")
        if now_ms() >= first - 500:
            raise RuntimeError("adding the APScheduler jobs took longer than the lead time")
        scheduler.resume()
        time.sleep(max(0.0, first / 1000 - time.time()))
        cpu0, wall0, busy0 = time.process_time(), time.time(), machine_busy_s()
        expected = SCHEDULES * seconds
        end, give_up = (last + 1) / 1000, (last + 1) / 1000 + DRAIN_S

        def slots() -> list[tuple[str, int, float]]:
            # A job's slot: the latest instant of its series at or before its start.
            found = []
            for jid, _, at in list(_STARTED):
                anchor = _anchor(int(jid[1:]), first, spread)
                found.append((jid, anchor + int(at - anchor) // 1000 * 1000, at))
            return [s for s in found if first <= s[1] <= last]

        while time.time() < give_up and (time.time() < end or len(slots()) < expected):
            time.sleep(0.02)
        cpu_s, wall_s = time.process_time() - cpu0, time.time() - wall0
        others = machine_busy_s() - busy0 - cpu_s
        scheduler.shutdown(wait=True)
        store.dispose()
    started = slots()
    ran = {(jid, slot) for jid, slot, _ in started}
    nan = [math.nan] * 4
    return {
        "expected": expected,
        "ran": len(ran),
        "duplicates": len(started) - len(ran),
        "missed": expected - len(ran),
        "start": _spread([at - slot for _, slot, at in started]),
        "dispatched": nan,
        "claimed": nan,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "others": others / max(1e-9, wall_s * cores()),
        "peak_rss_mib": peak_rss_mib(),
    }


def run_side(side: str, seconds: int, spread: bool, consumers: int) -> dict[str, Any]:
    """One side in a fresh interpreter; its last stdout line is the JSON result."""
    args = ["--side", side, "--seconds", str(seconds), "--consumers", str(consumers)]
    return run_child(__file__, [*args, *(["--spread"] if spread else [])], f"the {side} side")


def report(seconds: int, spread: bool, columns: list[tuple[str, dict[str, Any]]]) -> None:
    rows: list[list[object]] = []

    def line(label: str, key: str, index: int | None = None, digits: int = 1) -> None:
        values = [r[key] if index is None else r[key][index] for _, r in columns]
        rows.append([label, *(num(v, digits) for v in values)])

    for label, key in (
        ("fires expected", "expected"),
        ("fires run (distinct schedule+slot)", "ran"),
        ("duplicates", "duplicates"),
        ("missed", "missed"),
    ):
        line(label, key, digits=0)
    for stage, key in (
        ("command started", "start"),
        ("claimed (claim tx start)", "claimed"),
        ("dispatched (dispatch tx start)", "dispatched"),
    ):
        for i, name in enumerate(("p50", "p90", "p99", "max")):
            line(f"{stage} - slot, {name} (ms)", key, i)
    line("CPU seconds (whole process)", "cpu_s", digits=2)
    rows.append(
        [
            "CPU share of one core",
            *(f"{100 * r['cpu_s'] / max(1e-9, r['wall_s']):.0f}%" for _, r in columns),
        ]
    )
    line("peak RSS (MiB)", "peak_rss_mib")
    rows.append(
        [
            f"other processes' CPU, share of {cores()} cores",
            *(f"{100 * r['others']:.0f}%" for _, r in columns),
        ]
    )
    anchors = "anchors spread evenly over the second" if spread else "all on one anchor"
    print_table(
        f"End-to-end latency, slot instant to command start: {SCHEDULES} schedules every 1 s "
        f"({SCHEDULES} fires/s) for {seconds} s, one process each, SQLite WAL; {anchors}",
        ["measure", *(label for label, _ in columns)],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="6 s instead of 20 s")
    parser.add_argument("--side", choices=["vortos", "apscheduler"], help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spread", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--consumers", type=int, default=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    seconds = args.seconds or (6 if args.quick else 20)
    quiet_logging()
    if args.side == "vortos":
        print(json.dumps(vortos_side(seconds, args.spread, args.consumers)))
        return
    if args.side == "apscheduler":
        print(json.dumps(apscheduler_side(seconds, args.spread)))
        return
    have_aps = all(importlib.util.find_spec(m) for m in ("apscheduler", "sqlalchemy"))
    for spread in (False, True):
        columns = [
            (f"Vortos, {n} consumer threads", run_side("vortos", seconds, spread, n))
            for n in CONSUMERS
        ]
        if have_aps:
            columns.append(("APScheduler 3.11", run_side("apscheduler", seconds, spread, 10)))
        report(seconds, spread, columns)
    print(
        "Vortos: the command's start is its worker thread's wall clock; the ledger's stages are "
        "the transactions' own `now`, taken when each began."
    )
    if not have_aps:
        print(
            "APScheduler column skipped: it is a benchmark-only dependency. Install it with\n"
            "  pip install 'apscheduler>=3.11,<4' sqlalchemy"
        )


if __name__ == "__main__":
    main()

"""Vortos and APScheduler 3.11 side by side: the same 1,000 interval jobs every 1 s for 30 s.

Each side runs in its own subprocess (so peak RSS is its own), one after the other, on a SQLite
file in WAL mode with synchronous=NORMAL. Every job has the same start instant, so each second
1,000 slots fall due together. Lateness is, for Vortos, the wall clock after the dispatch commit
returned minus the slot instant; for APScheduler, the wall clock when its scheduler thread reports
the job submitted to the executor (after it updated the job store) minus the scheduled run time,
and, as a second figure, when the job has run. `--quick`: 8 s.

APScheduler and SQLAlchemy are benchmark-only: `pip install 'apscheduler>=3.11,<4' sqlalchemy`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import threading
import time
from datetime import UTC, datetime
from typing import Any

from bench._common import (
    Spread,
    apscheduler_on_sqlite,
    cores,
    machine_busy_s,
    now_ms,
    num,
    peak_rss_mib,
    print_table,
    quiet_logging,
    run_child,
    scratch_dir,
)
from bench._sustained import run_sustained

JOBS = 1_000
LEAD_S = 2 + JOBS // 500  # time to add the jobs before the first slot
DRAIN_S = 3  # past its 1 s misfire grace APScheduler drops a run anyway


def noop() -> None:
    """The job APScheduler runs (referenced by name from its job store)."""


def vortos_side(jobs: int, seconds: int) -> dict[str, Any]:
    r = run_sustained(jobs, seconds, spread=False)
    return {
        "others": r.others_cpu_s / (r.wall_s * cores()),
        "expected": r.expected,
        "done": r.dispatched,
        "duplicates": r.duplicate_pairs + r.duplicate_keys,
        "missed": r.missed,
        "dispatch": [r.commit_lateness.p50, r.commit_lateness.p99, r.commit_lateness.max],
        "ran": None,
        "cpu_s": r.cpu_s,
        "wall_s": r.wall_s,
        "peak_rss_mib": r.peak_rss_mib,
    }


def apscheduler_side(jobs: int, seconds: int) -> dict[str, Any]:
    from apscheduler.events import (  # noqa: PLC0415 (benchmark-only dependency)
        EVENT_JOB_EXECUTED,
        EVENT_JOB_MAX_INSTANCES,
        EVENT_JOB_MISSED,
        EVENT_JOB_SUBMITTED,
    )
    from apscheduler.triggers.interval import IntervalTrigger  # noqa: PLC0415

    first_ms = (now_ms() // 1000 + LEAD_S) * 1000
    last_ms = first_ms + seconds * 1000 - 1
    submitted: list[float] = []
    ran: list[float] = []
    runs: dict[tuple[str, float], int] = {}
    lost = {"missed": 0, "max_instances": 0}
    lock = threading.Lock()

    def listen(ev: Any) -> None:
        now = time.time()
        multi = ev.code in (EVENT_JOB_SUBMITTED, EVENT_JOB_MAX_INSTANCES)
        instants = [
            t.timestamp()
            for t in (ev.scheduled_run_times if multi else [ev.scheduled_run_time])
            if first_ms <= t.timestamp() * 1000 <= last_ms
        ]
        with lock:
            for t in instants:
                if ev.code == EVENT_JOB_SUBMITTED:
                    submitted.append(1000 * (now - t))
                elif ev.code == EVENT_JOB_EXECUTED:
                    ran.append(1000 * (now - t))
                    runs[ev.job_id, t] = runs.get((ev.job_id, t), 0) + 1
                elif ev.code == EVENT_JOB_MISSED:
                    lost["missed"] += 1
                else:
                    lost["max_instances"] += 1

    with scratch_dir() as folder:
        scheduler, store = apscheduler_on_sqlite(folder)
        scheduler.add_listener(
            listen,
            EVENT_JOB_SUBMITTED | EVENT_JOB_EXECUTED | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES,
        )
        scheduler.start(paused=True)
        start = datetime.fromtimestamp(first_ms / 1000, UTC)
        for i in range(jobs):
            scheduler.add_job(
                noop, IntervalTrigger(seconds=1, start_date=start, timezone=UTC), id=f"j{i}"
            )
        if now_ms() >= first_ms:
            raise RuntimeError("adding the APScheduler jobs took longer than the lead time")
        scheduler.resume()
        time.sleep(max(0.0, first_ms / 1000 - time.time()))
        cpu0, wall0, busy0 = time.process_time(), time.time(), machine_busy_s()
        expected = jobs * seconds
        end, give_up = (last_ms + 1) / 1000, (last_ms + 1) / 1000 + DRAIN_S
        while time.time() < give_up and (time.time() < end or len(runs) < expected):
            time.sleep(0.02)
        cpu_s, wall_s = time.process_time() - cpu0, time.time() - wall0
        others = machine_busy_s() - busy0 - cpu_s
        scheduler.shutdown(wait=True)
        store.dispose()
    dispatch, done = Spread.of(submitted), Spread.of(ran)
    return {
        "others": others / (wall_s * cores()),
        "expected": expected,
        "done": len(runs),
        "duplicates": sum(n - 1 for n in runs.values()),
        "missed": expected - len(runs),
        "missed_events": lost["missed"],
        "dispatch": [dispatch.p50, dispatch.p99, dispatch.max],
        "ran": [done.p50, done.p99, done.max],
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_side(side: str, seconds: int) -> dict[str, Any]:
    """Run one side in a fresh interpreter; its last stdout line is the JSON result."""
    return run_child(__file__, ["--side", side, "--seconds", str(seconds)], f"the {side} side")


def ratio(vortos: float | None, aps: float | None) -> str:
    if vortos is None or aps is None or math.isnan(vortos) or math.isnan(aps) or vortos <= 0:
        return "-"
    return f"{aps / vortos:.1f}x"


def report(seconds: int, vortos: dict[str, Any], aps: dict[str, Any] | None) -> None:
    def cell(side: dict[str, Any] | None, key: str, index: int | None = None) -> Any:
        if side is None or side.get(key) is None:
            return None
        return side[key] if index is None else side[key][index]

    rows: list[list[object]] = []
    measures: list[tuple[str, str, int | None, int]] = [
        ("fires expected", "expected", None, 0),
        ("fires done (distinct job+slot)", "done", None, 0),
        ("duplicates", "duplicates", None, 0),
        ("missed", "missed", None, 0),
        ("lateness p50, dispatched (ms)", "dispatch", 0, 1),
        ("lateness p99, dispatched (ms)", "dispatch", 1, 1),
        ("lateness max, dispatched (ms)", "dispatch", 2, 1),
        ("lateness p50, job ran (ms)", "ran", 0, 1),
        ("lateness p99, job ran (ms)", "ran", 1, 1),
        ("wall seconds measured", "wall_s", None, 2),
        ("CPU seconds (whole process)", "cpu_s", None, 2),
        ("peak RSS (MiB)", "peak_rss_mib", None, 1),
        (f"other processes' CPU, share of {cores()} cores", "others", None, 0),
    ]
    for label, key, index, digits in measures:
        v, a = cell(vortos, key, index), cell(aps, key, index)
        if key == "others":
            rows.append([label, *("-" if x is None else f"{100 * x:.0f}%" for x in (v, a)), "-"])
            continue
        show = [("-" if x is None else num(x, digits)) for x in (v, a)]
        rows.append([label, *show, ratio(v, a) if digits else "-"])
    print_table(
        f"{JOBS:,} interval jobs every 1 s for {seconds} s, one process each, SQLite WAL "
        "(all jobs share one start instant)",
        ["measure", "Vortos", "APScheduler 3.11", "APScheduler / Vortos"],
        rows,
    )
    if aps is not None:
        print(
            "APScheduler job defaults: misfire_grace_time 1 s, coalesce on, max_instances 1; "
            f"{aps['missed_events']:,} runs reported missed by its executor (runs it coalesced "
            "away are not reported at all). "
            "Its 'dispatched' is reported only after the scheduler thread has handed out every due "
            "job and updated the store, so a job can run before its submission is reported. "
            "The Vortos side runs the daemon alone, without consumers: its 'done' is dispatched "
            "(bench/e2e_latency.py measures up to the command's start)."
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="8 s instead of 30 s")
    parser.add_argument("--side", choices=["vortos", "apscheduler"], help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    seconds = args.seconds or (8 if args.quick else 30)
    quiet_logging()
    if args.side == "vortos":
        print(json.dumps(vortos_side(JOBS, seconds)))
        return
    if args.side == "apscheduler":
        print(json.dumps(apscheduler_side(JOBS, seconds)))
        return
    have_aps = all(importlib.util.find_spec(m) for m in ("apscheduler", "sqlalchemy"))
    vortos = run_side("vortos", seconds)
    aps = run_side("apscheduler", seconds) if have_aps else None
    report(seconds, vortos, aps)
    if not have_aps:
        print(
            "APScheduler column skipped: it is a benchmark-only dependency. Install it with\n"
            "  pip install 'apscheduler>=3.11,<4' sqlalchemy"
        )


if __name__ == "__main__":
    main()

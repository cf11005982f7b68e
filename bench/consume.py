"""Consume throughput: a backlog of no-op fires run by 1, 2 and 4 consumer processes on one
SQLite file, beside huey's SqliteHuey doing the same no-op work with the same process counts.

Vortos, two backlogs of N fires of the built-in `noop` command:
- backfill: one schedule every 1 s, overlap `allow` (its fires may run side by side, as queue
  tasks do), N past slots written by `engine.service.backfill`;
- dispatched: N schedules with one due slot each (overlap `skip`, the default), dispatched by
  the real daemon, as a burst of due slots leaves it.
Each consumer process runs the real FireQueueConsumer in its default configuration
(`engine.consumer().run()`, what `vortos run` and `vortos consume` run with no flags: claim,
run the command on a worker thread, settle; its default worker threads, prefetch and group
commit): that is the headline, and the ratio to huey. Without `--quick`, the same with K = 1
and 16 worker threads per process (`--consumers K`) beside it.

huey 3.x: N tasks of a no-op function in a SqliteHuey queue (WAL, synchronous=NORMAL, as
Vortos), each consumer process a tight loop of `huey.dequeue()` + `huey.execute(task)`: its
normal execution path, without the Consumer's sleeps between empty polls (huey's Consumer with
worker_type='thread' and workers=1 makes the same two calls per task). huey deletes a task when
it dequeues it (at most once); Vortos claims a fire and settles it after the command ran.

Every process is started and opened first; then all are told to go at once. The parent polls
the store (open fires, queued tasks) until the backlog is done; the wall time runs from the go
to the last fire completed (Vortos: its settle transaction committed) or task executed (huey).
A run whose backlog stops shrinking for 20 s is reported stuck; one slower than 60 s (`--quick`:
20 s) is cut and rated on what it did. N = 20,000 (`--quick`: 3,000). huey is benchmark-only:
`pip install huey`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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
    print_table,
    quiet_logging,
    scratch_dir,
)
from engine import (
    DaemonConfig,
    IntervalTrigger,
    ManualClock,
    OverlapPolicy,
    SchedulerDaemon,
    ScheduleSpec,
    open_engine,
)
from engine.ports.fire_queue import Claim, Outcome, Settlement, SettleReport
from engine.runtime.consumer import DEFAULT_CONCURRENCY
from engine.runtime.daemon import DEFAULT_BATCH

PROCESSES = (1, 2, 4)
DEFAULT = 0  # the consumer's default worker threads (DEFAULT_CONCURRENCY)
THREADS = (DEFAULT, 1, 16)  # Vortos worker threads per consumer process (`--consumers`)
QUICK_THREADS = (DEFAULT,)
# The fire queue's calls that are one write transaction each (whichever this engine has).
WRITES = ("claim", "settle", "settle_and_claim", "heartbeat", "enqueue")
POLL_S = 0.005  # how often the parent looks at the store while the backlog drains
STALL_S = 20.0  # a backlog that has not shrunk for this long is stuck: the run is over
MAX_RUN_S = 60.0  # a slower run is cut here and rated on what it did (`--quick`: 20 s)
SCHEDULE = "bench-consume"
HUEY_INSTALL = "pip install huey"
HOUR_MS = 3_600_000
# How the Vortos backlog is made.
SHAPES = {
    "backfill": "one schedule's backfill (overlap allow)",
    "dispatched": "one due slot on each of N schedules, dispatched by the daemon (overlap skip)",
}


# -- the two stores ---------------------------------------------------------------------------


def vortos_backfill(db: Path, count: int) -> None:
    """`count` backfill fires of one schedule every 1 s, overlap allow (one enqueue transaction
    per 10,000)."""
    with open_engine(new_database(db)) as engine:
        engine.service.create(
            ScheduleSpec(
                name=SCHEDULE,
                trigger=IntervalTrigger(every_ms=1000, anchor_ms=0),
                command="noop",
                overlap=OverlapPolicy.ALLOW,
            ),
            actor="bench",
        )
        end = engine.clock.now_ms() // 1000 * 1000 - 1000
        report = engine.service.backfill(
            SCHEDULE, start_ms=end - count * 1000, end_ms=end, actor="bench", confirmed=True
        )
        if report.dispatched != count:
            raise RuntimeError(f"backfill wrote {report.dispatched} fires, not {count}")


def vortos_dispatched(db: Path, count: int) -> None:
    """`count` schedules (hourly, overlap skip) with one due slot each, dispatched by the real
    daemon on a frozen clock: one scheduled fire per schedule, as a burst of due slots leaves."""
    now = now_ms()
    bulk_insert(
        new_database(db),
        interval_rows(count, every_ms=HOUR_MS, anchor_ms=now - 500, prefix="s"),
    )
    clock = ManualClock(now)
    with open_engine(db, clock=clock) as engine:
        daemon = SchedulerDaemon(engine.storage, clock, DaemonConfig(node_id="bench-dispatch"))
        for _ in range(10 + count // DEFAULT_BATCH):
            daemon.step()  # the first takes the lease; each later one is a dispatch transaction
            if vortos_open(db) >= count:
                break
    if vortos_open(db) != count:
        raise RuntimeError(f"the daemon dispatched {vortos_open(db)} fires, not {count}")


def _reader(path: Path) -> apsw.Connection:
    """A read-only connection that waits out a consumer's last close (its checkpoint)."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    conn.set_busy_timeout(5_000)
    return conn


def vortos_open(db: Path) -> int:
    conn = _reader(db)
    try:
        return count_of(
            conn,
            "SELECT count(*) FROM fire_queue WHERE completed_at IS NULL AND discarded_at IS NULL",
        )
    finally:
        conn.close()


def vortos_check(db: Path) -> dict[str, int]:
    """What the ledger says after the run: completed runs, and attempts beyond one each."""
    conn = _reader(db)
    try:
        completed = count_of(conn, "SELECT count(*) FROM runs WHERE state = 'completed'")
        extra = count_of(conn, "SELECT coalesce(sum(max(attempts - 1, 0)), 0) FROM runs")
        return {"completed": completed, "extra_attempts": extra}
    finally:
        conn.close()


def huey_app(path: Path) -> tuple[Any, Any]:
    """A SqliteHuey on `path` (WAL, synchronous=NORMAL) and its no-op task."""
    # No stubs, and not installed everywhere mypy runs: either way is ignored.
    from huey import (  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: PLC0415
        SqliteHuey,
    )

    huey = SqliteHuey("bench", filename=str(path))
    huey.storage.conn.execute("PRAGMA synchronous = NORMAL")  # huey keeps this one connection

    def nothing() -> None:
        """The no-op task."""

    nothing.__module__ = "bench"  # huey names tasks module.name: the same in every process
    return huey, huey.task(name="noop")(nothing)


def huey_prefill(path: Path, count: int) -> None:
    """`count` serialized no-op tasks, inserted in one transaction (`enqueue` is one each)."""
    huey, task = huey_app(path)
    rows = [(huey.name, huey.serialize_task(task.s()), 0) for _ in range(count)]
    with huey.storage.db(commit=True) as cursor:
        cursor.executemany("INSERT INTO task (queue, data, priority) VALUES (?, ?, ?)", rows)
    huey.storage.close()


def huey_queued(path: Path) -> int:
    conn = _reader(path)
    try:
        return count_of(conn, "SELECT count(*) FROM task")
    finally:
        conn.close()


# -- consumer processes -----------------------------------------------------------------------


def _handshake() -> None:
    """Tell the parent this process is ready, then wait for its go."""
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go from the parent")


def _counted(method: Any, counts: dict[str, int]) -> Any:
    """`method` of the fire queue, counting its transactions and the claims that took no fire
    (counting only, on this process's instance)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        counts["transactions"] += 1
        claim = result[-1] if isinstance(result, tuple) else result  # settle_and_claim: a pair
        asked = kwargs.get("limit", 1) > 0  # a settle alone asks for no fire
        if isinstance(claim, Claim) and asked and not claim.fires:
            counts["empty_claims"] += 1
        return result

    return call


def vortos_worker(db: Path, threads: int, name: str) -> dict[str, Any]:
    """One consumer process: the real FireQueueConsumer until the parent says stop."""
    engine = open_engine(db)
    counts = {"transactions": 0, "empty_claims": 0, "settled": 0}
    last_done = [math.nan]
    queue = engine.storage.fire_queue
    for write in WRITES:
        if hasattr(queue, write):  # each call is one write transaction
            setattr(queue, write, _counted(getattr(queue, write), counts))

    def settled(settlements: list[Settlement], report: SettleReport) -> None:
        acked = set(report.acked)
        done = sum(1 for s in settlements if s.run_id in acked and s.outcome is Outcome.COMPLETE)
        if done:
            counts["settled"] += done
            last_done[0] = time.time()

    consumer = engine.consumer(
        consumer_id=name,
        concurrency=DEFAULT_CONCURRENCY if threads == DEFAULT else threads,
        grace_ms=5_000,
        on_settle=settled,
    )
    consumer.start()  # the worker threads exist before the go
    _handshake()
    cpu0 = time.process_time()

    def run() -> None:
        try:
            consumer.run()
        except BaseException:
            traceback.print_exc()
            os._exit(1)  # the parent sees this process gone

    loop = threading.Thread(target=run, name="vortos-consumer")
    loop.start()
    sys.stdin.readline()  # the parent's stop, once the backlog is done
    consumer.stop()
    loop.join()
    cpu = time.process_time() - cpu0
    engine.close()
    return {**counts, "last_done": last_done[0], "cpu_s": cpu}


def huey_worker(path: Path) -> dict[str, Any]:
    """One huey consumer process: dequeue + execute until the queue is empty."""
    huey, _task = huey_app(path)
    _handshake()
    cpu0 = time.process_time()
    executed, last_done = 0, math.nan
    while True:
        task = huey.dequeue()
        if task is None:
            break
        huey.execute(task)
        executed += 1
        last_done = time.time()
    return {"executed": executed, "last_done": last_done, "cpu_s": time.process_time() - cpu0}


@dataclass(frozen=True, slots=True)
class Result:
    side: str  # "vortos" or "huey"
    processes: int
    threads: int
    fires: int
    done: int  # settled (Vortos) or executed (huey), summed over the processes
    seconds: float
    cpu_s: float  # all consumer processes together
    others_share: float  # the rest of the machine's CPU (the parent's polling included)
    transactions: int  # Vortos: claim + settle transactions (including empty claims)
    empty_claims: int
    exact: bool
    left: int  # fires or tasks not done when the run ended
    ended: str  # "" (all done), "stuck" (the backlog stopped shrinking) or "cut" (MAX_RUN_S)
    again: int  # Vortos: attempts beyond the first (a fire whose command ran more than once)
    logged: tuple[str, ...]  # the consumers' warnings and errors, each distinct line once

    @property
    def per_second(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else math.nan


def run_consumers(
    side: str, store: Path, processes: int, threads: int, fires: int, folder: Path, cut_s: float
) -> Result:
    """Start `processes` consumer processes on the filled `store`, let them go together, poll
    the store until the backlog is done, and gather what each one reports."""
    script = str(Path(__file__).resolve())
    children = []
    for i in range(processes):
        err = (folder / f"{side}-{processes}-{threads}-{i}.err").open("w")
        command = [sys.executable, script, "--worker", side, "--store", str(store)]
        command += ["--threads", str(threads), "--name", f"consumer-{i}"]
        child = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
        )
        children.append((child, err))
    for child, _ in children:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a {side} consumer did not start: see {folder}")
    remaining = vortos_open if side == "vortos" else huey_queued
    busy0, started = machine_busy_s(), time.time()
    for child, _ in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    left, seen, progress_at, ended = remaining(store), -1, started, ""
    while left > 0:
        if left != seen:
            seen, progress_at = left, time.time()
        elif time.time() - progress_at > STALL_S:
            ended = "stuck"
            break
        if time.time() - started > cut_s:
            ended = "cut"
            break
        for child, err in children:
            if child.poll() not in (None, 0):  # (a huey consumer ends at 0 on an empty queue)
                err.flush()
                sys.stderr.write(Path(err.name).read_text())
                raise RuntimeError(f"a {side} consumer failed (exit {child.returncode})")
        time.sleep(POLL_S)
        left = remaining(store)
    reports: list[dict[str, Any]] = []
    logged: dict[str, None] = {}  # insertion-ordered, each line once
    for child, err in children:
        out, _ = child.communicate("stop\n", timeout=60)
        err.close()
        text = Path(err.name).read_text()
        if child.returncode != 0:
            sys.stderr.write(text)
            raise RuntimeError(f"a {side} consumer failed (exit {child.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
        for line in text.splitlines():
            if line.startswith(("ERROR", "WARNING")):
                logged[line] = None
    busy = machine_busy_s() - busy0
    ends = [r["last_done"] for r in reports if not math.isnan(r["last_done"])]
    seconds = max(ends) - started if ends else math.nan
    cpu = sum(r["cpu_s"] for r in reports)
    others = (busy - cpu) / max(1e-9, (time.time() - started) * cores())
    if side == "vortos":
        done = sum(r["settled"] for r in reports)
        check = vortos_check(store)
        again = check["extra_attempts"]
        exact = done == check["completed"] and again == 0
        exact = exact and (done == fires or ended == "cut")
        txs = sum(r["transactions"] for r in reports)
        empty = sum(r["empty_claims"] for r in reports)
    else:
        done = sum(r["executed"] for r in reports)
        exact, txs, empty, again = done == fires or ended == "cut", 0, 0, 0
    return Result(
        side,
        processes,
        threads,
        fires,
        done,
        seconds,
        cpu,
        others,
        txs,
        empty,
        exact,
        left,
        ended,
        again,
        tuple(logged),
    )


def measure_vortos(
    folder: Path, shape: str, processes: int, threads: int, fires: int, cut_s: float
) -> Result:
    db = folder / f"vortos-{shape}-{processes}-{threads}.db"
    (vortos_backfill if shape == "backfill" else vortos_dispatched)(db, fires)
    result = run_consumers("vortos", db, processes, threads, fires, folder, cut_s)
    return replace(result, side=f"vortos-{shape}")


def measure_huey(folder: Path, processes: int, fires: int, cut_s: float) -> Result:
    path = folder / f"huey-{processes}.db"
    huey_prefill(path, fires)
    return run_consumers("huey", path, processes, 1, fires, folder, cut_s)


# -- the report -------------------------------------------------------------------------------


def _rate(r: Result) -> str:
    """Fires per second; a run that got stuck or was cut is marked (its rate counts what was
    done until then)."""
    return num(r.per_second, 0) + (f" ({r.ended})" if r.ended else "")


def _once(r: Result) -> str:
    notes = [f"{r.again:,} ran again"] if r.again else []
    if r.ended == "stuck":
        notes.append(f"{r.left:,} stuck")
    elif r.ended == "cut":
        notes.append(f"cut with {r.left:,} left")
    return ", ".join(["yes" if r.exact else "NO", *notes])


def _label(r: Result) -> str:
    return "huey" if r.side == "huey" else f"Vortos {r.side.removeprefix('vortos-')}"


def _threads(t: int) -> str:
    return f"default ({DEFAULT_CONCURRENCY})" if t == DEFAULT else str(t)


def report(fires: int, vortos: list[Result], huey: list[Result] | None) -> bool:
    """Print the tables; return whether Vortos's default consumer was ahead of huey at every
    process count."""
    threads = [t for t in THREADS if any(r.threads == t for r in vortos)]
    ahead = True
    for shape, what in SHAPES.items():
        rows: list[list[object]] = []
        for p in PROCESSES:
            side = f"vortos-{shape}"
            mine = {r.threads: r for r in vortos if r.processes == p and r.side == side}
            if not mine:
                continue
            theirs = next((r for r in huey or [] if r.processes == p), None)
            cells: list[object] = [f"{p} process{'es' if p > 1 else ''}"]
            cells += [_rate(mine[t]) for t in threads]
            if theirs is not None:
                ratio = mine[DEFAULT].per_second / theirs.per_second
                ahead = ahead and ratio > 1
                cells += [_rate(theirs), f"{ratio:.2f}x"]
            else:
                cells += ["-", "-"]
            rows.append(cells)
        print_table(
            f"Consume throughput, fires per second: {fires:,} no-op fires on one SQLite file "
            f"(WAL, synchronous=NORMAL); Vortos: {what}; huey: {fires:,} queued tasks",
            [
                "consumer processes",
                *[f"Vortos {_threads(t)} thr/proc" for t in threads],
                "huey",
                "Vortos default / huey",
            ],
            rows,
        )
    detail: list[list[object]] = []
    for r in [*vortos, *(huey or [])]:
        detail.append(
            [
                f"{_label(r)}, {r.processes} proc x {_threads(r.threads)} thr",
                num(r.done),
                num(r.seconds, 2),
                num(r.per_second, 0),
                num(1e6 * r.cpu_s / max(1, r.done), 0),
                "-" if r.side == "huey" else num(r.transactions / max(1, r.done), 2),
                "-" if r.side == "huey" else num(r.empty_claims),
                f"{100 * r.others_share:.0f}%",
                _once(r),
            ]
        )
    print_table(
        "Every run",
        [
            "run",
            "done",
            "wall s",
            "fires/s",
            "CPU us/fire",
            "write tx/fire",
            "empty claims",
            f"other CPU ({cores()} cores)",
            "each done once",
        ],
        detail,
    )
    print(
        "CPU: the consumer processes' user+sys, per fire. Vortos write transactions: the fire "
        "queue's claims, settles and heartbeats (claims that took no fire included); huey runs "
        "a dequeue transaction (after a read) and a revoke-key delete transaction per task (a "
        "None result is not stored). 'other CPU' is the rest of the machine, this script's "
        "polling of the store included. 'each done once': Vortos, every fire completed by one "
        "attempt ('ran again': a fire whose command ran twice); huey, every task executed."
    )
    for r in [*vortos, *(huey or [])]:
        if r.logged:
            print(
                f"\n{_label(r)}, {r.processes} proc x {_threads(r.threads)} thr, consumers logged:"
            )
            for line in r.logged:
                print(f"  {line}")
    return ahead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3,000 fires instead of 20,000")
    parser.add_argument("--worker", choices=["vortos", "huey"], help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=DEFAULT, help=argparse.SUPPRESS)
    parser.add_argument("--name", default="consumer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet_logging()
    if args.worker is not None:
        logging.getLogger("huey").setLevel(logging.WARNING)
        if args.worker == "vortos":
            result = vortos_worker(args.store, args.threads, args.name)
        else:
            result = huey_worker(args.store)
        print(json.dumps(result))
        return
    fires = 3_000 if args.quick else 20_000
    cut_s = MAX_RUN_S / 3 if args.quick else MAX_RUN_S
    have_huey = importlib.util.find_spec("huey") is not None
    vortos: list[Result] = []
    huey: list[Result] | None = [] if have_huey else None
    with scratch_dir() as folder:
        for p in PROCESSES:
            for shape in SHAPES:
                for t in QUICK_THREADS if args.quick else THREADS:
                    vortos.append(measure_vortos(folder, shape, p, t, fires, cut_s))
            if huey is not None:
                huey.append(measure_huey(folder, p, fires, cut_s))
    ahead = report(fires, vortos, huey)
    if huey is not None:
        verdict = "met" if ahead else "MISSED"
        print(f"target Vortos's default consumer ahead of huey at every process count: {verdict}")
    else:
        print(
            "huey column skipped: it is a benchmark-only dependency. Install it with\n"
            f"  {HUEY_INSTALL}"
        )


if __name__ == "__main__":
    main()

"""Does a default `vortos run` consume what it dispatches? N aligned 1 s `noop` schedules.

A real `vortos --db FILE run` process, no flags (its default consumer threads, claim batch,
lookahead, INFO log to a file), on a file holding N interval schedules every 1 s running the
built-in `noop`, all on one anchor: each second N slots fall due at the same instant. After S
seconds of slots (and a drain of a few seconds) the process is stopped with SIGTERM, and the
ledger says, for the slots of the window: how many were dispatched, how many completed, and
how long after its slot each one completed (`finished_at - slot_at`: dispatch, claim, the
command and the settle commit). Target: every no-op fire completed within a second of its slot.
N = 5,000, S = 25 (`--quick`: 2,000 for 10 s). `--schedules`/`--seconds` change them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import apsw

from bench._common import (
    Spread,
    bulk_insert,
    cores,
    count_of,
    interval_rows,
    machine_busy_s,
    new_database,
    now_ms,
    num,
    print_table,
    reanchor,
    scratch_dir,
    verdict,
)

LEAD_MS = 5_000  # from the end of setup to the first slot: the process starts, takes its lease
DRAIN_S = 5.0  # after the window, how long the last fires may take to complete
TARGET_MS = 1_000


@dataclass(frozen=True, slots=True)
class KeepUp:
    schedules: int
    seconds: int
    dispatched: int
    by_state: dict[str, int]
    completed: Spread  # finished_at - slot_at of the completed runs, ms
    dispatch: Spread  # dispatched_at - slot_at, ms
    within: int  # completed within TARGET_MS of their slot
    again: int  # runs attempted more than once
    cpu_s: float  # the vortos run process, user+sys
    wall_s: float
    others: float  # the rest of the machine's CPU, a share of all its cores

    @property
    def expected(self) -> int:
        return self.schedules * self.seconds


def measure(schedules: int, seconds: int, folder: Path) -> KeepUp:
    db = new_database(folder / "vortos.db")
    bulk_insert(db, interval_rows(schedules, every_ms=1000, anchor_ms=now_ms(), prefix="s"))
    first = (now_ms() + LEAD_MS) // 1000 * 1000
    last = first + seconds * 1000 - 1
    reanchor(db, every_ms=1000, first_ms=first)
    with (folder / "run.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "vortos_tui.cli", "--db", str(db), "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            time.sleep(max(0.0, first / 1000 - time.time()))
            busy0, cpu0 = machine_busy_s(), _cpu_of(process.pid)
            time.sleep(max(0.0, (last + 1) / 1000 + DRAIN_S - time.time()))
            cpu = _cpu_of(process.pid) - cpu0
            busy = machine_busy_s() - busy0
            if process.poll() is not None:
                raise RuntimeError(f"vortos run ended early:\n{(folder / 'run.log').read_text()}")
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            process.wait(60)
    wall = (last + 1) / 1000 + DRAIN_S - first / 1000
    window = (first, last)
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:

        def values(sql: str) -> list[float]:
            return [float(r[0]) for r in conn.execute(sql, window)]

        in_window = "FROM runs WHERE slot_at BETWEEN ? AND ?"
        done = values(f"SELECT finished_at - slot_at {in_window} AND state = 'completed'")
        states = conn.execute(f"SELECT state, count(*) {in_window} GROUP BY state", window)
        return KeepUp(
            schedules=schedules,
            seconds=seconds,
            dispatched=count_of(conn, f"SELECT count(*) {in_window}", window),
            by_state={str(state): int(n) for state, n in states},
            completed=Spread.of(done),
            dispatch=Spread.of(values(f"SELECT dispatched_at - slot_at {in_window}")),
            within=sum(1 for d in done if d <= TARGET_MS),
            again=count_of(conn, f"SELECT count(*) {in_window} AND attempts > 1", window),
            cpu_s=cpu,
            wall_s=wall,
            others=(busy - cpu) / max(1e-9, wall * cores()),
        )
    finally:
        conn.close()


def _cpu_of(pid: int) -> float:
    """The user+sys CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2,000 schedules for 10 s")
    parser.add_argument("--schedules", type=int, help="how many schedules (default 5,000)")
    parser.add_argument("--seconds", type=int, help="how many seconds of slots (default 25)")
    args = parser.parse_args()
    schedules = args.schedules or (2_000 if args.quick else 5_000)
    seconds = args.seconds or (10 if args.quick else 25)
    with scratch_dir() as folder:
        r = measure(schedules, seconds, folder)
    print_table(
        f"A default `vortos run`: {schedules:,} aligned 1 s noop schedules for {seconds} s "
        f"(each second {schedules:,} slots due at one instant), one SQLite file",
        ["measure", "value"],
        [
            ["slots expected", num(r.expected)],
            ["runs dispatched", num(r.dispatched)],
            ["runs by state", ", ".join(f"{k} {v:,}" for k, v in sorted(r.by_state.items()))],
            ["runs completed", num(r.completed.count)],
            [f"completed within {TARGET_MS} ms of the slot", num(r.within)],
            ["completion p50 (ms, finished_at - slot)", num(r.completed.p50)],
            ["completion p99 (ms)", num(r.completed.p99)],
            ["completion max (ms)", num(r.completed.max)],
            ["dispatch p99 (ms, dispatched_at - slot; < 0: written ahead)", num(r.dispatch.p99)],
            ["runs attempted more than once", num(r.again)],
            ["vortos run CPU share of one core", f"{100 * r.cpu_s / r.wall_s:.0f}%"],
            [f"other CPU ({cores()} cores)", f"{100 * r.others:.0f}%"],
        ],
    )
    ok = r.within == r.expected
    print(f"target every no-op fire completed within {TARGET_MS} ms of its slot: {verdict(ok)}")


if __name__ == "__main__":
    main()

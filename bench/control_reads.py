"""Console and CLI reads over the control socket beside the local read model, on the same files.

With a control socket (`vortos run --control-socket PATH`) the operator's console and CLI open no
database: every read is a request to the server (engine/control/reads.py), which answers it with
its own read model narrowed to the account the kernel reports. This measures what that costs,
against reading the file directly, on the databases bench/console.py builds (1k/10k and 100k/1M;
`--quick`: 1k/10k and 20k/200k).

Each size runs on a copy of the cached file, served by a real `vortos run --control-socket
--no-consume` process as this process's own account. Before the server starts, this process
takes the leader lease on the copy for an hour, so the server stands by and dispatches nothing:
both sides read the same, unchanging rows (the server's start-up adds its first operator's
grant and its static schedules, on the copy, before anything is measured). The server and its
socket are stopped and removed with the copy, whatever happens.

- per call: each ReadModel call the console makes (overview, a page of schedules, a page of
  fires, one schedule's detail, audit, approvals), local (`open_read_model` on the copy, narrowed
  to this account as the console narrows it) and over the socket (`SocketReadModel`), the two
  alternating call by call; p50 and p95, and socket / local.
- where a socket call goes: the wire round trip alone (`ControlClient.call`: connect, request,
  the server's work, the answer's JSON decoded), the answer's size, and decoding it into the
  read model's types (`from_wire`), p50.
- CLI: `vortos schedule list --json --limit 100`, real processes, direct on the file and with
  `--control-socket`, alternating; `vortos --help` beside them is the interpreter's and the CLI's
  start-up, which both pay.
- console: bench/console.py's first frame (median of three apps per side) and refresh
  (settle + paint) of the real `VortosConsole`, with the local read model and with the socket
  one, on the same copy.

The newest run's id is read before and after: a server that dispatched anything fails the run.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw

from bench._common import (
    cores,
    count_of,
    machine_busy_s,
    num,
    percentile,
    print_table,
    quiet_logging,
    scratch_dir,
)
from bench.console import (
    QUICK_SIZES,
    SIZES,
    VIEWS,
    ConsoleFigures,
    database,
    measure_console,
)
from engine import (
    Approval,
    FireListQuery,
    Overview,
    ReadModel,
    Run,
    ScheduleDetail,
    ScheduleListQuery,
    ScheduleRow,
    SystemClock,
    open_engine,
    open_read_model,
)
from engine.control import ControlClient
from engine.control.codec import from_wire
from engine.control.read_model import SocketReadModel
from engine.governance.policy import RoleBasedPolicy
from engine.ports.lease import LEADER_LEASE
from engine.ports.read_model import AuditOverview, Page
from vortos_tui.console.context import DEFAULT_PAGE

ROOT = Path(__file__).resolve().parents[1]
SAMPLES, QUICK_SAMPLES = 60, 25  # per call and side, after one warm-up each
CLI_RUNS, QUICK_CLI_RUNS = 5, 3
CONSOLE_REFRESHES, QUICK_CONSOLE_REFRESHES = 20, 10
FIRST_FRAMES = 3  # apps per view and side (the first also times the refreshes)
LEASE_HOLD_MS = 3_600_000
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

# The console's reads, one call each: what a local call returns is what the socket call returns.
Call = Callable[[ReadModel], Awaitable[Any]]


def calls(schedule_id: str) -> list[tuple[str, str, dict[str, Any], type[Any], Call]]:
    """(label, socket op, its args, its answer's type, the ReadModel call) per console read."""
    now = SystemClock().now_ms
    return [
        ("overview", "console_overview", {}, Overview, lambda m: m.overview(now())),
        (
            f"schedules, page of {DEFAULT_PAGE}",
            "console_schedules",
            {"offset": 0, "limit": DEFAULT_PAGE},
            Page[ScheduleRow],
            lambda m: m.schedules(ScheduleListQuery(limit=DEFAULT_PAGE)),
        ),
        (
            f"fires, page of {DEFAULT_PAGE}",
            "console_fires",
            {"offset": 0, "limit": DEFAULT_PAGE},
            Page[Run],
            lambda m: m.fires(FireListQuery(limit=DEFAULT_PAGE)),
        ),
        (
            "one schedule's detail (20 runs)",
            "console_schedule",
            {"schedule_id": schedule_id, "runs": 20},
            ScheduleDetail,
            lambda m: m.schedule(schedule_id, runs=20),
        ),
        ("audit (50 entries)", "console_audit", {"limit": 50}, AuditOverview, lambda m: m.audit()),
        (
            "approvals (100)",
            "console_approvals",
            {"limit": 100},
            list[Approval],
            lambda m: m.approvals(),
        ),
    ]


# -- the server ---------------------------------------------------------------------------------


def hold_lease(db: Path) -> None:
    """Take the leader lease on `db` for an hour, so a server started on it stands by."""
    with open_engine(db, create=False) as engine:
        held = engine.storage.leases.acquire(
            LEADER_LEASE,
            secrets.token_hex(8),
            "bench: so the server dispatches nothing",
            LEASE_HOLD_MS,
        )
    if held is None:
        raise RuntimeError(f"the leader lease of {db} is held already")


def _answers(sock: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(sock))
    except OSError:
        return False
    finally:
        probe.close()
    return True


@contextmanager
def served(db: Path, sock: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`vortos run --control-socket SOCK --no-consume` on `db`, as this account, until the
    block ends; then stopped (SIGTERM, killed if it does not stop) and its socket removed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VORTOS_")}
    argv = [sys.executable, "-m", "vortos_tui.cli", "--db", str(db), "run"]
    argv += ["--control-socket", str(sock), "--no-consume", "--log-level", "warning"]
    with log.open("ab") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(sock):
            if server.poll() is not None:
                raise RuntimeError(f"vortos run exited {server.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the control socket never answered:\n{log.read_text()}")
            time.sleep(0.05)
        yield server
    finally:
        server.terminate()
        try:
            server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        sock.unlink(missing_ok=True)


def narrowed(db: Path) -> ReadModel:
    """The local read model as the console opens it: narrowed to this account by its roles
    (the server's start-up made it the database's first operator: admin in every tenant)."""
    return open_read_model(db, operator=getpass.getuser(), policy=RoleBasedPolicy())


# -- per call -----------------------------------------------------------------------------------


def ms(values: Sequence[float], pct: float = 50) -> float:
    return percentile(values, pct)


async def per_call(
    db: Path, sock: Path, schedule_id: str, samples: int
) -> tuple[list[list[object]], list[list[object]]]:
    """Rows of the per-call table and of the where-it-goes table."""
    local = narrowed(db)
    remote = SocketReadModel(ControlClient(sock))
    client = ControlClient(sock)
    rows: list[list[object]] = []
    parts: list[list[object]] = []
    try:
        for label, op, args, kind, call in calls(schedule_id):
            here: list[float] = []
            there: list[float] = []
            for i in range(samples + 1):
                # Alternate which side goes first: neither always finds the page cache warmed.
                order = [(local, here), (remote, there)]
                for model, out in order if i % 2 else reversed(order):
                    t0 = time.perf_counter()
                    await call(model)
                    if i:
                        out.append(1000 * (time.perf_counter() - t0))
            wire, decode, size = await wire_parts(client, op, args, kind, samples)
            ratio = ms(there) / ms(here)
            rows.append([label, num(ms(here), 2), num(ms(here, 95), 2)])
            rows[-1] += [num(ms(there), 2), num(ms(there, 95), 2), f"{ratio:.1f}x"]
            rows[-1] += [num(ms(there) - ms(here), 2)]
            parts.append([label, num(size), num(ms(wire), 2), num(ms(decode), 2)])
    finally:
        await local.close()
        await remote.close()
    return rows, parts


async def wire_parts(
    client: ControlClient, op: str, args: dict[str, Any], kind: type[Any], samples: int
) -> tuple[list[float], list[float], int]:
    """The round trip alone (ms), decoding its answer into `kind` (ms), the answer's bytes."""
    wire: list[float] = []
    decode: list[float] = []
    size = 0
    for i in range(samples + 1):
        if op == "console_overview":
            args = {"now_ms": SystemClock().now_ms()}
        t0 = time.perf_counter()
        done = await asyncio.to_thread(client.call, op, args)
        t1 = time.perf_counter()
        (value,) = done.values()
        from_wire(kind, value)
        t2 = time.perf_counter()
        if i:
            wire.append(1000 * (t1 - t0))
            decode.append(1000 * (t2 - t1))
        size = len(_encoded(done))
    return wire, decode, size


def _encoded(answer: dict[str, Any]) -> bytes:
    from engine.control.wire import encode  # noqa: PLC0415 - only for the answer's size

    return encode({"ok": True, "result": answer})


# -- the CLI ------------------------------------------------------------------------------------


def cli_runs(db: Path, sock: Path, runs: int) -> list[list[object]]:
    """Wall ms of `vortos --help` and of `schedule list --json --limit 100`, direct and through
    the socket, alternating; each listing's output is checked to be 100 schedules."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VORTOS_")}
    base = [sys.executable, "-m", "vortos_tui.cli", "--db", str(db)]
    listing = ["schedule", "list", "--json", "--limit", "100"]
    ways = {
        "vortos --help (start-up only)": [*base, "--help"],
        "direct": [*base, *listing],
        "--control-socket": [*base, "--control-socket", str(sock), *listing],
    }
    spent: dict[str, list[float]] = {label: [] for label in ways}
    sizes: dict[str, int] = {}
    for i in range(runs + 1):
        for label, argv in ways.items() if i % 2 else reversed(ways.items()):
            t0 = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, cwd=ROOT, env=env, check=False)
            wall = 1000 * (time.perf_counter() - t0)
            if done.returncode != 0:
                raise RuntimeError(f"{label}: exit {done.returncode}: {done.stderr.decode()}")
            sizes[label] = len(done.stdout)
            if i:
                spent[label].append(wall)
    direct = ms(spent["direct"])
    rows: list[list[object]] = []
    for label, walls in spent.items():
        shown = "-" if label.startswith("vortos --help") else f"{ms(walls) / direct:.2f}x"
        rows.append([label, num(ms(walls), 0), num(min(walls), 0), num(max(walls), 0)])
        rows[-1] += [shown, num(sizes[label])]
    return rows


# -- the console --------------------------------------------------------------------------------


def console_rows(db: Path, sock: Path, refreshes: int) -> list[list[object]]:
    """Per view: first frame (median of FIRST_FRAMES apps per side, alternating which side
    starts) and refresh p50 (the first app of each side), local and over the socket."""
    rows: list[list[object]] = []
    for view in VIEWS:
        first: dict[str, list[float]] = {"local": [], "socket": []}
        refresh: dict[str, ConsoleFigures] = {}
        for i in range(FIRST_FRAMES):
            for side in ("local", "socket") if i % 2 == 0 else ("socket", "local"):
                model = SocketReadModel(ControlClient(sock)) if side == "socket" else narrowed(db)
                figures = asyncio.run(
                    measure_console(
                        db, view, refreshes if i == 0 else 0, profile=False, model=model
                    )
                )
                first[side].append(figures.first_frame_ms)
                refresh.setdefault(side, figures)
        here, there = ms(first["local"]), ms(first["socket"])
        h50, t50 = ms(refresh["local"].refresh_ms), ms(refresh["socket"].refresh_ms)
        rows.append(["Schedules" if view == "schedules" else "Live fires"])
        rows[-1] += [num(here, 0), num(there, 0), f"{there / here:.2f}x"]
        rows[-1] += [num(h50), num(t50), f"{t50 / h50:.2f}x"]
        rows[-1] += [num(ms(refresh["local"].read_ms)), num(ms(refresh["socket"].read_ms))]
    return rows


# -- the run ------------------------------------------------------------------------------------


def stored_runs(db: Path) -> int:
    """The newest run's id: the same before and after, so the server dispatched nothing."""
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return count_of(conn, "SELECT coalesce(max(id), 0) FROM runs")
    finally:
        conn.close()


def a_schedule(db: Path) -> str:
    """The id of a schedule with runs (the first page of fires names one)."""

    async def find() -> str:
        model = open_read_model(db)
        try:
            page = await model.fires(FireListQuery(limit=1))
        finally:
            await model.close()
        return page.rows[0].schedule_id

    return asyncio.run(find())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1k/10k and 20k/200k, fewer samples")
    parser.add_argument("--rebuild", action="store_true", help="build the cached databases again")
    parser.add_argument("--no-console", action="store_true", help="skip the console's figures")
    args = parser.parse_args()
    quiet_logging()
    sizes = QUICK_SIZES if args.quick else SIZES
    samples = QUICK_SAMPLES if args.quick else SAMPLES
    runs = QUICK_CLI_RUNS if args.quick else CLI_RUNS
    refreshes = QUICK_CONSOLE_REFRESHES if args.quick else CONSOLE_REFRESHES
    busy0, cpu0, wall0 = machine_busy_s(), time.process_time(), time.perf_counter()
    kids0 = _children_cpu_s()

    per: list[list[object]] = []
    parts: list[list[object]] = []
    cli: list[list[object]] = []
    console: list[list[object]] = []
    for schedules, runs_stored in sizes:
        cached, _ = database(schedules, runs_stored, rebuild=args.rebuild)
        label = f"{num(schedules)} / {num(runs_stored)}"
        with scratch_dir() as folder:
            db = folder / "vortos.db"
            shutil.copyfile(cached, db)
            hold_lease(db)
            sock = folder / "control.sock"
            with served(db, sock, folder / "server.log"):
                schedule_id = a_schedule(db)
                before = stored_runs(db)
                rows, where = asyncio.run(per_call(db, sock, schedule_id, samples))
                per += [[label, *row] for row in rows]
                parts += [[label, *row] for row in where]
                cli += [[label, *row] for row in cli_runs(db, sock, runs)]
                if not args.no_console:
                    console += [[label, *row] for row in console_rows(db, sock, refreshes)]
                if stored_runs(db) != before:
                    raise RuntimeError(f"the server dispatched on {label}: its reads changed")

    print_table(
        f"Console reads, local read model vs over the control socket (a `vortos run "
        f"--control-socket` process on the same file); {samples} calls per side, alternating; ms",
        [
            "schedules / runs",
            "call",
            "local p50",
            "local p95",
            "socket p50",
            "socket p95",
            "socket / local",
            "added p50",
        ],
        per,
    )
    print_table(
        "Where a socket call goes, p50: the round trip alone (ControlClient.call: connect, "
        "request, the server's work, JSON decoded) and decoding the answer into the read "
        "model's types (from_wire)",
        ["schedules / runs", "call", "answer bytes", "round trip ms", "from_wire ms"],
        parts,
    )
    print_table(
        f"CLI `vortos schedule list --json --limit 100`, wall ms of a real process, {runs} runs "
        "each, alternating",
        ["schedules / runs", "way", "p50", "min", "max", "/ direct", "stdout bytes"],
        cli,
    )
    if console:
        print_table(
            f"The console (VortosConsole, headless, as bench/console.py), local read model vs "
            f"socket; {refreshes} refreshes per view; ms",
            [
                "schedules / runs",
                "view",
                "first frame local",
                "first frame socket",
                "socket / local",
                "refresh p50 local",
                "refresh p50 socket",
                "socket / local",
                "reads in app local",
                "reads in app socket",
            ],
            console,
        )
    wall = time.perf_counter() - wall0
    mine = time.process_time() - cpu0
    children = _children_cpu_s() - kids0
    other = machine_busy_s() - busy0 - mine - children
    print(
        f"{cores()} cores; other processes used {other / wall:.2f} cores on average over "
        f"{wall:.0f} s (this process: {mine / wall:.2f}; its servers and CLI runs: "
        f"{children / wall:.2f})"
    )


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended (the servers, the CLI runs)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


if __name__ == "__main__":
    main()

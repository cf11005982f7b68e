"""Dispatch and consume throughput on PostgreSQL, side by side with SQLite in one run.

Dispatch: a backlog of N due slots (N hourly interval schedules running `noop`, each with one
slot due half a second ago), drained by the real daemon (`engine.daemon(...)`, stepped until
nothing is due) in a process of its own; SQLite and PostgreSQL, then PostgreSQL with 2 and 4
daemons, each in its own process leading one lease shard (`shard=(i, n)`: the schedules whose
`shard_key` modulo n is i). Then 1, 2 and 4 nodes x 4 shards: each node a process as `vortos
run --shards 4` is, registered in the node registry and leading the share of the 4 shards its
Membership gives it (engine.runtime.nodes), a thread per shard it leads; the nodes only beat
until each sees them all, and take their leases at the go.

Consume: a backlog of N no-op fires (one schedule every 1 s, overlap `allow`, backfilled over N
past seconds with `engine.service.backfill`) run by 1, 2 and 4 consumer processes, each the
real FireQueueConsumer (`engine.consumer(concurrency=K).run()`) with K = 4 and 16 worker threads
(`--quick`: 16), on SQLite and on PostgreSQL.

Every run has a fresh database: a SQLite file in a temporary directory, or a schema
`vortos_bench_<hex>` of the PostgreSQL database (`--pg-url`, default VORTOS_BENCH_PG_URL or the
local test server), created with the engine's migration and dropped afterwards. Schedule rows are
inserted in one transaction, built by the engine's codec (PostgreSQL: COPY, with each row's
`shard_key`, the CRC-32 of its id). Every process is started and opened first, then all are told
to go at once; the wall time runs from the go to the last fire dispatched (its transaction
committed) or completed (its settle committed). Every run checks exactly once: N runs, N distinct
slot keys, N fires queued (dispatch) or completed by one attempt each (consume).

On PostgreSQL the figures include the server: its backends' CPU for the benchmark's connections
is read from /proc when the server runs on this machine. Without psycopg or a reachable server
the SQLite side runs alone. N = 20,000 dispatch / 10,000 consume (`--quick`: 3,000 / 1,500).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import apsw

from bench._common import (
    bulk_insert,
    cores,
    interval_rows,
    machine_busy_s,
    new_database,
    num,
    pg_schema,
    print_table,
    quiet_logging,
    scratch_dir,
)
from engine import IntervalTrigger, OverlapPolicy, ScheduleSpec, open_engine
from engine.backends.codec import SCHEDULE_COLUMNS
from engine.domain.database import is_postgres_url, shown
from engine.ports.dispatch import DispatchReport
from engine.ports.fire_queue import Claim, Outcome, Settlement, SettleReport

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
PG_URL_ENV = "VORTOS_BENCH_PG_URL"
# Every node of a PostgreSQL deployment signs audit entries with one key, given here to the
# benchmark and to its child processes (SQLite takes it too, instead of a key file).
AUDIT_KEY = "ab" * 32
HOUR_MS = 3_600_000
SHARDS = (2, 4)  # sharded dispatch on PostgreSQL: this many daemons, one shard each
PROCESSES = (1, 2, 4)  # consumer processes
THREADS = (4, 16)  # worker threads per consumer process
QUICK_THREADS = (16,)
# The fire queue's calls that are one write transaction each (whichever this engine has).
WRITES = ("claim", "settle", "settle_and_claim", "heartbeat", "enqueue")
POLL_S = 0.05  # how often the parent looks at the store; the timing comes from the children
STALL_S = 20.0  # a backlog that has not shrunk for this long is stuck: the run is over
MAX_RUN_S = 60.0  # a slower run is cut here and rated on what it did (`--quick`: 20 s)
SCHEDULE = "bench-pg-consume"
SQLITE, POSTGRES = "SQLite", "PostgreSQL"
_ID = [c.strip() for c in SCHEDULE_COLUMNS.split(",")].index("id")
_COPY = f"COPY schedules ({SCHEDULE_COLUMNS}, shard_key) FROM STDIN"
_SERVER_NOW = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_RUNS = (
    "SELECT count(*), count(DISTINCT slot_key), "
    "coalesce(sum(CASE WHEN state = 'completed' THEN 1 ELSE 0 END), 0), "
    "coalesce(sum(CASE WHEN attempts > 1 THEN attempts - 1 ELSE 0 END), 0) FROM runs"
)
_FIRES = (
    "SELECT count(*), "
    "coalesce(sum(CASE WHEN completed_at IS NOT NULL THEN 1 ELSE 0 END), 0), "
    "coalesce(sum(CASE WHEN completed_at IS NULL AND discarded_at IS NULL THEN 1 ELSE 0 END), 0) "
    "FROM fire_queue"
)
_OPEN = "SELECT count(*) FROM fire_queue WHERE completed_at IS NULL AND discarded_at IS NULL"
_DISPATCHED = "SELECT count(*) FROM runs"


def backend(db: str) -> str:
    return POSTGRES if is_postgres_url(db) else SQLITE


# -- PostgreSQL: is it there, scratch schemas, bulk rows, the server's CPU -------------------


def pg_problem(url: str) -> str | None:
    """Why PostgreSQL cannot be benchmarked, or None when it can."""
    try:
        import psycopg  # noqa: PLC0415 - the postgres extra
    except ImportError:
        return "psycopg is not installed: pip install -e '.[postgres]'"
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"PostgreSQL is not reachable at {shown(url)} ({first})"
    return None


@contextmanager
def fresh_store(kind: str, folder: Path, tag: str, pg_url: str) -> Iterator[str]:
    """A new, empty Vortos database: a SQLite file's path, or a PostgreSQL schema's URL."""
    if kind == SQLITE:
        yield str(new_database(folder / f"{tag}.db"))
    else:
        with pg_schema(pg_url) as url:
            yield url


class Reader:
    """The parent's read connection to a store, for its polls and checks."""

    def __init__(self, db: str) -> None:
        self.db = db
        self._pg: Any = None
        self._lite: apsw.Connection | None = None
        if is_postgres_url(db):
            import psycopg  # noqa: PLC0415

            self._pg = psycopg.connect(db, autocommit=True)
        else:
            self._lite = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READONLY)
            self._lite.set_busy_timeout(5_000)

    def rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self._lite is not None:
            return [tuple(r) for r in self._lite.execute(sql, tuple(args)).fetchall()]
        return [tuple(r) for r in self._pg.execute(sql.replace("?", "%s"), args).fetchall()]

    def ints(self, sql: str) -> tuple[int, ...]:
        return tuple(int(v) for v in self.rows(sql)[0])

    def close(self) -> None:
        if self._lite is not None:
            self._lite.close()
        if self._pg is not None:
            self._pg.close()


def _local_host(url: str) -> bool:
    host = urlsplit(url).hostname
    return host in (None, "", "localhost", "127.0.0.1", "::1") or (host or "").startswith("/")


class ServerCpu:
    """CPU seconds of the PostgreSQL backends serving the given client processes, read from
    /proc: only when the server runs on this machine (NaN otherwise). A backend is matched to
    its client by its application_name, `vortos host:pid` (engine.backends.postgres)."""

    def __init__(self, reader: Reader, clients: Sequence[int]) -> None:
        self._reader = reader
        self._clients = set(clients)
        self._local = (
            is_postgres_url(reader.db)
            and _local_host(reader.db)
            and Path("/proc/self/stat").exists()
        )
        self._start: dict[int, float] = {}

    def _sample(self) -> dict[int, float]:
        found: dict[int, float] = {}
        names = self._reader.rows(
            "SELECT pid, application_name FROM pg_stat_activity WHERE application_name LIKE ?",
            ("vortos %",),
        )
        for pid, name in names:
            try:
                if int(str(name).rsplit(":", 1)[1]) not in self._clients:
                    continue
                proc = Path(f"/proc/{pid}")
                if proc.joinpath("comm").read_text().strip() != "postgres":
                    continue
                fields = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, ValueError, IndexError):
                continue
            found[int(pid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return found

    def start(self) -> None:
        if self._local:
            self._start = self._sample()

    def used(self) -> float:
        """CPU seconds since `start()` (a backend opened since counts from its start)."""
        if not self._local:
            return math.nan
        now = self._sample()
        if not now:
            return math.nan
        return sum(cpu - self._start.get(pid, 0.0) for pid, cpu in now.items())


def server_now_ms(db: str) -> int:
    """Now on the clock the engine will use: the database server's on PostgreSQL."""
    if not is_postgres_url(db):
        return time.time_ns() // 1_000_000
    reader = Reader(db)
    try:
        return reader.ints(_SERVER_NOW)[0]
    finally:
        reader.close()


def pg_bulk_insert(url: str, rows: Iterable[tuple[Any, ...]]) -> None:
    """Insert schedule rows (the codec's SCHEDULE_COLUMNS) in one transaction, with COPY; each
    row's shard_key is the CRC-32 of its id, as the engine sets it."""
    import psycopg  # noqa: PLC0415

    with psycopg.connect(url) as conn, conn.cursor() as cursor, cursor.copy(_COPY) as copy:
        for row in rows:
            copy.write_row((*row, zlib.crc32(str(row[_ID]).encode())))


# -- the two backlogs -------------------------------------------------------------------------


def dispatch_backlog(db: str, count: int) -> None:
    """`count` hourly schedules running `noop`, each with one slot due half a second ago."""
    rows = interval_rows(count, every_ms=HOUR_MS, anchor_ms=server_now_ms(db) - 500, prefix="s")
    if is_postgres_url(db):
        pg_bulk_insert(db, rows)
    else:
        bulk_insert(Path(db), rows)


def consume_backlog(db: str, count: int) -> None:
    """`count` backfill fires of one schedule every 1 s, overlap allow."""
    with open_engine(db) as engine:
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


# -- child processes --------------------------------------------------------------------------


def _handshake() -> None:
    """Tell the parent this process is ready, then wait for its go."""
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go from the parent")


def dispatch_worker(db: str, name: str, shard: tuple[int, int] | None) -> dict[str, Any]:
    """One daemon: take the lease, then on the go step until a step dispatches nothing; stay
    connected until the parent's stop (it reads the server's CPU for this process first)."""
    engine = open_engine(db)
    counts = {"done": 0, "transactions": 0}
    last_done = [math.nan]

    def dispatched(report: DispatchReport) -> None:
        if report.dispatched:
            counts["done"] += len(report.dispatched)
            counts["transactions"] += 1
            last_done[0] = time.time()

    daemon = engine.daemon(node_id=name, on_dispatch=dispatched, shard=shard)
    deadline = time.monotonic() + 30
    while not daemon.leading:
        daemon.step()  # takes the lease
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not get its lease in 30 s")
    _handshake()
    cpu0 = time.process_time()
    while True:
        before = counts["done"]
        daemon.step()  # one dispatch transaction (a batch of up to 2,000 due slots)
        if counts["done"] == before:
            break
    cpu = time.process_time() - cpu0
    sys.stdin.readline()  # the parent's stop
    daemon.release()
    engine.close()
    return {**counts, "last_done": last_done[0], "cpu_s": cpu}


NODE_SHARDS = 4  # nodes x shards on PostgreSQL: every node runs --shards 4
NODES = (1, 2, 4)
NODE_TTL_MS = 3_000  # the nodes' lease (and registration) TTL: they share out within it


def nodes_worker(db: str, name: str, nodes: int) -> dict[str, Any]:
    """One node as `vortos run --shards 4` runs it: registered in the node registry, a daemon
    per shard asking the node's Membership whether to lead. Ready once `nodes` nodes are live
    and it leads its share; on the go each shard it leads is stepped on a thread of its own
    until a step dispatches nothing."""
    from engine.runtime.nodes import Membership  # noqa: PLC0415

    engine = open_engine(db)
    membership = Membership(engine.storage.nodes, engine.clock, name, NODE_SHARDS, NODE_TTL_MS)
    membership.join()
    counts = {"done": 0, "transactions": 0}
    last_done = [math.nan]
    lock = threading.Lock()

    def dispatched(report: DispatchReport) -> None:
        if report.dispatched:
            with lock:
                counts["done"] += len(report.dispatched)
                counts["transactions"] += 1
                last_done[0] = time.time()

    daemons = [
        engine.daemon(
            node_id=name,
            lease_ttl_ms=NODE_TTL_MS,
            on_dispatch=dispatched,
            shard=(i, NODE_SHARDS),
            wants_lease=functools.partial(membership.wants, i),
        )
        for i in range(NODE_SHARDS)
    ]
    # No daemon steps before the go (a leader would drain the backlog alone): the nodes only
    # beat until each sees them all, so their shares are final; each then takes its leases.
    deadline = time.monotonic() + 60
    while len(membership.live) != nodes or not membership.share:
        membership.wants(0)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} saw {membership.live}, not {nodes} nodes, in 60 s")
        time.sleep(0.05)
    _handshake()
    cpu0 = time.process_time()

    def drain(daemon: Any) -> None:
        while not daemon.leading:
            daemon.step()  # takes the lease: free, nobody led before the go
        while True:
            before = counts["done"]
            daemon.step()
            if counts["done"] == before:
                return

    workers = [
        threading.Thread(target=drain, args=(d,))
        for i, d in enumerate(daemons)
        if i in membership.share
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    cpu = time.process_time() - cpu0
    sys.stdin.readline()  # the parent's stop
    for d in daemons:
        if d.leading:
            d.release()
    membership.leave()
    engine.close()
    return {**counts, "last_done": last_done[0], "cpu_s": cpu, "shards": sorted(membership.share)}


def _counted(method: Callable[..., Any], counts: dict[str, int]) -> Callable[..., Any]:
    """`method` of the fire queue, counting its transactions and the claims that took no fire."""

    def call(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        counts["transactions"] += 1
        claim = result[-1] if isinstance(result, tuple) else result  # settle_and_claim: a pair
        if isinstance(claim, Claim) and not claim.fires:
            counts["empty_claims"] += 1
        return result

    return call


def consume_worker(db: str, threads: int, name: str) -> dict[str, Any]:
    """One consumer process: the real FireQueueConsumer until the parent says stop."""
    engine = open_engine(db)
    counts = {"done": 0, "transactions": 0, "empty_claims": 0}
    last_done = [math.nan]
    queue = engine.storage.fire_queue
    for write in WRITES:
        if hasattr(queue, write):
            setattr(queue, write, _counted(getattr(queue, write), counts))

    def settled(settlements: list[Settlement], report: SettleReport) -> None:
        acked = set(report.acked)
        done = sum(1 for s in settlements if s.run_id in acked and s.outcome is Outcome.COMPLETE)
        if done:
            counts["done"] += done
            last_done[0] = time.time()

    consumer = engine.consumer(
        consumer_id=name, concurrency=threads, grace_ms=5_000, on_settle=settled
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


@dataclass(frozen=True, slots=True)
class Result:
    kind: str  # "dispatch" or "consume"
    backend: str  # SQLITE or POSTGRES
    processes: int  # daemons (one shard each when more than one) or consumer processes
    threads: int  # consumer worker threads per process (0 for dispatch)
    count: int  # the backlog
    done: int  # fires dispatched or completed, summed over the processes
    per_process: tuple[int, ...]
    seconds: float
    transactions: int  # dispatch transactions that dispatched; the fire queue's writes
    empty_claims: int
    client_cpu_s: float  # the child processes together
    server_cpu_s: float  # their PostgreSQL backends (NaN: SQLite, or not measurable)
    others_share: float  # the rest of the machine (the parent's polls included)
    problems: tuple[str, ...]  # what the exactly-once check found wrong
    ended: str  # "" (all done), "stuck" or "cut"
    logged: tuple[str, ...]  # the children's warnings and errors, each distinct line once

    @property
    def per_second(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else math.nan

    @property
    def exact(self) -> bool:
        return not self.problems

    @property
    def label(self) -> str:
        if self.kind == "dispatch":
            shards = f", {self.processes} shards" if self.processes > 1 else ""
            return f"{self.backend} dispatch, {self.processes} daemon{_s(self.processes)}{shards}"
        return (
            f"{self.backend} consume, {self.processes} proc{_s(self.processes)} "
            f"x {self.threads} thr"
        )


def _s(n: int) -> str:
    return "s" if n != 1 else ""


# A child process and the file its stderr goes to.
Child = tuple["subprocess.Popen[str]", IO[str]]


def _ready(child: Child, tag: str) -> None:
    """Wait for the child's "ready" (it has opened the store and is set to go)."""
    proc, err = child
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.wait(timeout=30)
        err.flush()
        sys.stderr.write(Path(err.name).read_text())
        raise RuntimeError(f"a {tag} process did not start (exit {proc.returncode})")


def _tell(child: Child, line: str) -> None:
    assert child[0].stdin is not None
    child[0].stdin.write(f"{line}\n")
    child[0].stdin.flush()


def _spawn(commands: Sequence[Sequence[str]], folder: Path, tag: str) -> list[Child]:
    children: list[Child] = []
    try:
        for i, command in enumerate(commands):
            err: IO[str] = (folder / f"{tag}-{i}.err").open("w")
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), *command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
            children.append((proc, err))
        for child in children:
            _ready(child, tag)
    except BaseException:
        _kill(children)
        raise
    return children


def _kill(children: Sequence[Child]) -> None:
    for proc, err in children:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()


def run_children(
    kind: str,
    db: str,
    commands: Sequence[Sequence[str]],
    *,
    count: int,
    threads: int,
    folder: Path,
    tag: str,
    cut_s: float,
) -> Result:
    """Start the child processes, tell them to go together, poll the store until the backlog
    is done (all dispatched, or no fire open), read the server's CPU, stop them, check."""
    children = _spawn(commands, folder, tag)
    reader = Reader(db)
    try:
        server = ServerCpu(reader, [proc.pid for proc, _ in children])
        server.start()

        def remaining() -> int:
            if kind == "dispatch":
                return count - reader.ints(_DISPATCHED)[0]
            return reader.ints(_OPEN)[0]

        busy0, started = machine_busy_s(), time.time()
        for child in children:
            _tell(child, "go")
        left, seen, progress_at, ended = remaining(), -1, started, ""
        while left > 0:
            if left != seen:
                seen, progress_at = left, time.time()
            elif time.time() - progress_at > STALL_S:
                ended = "stuck"
                break
            if time.time() - started > cut_s:
                ended = "cut"
                break
            for proc, err in children:
                if proc.poll() is not None:
                    err.flush()
                    sys.stderr.write(Path(err.name).read_text())
                    raise RuntimeError(f"a {tag} process ended early (exit {proc.returncode})")
            time.sleep(POLL_S)
            left = remaining()
        server_cpu = server.used()
        reports: list[dict[str, Any]] = []
        logged: dict[str, None] = {}  # insertion-ordered, each line once
        for proc, err in children:
            out, _ = proc.communicate("stop\n", timeout=120)
            err.close()
            text = Path(err.name).read_text()
            if proc.returncode != 0:
                sys.stderr.write(text)
                raise RuntimeError(f"a {tag} process failed (exit {proc.returncode})")
            reports.append(json.loads(out.strip().splitlines()[-1]))
            for line in text.splitlines():
                if line.startswith(("ERROR", "WARNING")):
                    logged[line] = None
        busy = machine_busy_s() - busy0
        problems = check(kind, reader, count, sum(r["done"] for r in reports), ended)
    finally:
        reader.close()
        _kill(children)
    ends = [r["last_done"] for r in reports if not math.isnan(r["last_done"])]
    client = sum(r["cpu_s"] for r in reports)
    wall = time.time() - started
    others = (busy - client - (0.0 if math.isnan(server_cpu) else server_cpu)) / (wall * cores())
    return Result(
        kind,
        backend(db),
        len(children),
        threads,
        count,
        sum(r["done"] for r in reports),
        tuple(r["done"] for r in reports),
        max(ends) - started if ends else math.nan,
        sum(r["transactions"] for r in reports),
        sum(r.get("empty_claims", 0) for r in reports),
        client,
        server_cpu,
        others,
        problems,
        ended,
        tuple(logged),
    )


def check(kind: str, reader: Reader, count: int, done: int, ended: str) -> tuple[str, ...]:
    """Exactly once: what the ledger and the fire queue say is wrong (nothing: all is well)."""
    runs, keys, completed, again = reader.ints(_RUNS)
    fires, fires_done, still_open = reader.ints(_FIRES)
    problems = []
    if keys != runs:
        problems.append(f"{runs - keys:,} duplicate slot keys")
    if kind == "dispatch":
        if runs != count and not ended:
            problems.append(f"{runs:,} runs, not {count:,}")
        if fires != runs:
            problems.append(f"{fires:,} fires for {runs:,} runs")
        if done != runs:
            problems.append(f"the daemons reported {done:,} fires, the ledger {runs:,}")
    else:
        if runs != count:
            problems.append(f"{runs:,} runs, not {count:,}")
        if again:
            problems.append(f"{again:,} attempts beyond the first")
        if not ended and (completed != count or fires_done != count or still_open):
            problems.append(f"{completed:,} runs completed, {still_open:,} fires open")
        if done != completed:
            problems.append(f"the consumers settled {done:,}, the ledger has {completed:,}")
    return tuple(problems)


# -- the measurements -------------------------------------------------------------------------


def measure_dispatch(
    kind: str, daemons: int, count: int, folder: Path, pg_url: str, cut_s: float
) -> Result:
    """The backlog dispatched by `daemons` daemon processes (more than one: one shard each)."""
    tag = f"dispatch-{kind.lower()}-{daemons}"
    with fresh_store(kind, folder, tag, pg_url) as db:
        dispatch_backlog(db, count)
        commands = [
            ["--worker", "dispatch", "--db", db, "--name", f"daemon-{i}"]
            + (["--shard", f"{i}/{daemons}"] if daemons > 1 else [])
            for i in range(daemons)
        ]
        return run_children(
            "dispatch", db, commands, count=count, threads=0, folder=folder, tag=tag, cut_s=cut_s
        )


def measure_nodes(nodes: int, count: int, folder: Path, pg_url: str, cut_s: float) -> Result:
    """The backlog dispatched by `nodes` node processes sharing 4 lease shards out."""
    tag = f"nodes-{nodes}x{NODE_SHARDS}"
    with fresh_store(POSTGRES, folder, tag, pg_url) as db:
        dispatch_backlog(db, count)
        commands = [
            ["--worker", "nodes", "--db", db, "--name", f"node-{i}", "--nodes", str(nodes)]
            for i in range(nodes)
        ]
        return run_children(
            "dispatch",
            db,
            commands,
            count=count,
            threads=NODE_SHARDS,
            folder=folder,
            tag=tag,
            cut_s=cut_s,
        )


def report_nodes(results: list[Result], dispatch_n: int) -> None:
    """Nodes x 4 shards side by side: the goal is throughput that grows with nodes."""
    one = _find(results, processes=1)
    rows: list[list[object]] = [
        [f"{r.processes} node{'s' if r.processes > 1 else ''}", _rate(r), _ratio(r, one)]
        for r in results
    ]
    print_table(
        f"Dispatch throughput on {POSTGRES}, nodes x {NODE_SHARDS} shards: a backlog of "
        f"{dispatch_n:,} due slots, each node a process sharing the shards out through the "
        "node registry (engine.runtime.nodes), a thread per shard it leads",
        ["nodes", "fires/s", "/ 1 node"],
        rows,
    )


def measure_consume(
    kind: str, processes: int, threads: int, count: int, folder: Path, pg_url: str, cut_s: float
) -> Result:
    tag = f"consume-{kind.lower()}-{processes}-{threads}"
    with fresh_store(kind, folder, tag, pg_url) as db:
        consume_backlog(db, count)
        commands = [
            [
                *("--worker", "consume", "--db", db),
                *("--name", f"consumer-{i}"),
                "--threads",
                str(threads),
            ]
            for i in range(processes)
        ]
        return run_children(
            "consume",
            db,
            commands,
            count=count,
            threads=threads,
            folder=folder,
            tag=tag,
            cut_s=cut_s,
        )


# -- the report -------------------------------------------------------------------------------


def _rate(r: Result | None) -> str:
    if r is None:
        return "-"
    return num(r.per_second, 0) + (f" ({r.ended})" if r.ended else "")


def _ratio(a: Result | None, b: Result | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{a.per_second / b.per_second:.2f}x"


def _find(results: Sequence[Result], **want: Any) -> Result | None:
    for r in results:
        if all(getattr(r, k) == v for k, v in want.items()):
            return r
    return None


def report(dispatch: list[Result], consume: list[Result], dispatch_n: int, consume_n: int) -> None:
    one_lite = _find(dispatch, backend=SQLITE, processes=1)
    one_pg = _find(dispatch, backend=POSTGRES, processes=1)
    rows: list[list[object]] = [
        [
            "1 daemon",
            _rate(one_lite),
            _rate(one_pg),
            _ratio(one_pg, one_lite),
            _ratio(one_pg, one_pg),
        ]
    ]
    for n in SHARDS:
        sharded = _find(dispatch, backend=POSTGRES, processes=n)
        if sharded is not None:
            rows.append(
                [f"{n} daemons, one shard each", "-", _rate(sharded), "-", _ratio(sharded, one_pg)]
            )
    print_table(
        f"Dispatch throughput, fires per second: a backlog of {dispatch_n:,} due slots ("
        f"{dispatch_n:,} hourly schedules, one due slot each), the real daemon in a process "
        "of its own, batches of up to 2,000",
        ["daemons", SQLITE, POSTGRES, f"{POSTGRES} / {SQLITE}", f"{POSTGRES} / 1 daemon"],
        rows,
    )

    threads = sorted({r.threads for r in consume})
    rows = []
    for p in PROCESSES:
        cells: list[object] = [f"{p} process{'es' if p > 1 else ''}"]
        best: dict[str, Result | None] = {}
        for kind in (SQLITE, POSTGRES):
            mine = [r for r in consume if r.backend == kind and r.processes == p]
            cells += [_rate(_find(mine, threads=t)) for t in threads]
            best[kind] = max(mine, key=lambda r: r.per_second) if mine else None
        if not any(best.values()):
            continue
        for kind in (SQLITE, POSTGRES):
            b = best[kind]
            cut = f", {b.ended}" if b is not None and b.ended else ""
            cells.append("-" if b is None else f"{num(b.per_second, 0)} ({b.threads} thr{cut})")
        cells.append(_ratio(best[POSTGRES], best[SQLITE]))
        rows.append(cells)
    print_table(
        f"Consume throughput, fires per second: {consume_n:,} no-op fires (one schedule's "
        "backfill, overlap allow), consumer processes x worker threads",
        [
            "consumer processes",
            *[f"{SQLITE} {t} thr" for t in threads],
            *[f"{POSTGRES} {t} thr" for t in threads],
            f"{SQLITE} best",
            f"{POSTGRES} best",
            f"{POSTGRES} / {SQLITE}",
        ],
        rows,
    )

    detail: list[list[object]] = []
    for r in [*dispatch, *consume]:
        split = "/".join(f"{n:,}" for n in r.per_process) if r.processes > 1 else "-"
        detail.append(
            [
                r.label,
                num(r.done),
                split,
                num(r.seconds, 2),
                _rate(r),
                num(r.transactions),
                num(r.done / max(1, r.transactions), 1),
                "-" if r.kind == "dispatch" else num(r.empty_claims),
                num(1e6 * r.client_cpu_s / max(1, r.done), 0),
                num(1e6 * r.server_cpu_s / max(1, r.done), 0),
                f"{100 * r.others_share:.0f}%",
                "yes" if r.exact else "NO: " + "; ".join(r.problems),
            ]
        )
    print_table(
        "Every run",
        [
            "run",
            "done",
            "per process",
            "wall s",
            "fires/s",
            "write tx",
            "fires/tx",
            "empty claims",
            "client CPU us/fire",
            "server CPU us/fire",
            f"other CPU ({cores()} cores)",
            "exactly once",
        ],
        detail,
    )
    print(
        "write tx: dispatch transactions that dispatched (one per batch); the fire queue's "
        "claims, settles and heartbeats (claims that took no fire included). client CPU: the "
        "daemon or consumer processes' user+sys; server CPU: their PostgreSQL backends' (read "
        "from /proc; '-' for SQLite, which runs in the client). other CPU: the rest of the "
        "machine, this script's polling of the store included. exactly once: as many runs as "
        "slots, no slot key twice, every fire queued (dispatch) or completed by one attempt "
        "(consume)."
    )
    for r in [*dispatch, *consume]:
        if r.logged:
            print(f"\n{r.label}, the processes logged:")
            for line in r.logged:
                print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller, shorter run")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL,
        help=f"the PostgreSQL database (default: ${PG_URL_ENV} or {DEFAULT_PG_URL}); each run "
        "makes a schema of its own there and drops it",
    )
    parser.add_argument(
        "--worker", choices=["dispatch", "consume", "nodes"], help=argparse.SUPPRESS
    )
    parser.add_argument("--nodes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--shard", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["VORTOS_AUDIT_KEY"] = AUDIT_KEY  # inherited by the child processes
    quiet_logging()
    if args.worker is not None:
        if args.worker == "dispatch":
            shard = None
            if args.shard:
                index, of = args.shard.split("/")
                shard = (int(index), int(of))
            result = dispatch_worker(args.db, args.name, shard)
        elif args.worker == "nodes":
            result = nodes_worker(args.db, args.name, args.nodes)
        else:
            result = consume_worker(args.db, args.threads, args.name)
        print(json.dumps(result))
        return

    dispatch_n, consume_n = (3_000, 1_500) if args.quick else (20_000, 10_000)
    threads = QUICK_THREADS if args.quick else THREADS
    cut_s = MAX_RUN_S / 3 if args.quick else MAX_RUN_S
    problem = pg_problem(args.pg_url)
    kinds = [SQLITE] if problem else [SQLITE, POSTGRES]
    if problem:
        print(
            f"PostgreSQL skipped: {problem}.\nTo include it, start PostgreSQL (a database with "
            f"trust or password authentication) and give --pg-url or set {PG_URL_ENV}; the "
            "driver comes with pip install -e '.[postgres]'. SQLite only:",
            flush=True,
        )
    dispatch: list[Result] = []
    consume: list[Result] = []
    with scratch_dir() as folder:
        for kind in kinds:
            dispatch.append(measure_dispatch(kind, 1, dispatch_n, folder, args.pg_url, cut_s))
        if not problem:
            for n in SHARDS:
                dispatch.append(
                    measure_dispatch(POSTGRES, n, dispatch_n, folder, args.pg_url, cut_s)
                )
            nodes = [measure_nodes(n, dispatch_n, folder, args.pg_url, cut_s) for n in NODES]
        for p in PROCESSES:
            for t in threads:
                for kind in kinds:
                    consume.append(
                        measure_consume(kind, p, t, consume_n, folder, args.pg_url, cut_s)
                    )
    report(dispatch, consume, dispatch_n, consume_n)
    if not problem:
        report_nodes(nodes, dispatch_n)
    else:
        nodes = []
    wrong = [r.label for r in [*dispatch, *nodes, *consume] if not r.exact]
    print(
        "\nexactly once in every run: "
        + ("yes" if not wrong else f"NO, in {len(wrong)} ({', '.join(wrong)})")
    )


if __name__ == "__main__":
    main()

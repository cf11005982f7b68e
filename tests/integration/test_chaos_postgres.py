"""Chaos on PostgreSQL (acceptance 5 of the many-machines issue): three `vortos run` nodes,
each daemon and consumers in one process, are SIGKILLed at random at least 100 times (leader
or not, each restarted at once) while their server sessions are cut at least 50 times; every
schedule fires every second with misfire `each`. Afterwards, with the window settled:

- no slot of any schedule was dispatched twice, and none is missing from its first slot on;
- every fire of the window settled (none stuck) and completed (the command never fails, so a
  dead-lettered or failed fire is a healthy one lost to the chaos);
- every execution of a command beyond a run's last is explained by a kill of the process that
  ran it, or a cut of that process's sessions, between its start and the next execution.

The command appends each execution to a journal file (run id, attempt, pid, time), so the test
counts executions itself instead of trusting the ledger's own counters. Each node logs in as a
role of its own, so one node's sessions (pool, listener, lease) can be cut without touching
anyone else's on the shared test server.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from engine import (
    Engine,
    IntervalTrigger,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    ScheduleSpec,
    builtin_commands,
    load_app,
)
from engine.domain.audit import KeyRing
from engine.domain.timeutil import SECOND_MS
from tests.integration.chaos_app import JOURNAL_ENV
from tests.integration.processes import Daemon, wait_for
from tests.integration.test_multinode_postgres import (
    NodeRole,
    Reader,
    assert_every_slot_once,
    grid,
)
from tests.pg import PG_AUDIT_KEY, fresh_schema, pg_env

# Past the suite's 300 s: on a loaded 2-core machine the chaos alone took 180 s (each kill costs
# a Python start-up), and the backlog it leaves must then drain.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

APP = "tests.integration.chaos_app"
COMMAND = "chaos-mark"
NODES = 3
SCHEDULES = 20
KILLS = 100
CUTS = 50
LEASE_TTL = "2s"
# Threads per node: three nodes drain 8 x 10 fires/s each, four times what is due, so the
# backlog the chaos leaves (a killed node consumes nothing until it is up again) drains fast.
CONSUMERS = 8
# Long enough that a loaded machine's late heartbeat does not give a live consumer's fire
# away (a re-execution no kill explains), short enough that a killed node's fires come back
# within seconds.
CLAIM_TTL_MS = 5_000
# How long before its start a cut can still be what made an execution run again: the cut
# connection may be the one that claimed the fire.
CUT_REACH_MS = CLAIM_TTL_MS
# The whole chaos loop, however slow the machine: past this the loop itself has failed.
CHAOS_DEADLINE_S = 300.0
SETTLE_DEADLINE_S = 180.0
REPO = Path(__file__).resolve().parents[2]


def wall_ms() -> int:
    """The host's clock, which the command's journal lines use too (and, on this one host,
    the database server's)."""
    return time.time_ns() // 1_000_000


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_schema() as fresh:
        yield fresh


@pytest.fixture
def reader(url: str) -> Iterator[Reader]:
    opened = Reader(url)
    yield opened
    opened.close()


def app_engine(url: str) -> Engine:
    """An engine on `url` that knows the chaos app's command (to create its schedules)."""
    from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - the postgres extra

    keys = KeyRing([PG_AUDIT_KEY.encode()])
    storage = PostgresBackend(url, None, audit_keys=lambda: keys)
    return Engine(storage, storage.clock, load_app(APP).register_into(builtin_commands()))


def create_schedules(url: str, reader: Reader, count: int) -> dict[str, int]:
    """`count` schedules of the chaos command every second, misfire each, overlap allow; each
    one's first slot as stored at creation (nothing dispatches before the nodes start)."""
    anchor_ms = (reader.now_ms() // 1000 - 1) * 1000
    with app_engine(url) as engine:
        for i in range(count):
            engine.service.create(
                ScheduleSpec(
                    name=f"chaos{i:02d}",
                    trigger=IntervalTrigger(SECOND_MS, anchor_ms),
                    command=COMMAND,
                    misfire=MisfirePolicy(MisfireKind.EACH),
                    # A killed consumer's fire is "running" until its claim expires: the
                    # next slots must not wait for it.
                    overlap=OverlapPolicy.ALLOW,
                ),
                actor="test",
            )
    return {
        str(sid): int(first) for sid, first in reader.rows("SELECT id, next_slot_at FROM schedules")
    }


@dataclass(frozen=True, slots=True)
class Event:
    """A kill or a session cut, as the test did it."""

    kind: str  # "kill" or "cut"
    at_ms: int  # wall clock, read just before acting
    until_ms: int  # and just after: it happened in between
    pids: tuple[int, ...]  # the processes it hit
    node_ids: tuple[str, ...]
    leader: bool = False  # a kill of a node holding a lease
    terminated: int = 0  # sessions a cut terminated


@dataclass(frozen=True, slots=True)
class Execution:
    run_id: int
    attempt: int
    pid: int
    at_ms: int  # the command started
    done_ms: int | None  # and returned (None: its process died first)


@dataclass
class Cluster:
    """Three node slots, each a login role and its current `vortos run` process."""

    url: str
    reader: Reader
    log_dir: Path
    journal: Path
    shards: int
    roles: list[NodeRole] = field(default_factory=list)
    nodes: list[Daemon] = field(default_factory=list)
    generations: list[int] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    started: list[tuple[str, int]] = field(default_factory=list)  # (node id, pid), each process
    # Nodes that exited without being killed: (node id, pid, exit code, last log lines).
    self_exits: list[tuple[str, int, int, str]] = field(default_factory=list)

    def start(self) -> None:
        for i in range(NODES):
            self.roles.append(NodeRole(self.reader, self.url))
            self.generations.append(0)
            self.nodes.append(self._spawn(i))

    def _spawn(self, i: int) -> Daemon:
        env = {
            **pg_env(),
            "VORTOS_APP": APP,
            JOURNAL_ENV: str(self.journal),
            "PYTHONPATH": str(REPO),
        }
        args = (
            *("--claim-ttl", f"{CLAIM_TTL_MS // 1000}s"),
            *("--shards", str(self.shards), "--consumers", str(CONSUMERS)),
        )
        name = f"n{i}-g{self.generations[i]}"
        node = Daemon(
            self.roles[i].url, name, self.log_dir, lease_ttl=LEASE_TTL, args=args, env=env
        )
        self.started.append((name, node.pid))
        return node

    def _respawn(self, i: int) -> None:
        self.generations[i] += 1
        self.nodes[i] = self._spawn(i)

    def up(self, i: int) -> bool:
        """Started serving: past start-up, leading or standing by, consuming."""
        node = self.nodes[i]
        return node.process.poll() is None and f"vortos {node.node_id} on " in node.log

    def all_up(self) -> bool:
        return all(self.up(i) for i in range(NODES))

    def lease_holders(self) -> set[str]:
        now = self.reader.now_ms()
        return {
            str(r[0])
            for r in self.reader.rows("SELECT holder FROM leases WHERE expires_at > %s", (now,))
        }

    def revive_exited(self) -> None:
        """A node that exited by itself (a cut at start-up, say) is noted and started again."""
        for i, node in enumerate(self.nodes):
            code = node.process.poll()
            if code is not None:
                tail = "\n".join(node.log.splitlines()[-8:])
                self.self_exits.append((node.node_id, node.pid, code, tail))
                self._respawn(i)

    def kill_random(self, rng: random.Random) -> None:
        """SIGKILL one serving node, chosen at random, and start its slot again at once."""
        wait_for(lambda: any(self.up(i) for i in range(NODES)), 90, "a node to be serving", 0.05)
        serving = [i for i in range(NODES) if self.up(i)]
        i = rng.choice(serving)
        victim = self.nodes[i]
        leader = victim.node_id in self.lease_holders()
        at = wall_ms()
        victim.kill()
        self.events.append(Event("kill", at, wall_ms(), (victim.pid,), (victim.node_id,), leader))
        self._respawn(i)

    def cut_random(self, rng: random.Random) -> None:
        """Terminate every server session of one node's role (one cut in five: of all)."""
        chosen = list(range(NODES)) if rng.random() < 0.2 else [rng.randrange(NODES)]
        at = wall_ms()
        cut = dict(
            self.reader.rows(
                "SELECT usename, count(*) FROM (SELECT usename, pg_terminate_backend(pid) "
                "FROM pg_stat_activity WHERE usename = ANY(%s) AND datname = current_database() "
                "AND pid <> pg_backend_pid()) AS cut GROUP BY usename",
                ([self.roles[i].name for i in chosen],),
            )
        )
        until = wall_ms()
        # Only the processes that lost a session: a node still starting may have none.
        hit = [i for i in chosen if cut.get(self.roles[i].name, 0) > 0]
        pids = tuple(self.nodes[i].pid for i in hit)
        ids = tuple(self.nodes[i].node_id for i in hit)
        self.events.append(Event("cut", at, until, pids, ids, terminated=sum(cut.values())))

    def kills(self) -> list[Event]:
        return [e for e in self.events if e.kind == "kill"]

    def effective_cuts(self) -> list[Event]:
        return [e for e in self.events if e.kind == "cut" and e.terminated > 0]

    def stop(self) -> None:
        for node in self.nodes:
            node.terminate()
        for role in self.roles:
            role.drop()


def read_journal(journal: Path) -> dict[int, list[Execution]]:
    """Each run's executions, in the order they started."""
    started: dict[tuple[int, int, int], list[int]] = {}
    done: dict[tuple[int, int, int], int] = {}
    if journal.exists():
        for line in journal.read_text().splitlines():
            word, *numbers = line.split()
            rid, attempt, pid, at_ms = (int(n) for n in numbers)
            if word == "start":
                started.setdefault((rid, attempt, pid), []).append(at_ms)
            else:
                done[(rid, attempt, pid)] = at_ms
    by_run: dict[int, list[Execution]] = {}
    for (rid, attempt, pid), starts in started.items():
        for begun in starts:
            finished = done.get((rid, attempt, pid))
            by_run.setdefault(rid, []).append(Execution(rid, attempt, pid, begun, finished))
    for executions in by_run.values():
        executions.sort(key=lambda e: e.at_ms)
    return by_run


def unexplained(executions: Sequence[Execution], events: Sequence[Event]) -> list[Execution]:
    """The executions of one run, all but its last, that no kill or cut can have made run
    again: each needs an event of its own (a kill of its process after it started, or a cut of
    that process's sessions from a claim TTL before it started) before the next execution."""
    used: set[int] = set()
    missing: list[Execution] = []
    for e, after in itertools.pairwise(executions):
        cause = next(
            (
                k
                for k, ev in enumerate(events)
                if k not in used
                and e.pid in ev.pids
                and ev.at_ms <= after.at_ms
                and ev.until_ms >= (e.at_ms if ev.kind == "kill" else e.at_ms - CUT_REACH_MS)
            ),
            None,
        )
        if cause is None:
            missing.append(e)
        else:
            used.add(cause)
    return missing


def chaos(cluster: Cluster, rng: random.Random) -> None:
    """Kills and cuts in random order, 0.1-0.5 s apart, until there were enough of each."""
    started = time.monotonic()
    while len(cluster.kills()) < KILLS or len(cluster.effective_cuts()) < CUTS:
        if time.monotonic() - started > CHAOS_DEADLINE_S:
            raise AssertionError(
                f"chaos took over {CHAOS_DEADLINE_S}s: {len(cluster.kills())} kills, "
                f"{len(cluster.effective_cuts())} cuts"
            )
        time.sleep(rng.uniform(0.1, 0.5))
        cluster.revive_exited()
        kills_left = max(0, KILLS - len(cluster.kills()))
        cuts_left = max(0, CUTS - len(cluster.effective_cuts()))
        if rng.random() * (kills_left + cuts_left) < kills_left:
            cluster.kill_random(rng)
        else:
            cluster.cut_random(rng)


def story(run_id: int, executed: dict[int, list[Execution]], cluster: Cluster) -> str:
    """What happened to one run: its executions and every kill or cut of their processes."""
    pids = {e.pid for e in executed.get(run_id, [])}
    near = [ev for ev in cluster.events if set(ev.pids) & pids]
    return f"run {run_id}: executions {executed.get(run_id, [])}; kills/cuts of them {near}"


def dispatch_failures(reader: Reader, firsts: dict[str, int], window_end: int) -> list[str]:
    """No slot twice, none missing, a fire for every run."""
    try:
        assert_every_slot_once(reader, firsts, window_end)
    except AssertionError as exc:
        return [f"dispatch: {exc}"]
    return []


WINDOW = "r.schedule_id = ANY(%s) AND r.slot_at <= %s"


def fire_failures(
    reader: Reader,
    window: tuple[list[str], int],
    executed: dict[int, list[Execution]],
    cluster: Cluster,
) -> list[str]:
    """Every fire of the window settled, and completed."""
    failures = []
    stuck = reader.rows(
        "SELECT r.id, r.state, r.slot_at, row_to_json(f)::text FROM runs r "
        f"JOIN fire_queue f ON f.run_id = r.id WHERE {WINDOW} "
        "AND f.completed_at IS NULL AND f.discarded_at IS NULL ORDER BY r.id",
        window,
    )
    if stuck:
        failures.append(
            f"{len(stuck)} fire(s) stuck (never settled): "
            + "; ".join(f"{row} {story(row[0], executed, cluster)}" for row in stuck[:3])
        )
    # The command never fails: a fire that did not complete is a healthy one the chaos lost.
    unhealthy = reader.rows(
        "SELECT r.id, r.state, r.slot_at, r.attempts, r.abandoned, r.error FROM runs r "
        f"WHERE {WINDOW} AND r.state NOT IN ('completed', 'dispatched', 'running') "
        "ORDER BY r.id",
        window,
    )
    if unhealthy:
        states: dict[str, int] = {}
        for row in unhealthy:
            states[row[1]] = states.get(row[1], 0) + 1
        failures.append(
            f"{len(unhealthy)} healthy fire(s) not completed {states}: "
            + "; ".join(f"{row} {story(row[0], executed, cluster)}" for row in unhealthy[:3])
        )
    return failures


def execution_failures(
    runs: dict[int, str], executed: dict[int, list[Execution]], cluster: Cluster
) -> list[str]:
    """Each completed run's command returned at least once; no attempt ran twice; every
    execution before a run's last has a kill or a cut of its own to explain it."""
    failures = []
    never_finished = sorted(
        rid
        for rid, state in runs.items()
        if state == "completed" and all(e.done_ms is None for e in executed.get(rid, []))
    )
    if never_finished:
        failures.append(
            f"{len(never_finished)} run(s) completed though their command never returned: "
            + "; ".join(story(rid, executed, cluster) for rid in never_finished[:3])
        )
    twice_per_attempt = sorted(
        rid
        for rid, executions in executed.items()
        if rid in runs and len({e.attempt for e in executions}) < len(executions)
    )
    if twice_per_attempt:
        failures.append(
            f"{len(twice_per_attempt)} run(s) executed twice on one attempt: "
            + "; ".join(story(rid, executed, cluster) for rid in twice_per_attempt[:3])
        )
    again = {rid: ex for rid, ex in executed.items() if rid in runs and len(ex) > 1}
    not_explained = sorted(rid for rid, ex in again.items() if unexplained(ex, cluster.events))
    if not_explained:
        failures.append(
            f"{len(not_explained)} re-executed run(s) with no kill or cut to explain it: "
            + "; ".join(story(rid, executed, cluster) for rid in not_explained[:5])
        )
    return failures


def chaos_failures(cluster: Cluster, summary: dict[str, object]) -> list[str]:
    """The chaos was what it claims to be, and no node gave up by itself."""
    failures = []
    if len(cluster.kills()) < KILLS or len(cluster.effective_cuts()) < CUTS:
        failures.append(f"too little chaos: {summary}")
    if sum(1 for k in cluster.kills() if k.leader) < 10:
        failures.append(f"the leader was hardly ever killed: {summary}")
    # A node whose sessions were cut reconnects (issue 19, 5): it does not exit by itself.
    if cluster.self_exits:
        failures.append(
            f"{len(cluster.self_exits)} node(s) exited without being killed: "
            + "; ".join(f"{n} (pid {p}) exit {c}: {t}" for n, p, c, t in cluster.self_exits[:3])
        )
    return failures


def settle(cluster: Cluster, reader: Reader, firsts: dict[str, int], window_end: int) -> None:
    """Let every node run until the window is settled: all of its slots dispatched and every
    fire of them completed or given up on (or the deadline passed: what is missing or stuck
    then is reported with the rest)."""
    wait_for(cluster.all_up, 120, "every node to be serving again", 0.1)
    expected = sum(len(grid(first, window_end)) for first in firsts.values())

    def settled() -> bool:
        cluster.revive_exited()
        dispatched, unsettled = reader.rows(
            "SELECT count(*), count(*) FILTER (WHERE f.completed_at IS NULL "
            "AND f.discarded_at IS NULL) FROM runs r LEFT JOIN fire_queue f "
            f"ON f.run_id = r.id WHERE {WINDOW}",
            (sorted(firsts), window_end),
        )[0]
        return bool(dispatched >= expected and unsettled == 0)

    with contextlib.suppress(AssertionError):
        wait_for(settled, SETTLE_DEADLINE_S, "the window to settle", 0.5)


# The sharded run costs three minutes on two loaded cores: the suite runs the one-lease chaos
# (the acceptance test) and leaves the sharded one to a soak (VORTOS_SOAK=1); balanced shards
# under kills are also tested on their own (test_balanced_shards.py).
SHARDED_SOAK = pytest.mark.skipif(
    not os.environ.get("VORTOS_SOAK"),
    reason="the sharded chaos run takes minutes: set VORTOS_SOAK=1 to run it",
)


@pytest.mark.parametrize(
    "shards",
    [1, pytest.param(3, marks=SHARDED_SOAK)],
    ids=["one-lease", "3-shards"],
)
def test_chaos_of_kills_and_session_cuts_loses_repeats_and_strands_nothing(
    url: str, reader: Reader, tmp_path: Path, shards: int
) -> None:
    firsts = create_schedules(url, reader, SCHEDULES)
    journal = tmp_path / "journal.txt"
    cluster = Cluster(url, reader, tmp_path, journal, shards)
    rng = random.Random(19_05 + shards)
    try:
        cluster.start()
        wait_for(cluster.all_up, 120, "every node to start", 0.1)
        began = time.monotonic()
        chaos(cluster, rng)
        chaos_s = time.monotonic() - began
        window_end = reader.now_ms() - 1_000
        settle(cluster, reader, firsts, window_end)
        settle_s = time.monotonic() - began - chaos_s
    finally:
        cluster.stop()
        # For whoever reads a failure: what the test did, and which process was which node.
        (tmp_path / "events.json").write_text(
            json.dumps([asdict(e) for e in cluster.events], indent=1)
        )
        (tmp_path / "nodes.json").write_text(json.dumps(cluster.started, indent=1))

    window = (sorted(firsts), window_end)
    runs = {
        int(rid): str(state)
        for rid, state in reader.rows(f"SELECT r.id, r.state FROM runs r WHERE {WINDOW}", window)
    }
    executed = read_journal(journal)
    kills = cluster.kills()
    summary: dict[str, object] = {
        "shards": shards,
        "chaos_s": round(chaos_s, 1),
        "settle_s": round(settle_s, 1),
        "kills": len(kills),
        "leader_kills": sum(1 for k in kills if k.leader),
        "cuts": len(cluster.effective_cuts()),
        "window_runs": len(runs),
        "executions": sum(len(executed.get(rid, [])) for rid in runs),
        "re_executed_runs": sum(1 for rid in runs if len(executed.get(rid, [])) > 1),
        "self_exits": len(cluster.self_exits),
        "logs": str(tmp_path),
    }
    print(f"chaos summary: {json.dumps(summary)}")
    failures = [
        *dispatch_failures(reader, firsts, window_end),
        *fire_failures(reader, window, executed, cluster),
        *execution_failures(runs, executed, cluster),
        *chaos_failures(cluster, summary),
    ]
    assert not failures, "\n".join([json.dumps(summary), *failures])

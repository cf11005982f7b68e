"""Deployments sharing one Redis (acceptance 3 of the many-machines issue), with real `vortos
run` processes: by default each derives its key prefix from its own database, so both
dispatch; the same explicit prefix on two databases is reported by the doctor of the one that
cannot lead, naming both deployments; a prefix that cannot be a key's is refused."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from engine import IntervalTrigger, ScheduleSpec, open_engine
from engine.backends.deployment import deployment_id
from engine.domain.timeutil import SECOND_MS
from tests.conformance._lease_drivers import delete_redis_keys
from tests.conftest import run_cli
from tests.integration.processes import Daemon, wait_for
from tests.integration.test_multinode_postgres import Reader, create_schedules
from tests.pg import REDIS_URL, fresh_schema, need_redis, pg_engine, pg_env

pytestmark = pytest.mark.slow


class Deployment:
    """A database of its own (a fresh schema), its reader and its id."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.reader = Reader(url)
        with pg_engine(url) as engine:
            found = deployment_id(engine.storage)
        assert found is not None
        self.id = found

    def runs(self) -> int:
        return int(self.reader.one("SELECT count(*) FROM runs"))


@pytest.fixture
def two() -> Iterator[tuple[Deployment, Deployment]]:
    need_redis()
    with ExitStack() as stack:
        made = tuple(Deployment(stack.enter_context(fresh_schema())) for _ in range(2))
        for d in made:
            stack.callback(d.reader.conn.close)
            stack.callback(delete_redis_keys, f"vortos:{d.id}:")
        yield made[0], made[1]


def redis_env(prefix: str | None = None) -> dict[str, str]:
    env = {**pg_env(), "VORTOS_LEASE_DRIVER": "redis", "VORTOS_REDIS_URL": REDIS_URL}
    if prefix is not None:
        env["VORTOS_REDIS_PREFIX"] = prefix
    return env


def start(d: Deployment, name: str, log_dir: Path, env: dict[str, str]) -> Daemon:
    return Daemon(d.url, name, log_dir, lease_ttl="2s", env=env)


def test_two_databases_on_one_redis_both_dispatch_by_default(
    two: tuple[Deployment, Deployment], tmp_path: Path
) -> None:
    for d in two:
        create_schedules(d.url, d.reader, 2)
    assert two[0].id != two[1].id
    nodes = [start(d, f"node-{i}", tmp_path, redis_env()) for i, d in enumerate(two)]
    try:
        wait_for(lambda: all(d.runs() > 0 for d in two), 60, "both deployments to dispatch")
        for d in two:
            finding = _finding(d.url, redis_env(), "lease.redis_deployment")
            assert finding["status"] == "pass", finding
            assert f"vortos:{d.id}:" in finding["summary"], finding
    finally:
        for n in nodes:
            n.terminate()


def test_two_sqlite_files_on_one_redis_both_dispatch_by_default(tmp_path: Path) -> None:
    need_redis()
    files = [tmp_path / "a" / "vortos.db", tmp_path / "b" / "vortos.db"]
    ids = []
    anchor_ms = int(time.time()) * 1000  # a slot a second, from now
    for db in files:
        db.parent.mkdir()
        with open_engine(db) as engine:
            engine.service.create(
                ScheduleSpec("tick", IntervalTrigger(SECOND_MS, anchor_ms), "noop"), actor="test"
            )
            found = deployment_id(engine.storage)
        assert found is not None
        ids.append(found)
    assert ids[0] != ids[1]
    env = {"VORTOS_LEASE_DRIVER": "redis", "VORTOS_REDIS_URL": REDIS_URL}
    nodes = [Daemon(db, f"node-{i}", tmp_path, env=env) for i, db in enumerate(files)]

    def runs(db: Path) -> int:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
            return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])

    try:
        wait_for(lambda: all(runs(db) > 0 for db in files), 60, "both files to be dispatched")
    finally:
        for n in nodes:
            n.terminate()
        for found in ids:
            delete_redis_keys(f"vortos:{found}:")


def test_the_same_explicit_prefix_on_two_databases_is_reported_by_the_doctor(
    two: tuple[Deployment, Deployment], tmp_path: Path
) -> None:
    prefix = f"vortos-test-{secrets.token_hex(4)}:"
    env = redis_env(prefix)
    first, second = two
    for d in two:
        create_schedules(d.url, d.reader, 1)
    leader = start(first, "first-node", tmp_path, env)
    blocked = None
    try:
        wait_for(lambda: first.runs() > 0, 60, "the first deployment to dispatch")
        blocked = start(second, "second-node", tmp_path, env)
        wait_for(
            lambda: "another deployment" in blocked.log, 60, "the second node to say why it waits"
        )
        assert second.runs() == 0
        finding = _finding(second.url, env, "lease.redis_deployment")
        assert finding["status"] == "fail", finding
        said = " ".join(finding.values())
        for named in (second.id, first.id, "first-node", prefix):  # both deployments
            assert named in said, finding
    finally:
        for n in (leader, blocked):
            if n is not None:
                n.terminate()
        delete_redis_keys(prefix)


@pytest.mark.parametrize("bad", ["has space", "a/b", "x" * 65, "tab\there", "naïve:"])
def test_a_prefix_that_cannot_be_a_key_prefix_is_refused(
    two: tuple[Deployment, Deployment], bad: str
) -> None:
    done = run_cli("--db", two[0].url, "run", env=redis_env(bad), timeout=60)
    assert done.code == 2, (done.stdout, done.stderr)
    assert "VORTOS_REDIS_PREFIX" in done.stderr, done.stderr
    assert "1 to 64 letters" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert two[0].runs() == 0


def test_a_bad_redis_prefix_option_is_refused_as_the_setting_is(
    two: tuple[Deployment, Deployment],
) -> None:
    done = run_cli("--db", two[0].url, "run", "--redis-prefix", "a b", env=redis_env(), timeout=60)
    assert done.code == 2, (done.stdout, done.stderr)
    assert "--redis-prefix" in done.stderr, done.stderr
    assert "1 to 64 letters" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert two[0].runs() == 0


def _finding(url: str, env: dict[str, str], check_id: str) -> dict[str, str]:
    done = run_cli("--db", url, "doctor", "--json", env=env)
    found = [f for f in json.loads(done.stdout)["findings"] if f["check_id"] == check_id]
    assert len(found) == 1, done.stderr
    return dict(found[0])

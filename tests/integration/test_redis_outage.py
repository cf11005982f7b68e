"""A Redis lease server that is not there when `vortos run` starts is waited for, as a
database is, and said as what it is; a Redis that answers later is led on (from the attacker:
the node exited 2, a usage error, at once, naming the plug-in's module and exception class)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from engine import IntervalTrigger, ScheduleSpec, open_engine
from engine.domain.timeutil import SECOND_MS
from tests.integration.processes import Daemon, wait_for
from tests.integration.test_pg_sessions import Proxy
from tests.pg import REDIS_URL, need_redis


def test_a_redis_not_there_at_start_up_is_waited_for(tmp_path: Path) -> None:
    need_redis()
    db = tmp_path / "vortos.db"
    with open_engine(db) as engine:
        engine.service.create(
            ScheduleSpec(name="tick", trigger=IntervalTrigger(SECOND_MS, 0), command="noop"),
            actor="test",
        )
    redis = urlsplit(REDIS_URL)
    proxy = Proxy((redis.hostname or "127.0.0.1", redis.port or 6379))
    url = f"redis://127.0.0.1:{proxy.port}/{redis.path.lstrip('/') or '0'}"
    node = Daemon(db, "a", tmp_path, args=("--lease-driver", "redis", "--redis-url", url))
    try:
        wait_for(lambda: "retrying in" in node.log, 60, "the node to say it waits for Redis")
        assert node.process.poll() is None, node.log
        said = " ".join(node.log.split())
        assert "is not reachable" in said, said
        assert "failed to start" not in said, said
        assert "engine.plugins" not in said, said
        proxy.allow()
        wait_for(lambda: " leads" in node.log, 60, "the node to lead once Redis answers")
        assert node.process.poll() is None, node.log
    finally:
        node.terminate()
        proxy.close()

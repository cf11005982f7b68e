"""The real PostgreSQL and Redis servers of the test machine, and a fresh schema per test.

Tests that need a server skip, saying how to enable them, when it is not reachable; CI sets
VORTOS_TEST_REQUIRE_SERVERS=1 (see .ci/run) so that there a missing server fails instead.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from engine.api import Engine
from engine.commands import builtin_commands
from engine.domain.audit import KeyRing
from engine.domain.clock import Clock

PG_URL = os.environ.get("VORTOS_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("VORTOS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# The audit key PostgreSQL tests sign with (every node of a deployment shares one key).
PG_AUDIT_KEY = "0f" * 32


def _required() -> bool:
    return os.environ.get("VORTOS_TEST_REQUIRE_SERVERS") == "1"


@functools.cache
def pg_problem() -> str | None:
    """Why PostgreSQL cannot be used for tests, or None when it can."""
    try:
        import psycopg  # noqa: PLC0415
    except ImportError:
        return "psycopg is not installed: pip install -e '.[dev]'"
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL is not reachable at {PG_URL} ({str(exc).strip().splitlines()[0]})"
    return None


@functools.cache
def redis_problem() -> str | None:
    """Why Redis cannot be used for tests, or None when it can."""
    try:
        import redis  # noqa: PLC0415
    except ImportError:
        return "redis is not installed: pip install -e '.[dev]'"
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except (OSError, redis.RedisError) as exc:
        return f"Redis is not reachable at {REDIS_URL} ({exc})"
    return None


def need_postgres() -> None:
    """Skip (or, under CI, fail) the calling test when PostgreSQL is not there."""
    problem = pg_problem()
    if problem is None:
        return
    message = (
        f"{problem}; start PostgreSQL on 127.0.0.1:5432 with a database `test` and trust "
        "authentication (or set VORTOS_TEST_PG_URL) to run the PostgreSQL tests"
    )
    if _required():
        pytest.fail(message)
    pytest.skip(message)


def need_redis() -> None:
    """Skip (or, under CI, fail) the calling test when Redis is not there."""
    problem = redis_problem()
    if problem is None:
        return
    message = (
        f"{problem}; start Redis on 127.0.0.1:6379 (or set VORTOS_TEST_REDIS_URL) to run the "
        "Redis lease tests"
    )
    if _required():
        pytest.fail(message)
    pytest.skip(message)


def schema_url(schema: str) -> str:
    """PG_URL with `schema` first in the search_path."""
    separator = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{separator}options=-csearch_path%3D{schema}"


@contextmanager
def fresh_schema(*, migrated: bool = True) -> Iterator[str]:
    """A URL whose search_path is a new, empty schema of the test database (with the Vortos
    schema in it when `migrated`), dropped afterwards: each test has a database of its own."""
    import psycopg  # noqa: PLC0415

    from engine.backends.postgres import migrate_database  # noqa: PLC0415

    need_postgres()
    schema = f"vortos_t_{secrets.token_hex(6)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = schema_url(schema)
    try:
        if migrated:
            migrate_database(url)
        yield url
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            # Sessions still using the schema (a killed process's) must not hold the drop.
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND datname = current_database() "
                "AND query LIKE %s",
                (f"%{schema}%",),
            )
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def pg_engine(url: str, clock: Clock | None = None) -> Engine:
    """An engine on the PostgreSQL schema at `url`, signing with the tests' shared audit key
    (the clock: the database server's, unless given)."""
    from engine.backends.postgres import PostgresBackend  # noqa: PLC0415

    keys = KeyRing([PG_AUDIT_KEY.encode()])
    storage = PostgresBackend(url, clock, audit_keys=lambda: keys)
    return Engine(storage, storage.clock, builtin_commands())


def pg_env() -> dict[str, str]:
    """The environment a `vortos` process on the tests' PostgreSQL needs: the shared key."""
    return {"VORTOS_AUDIT_KEY": PG_AUDIT_KEY}

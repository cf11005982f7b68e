"""What each alternative lease driver adds to the lease contract: the advisory lock follows
its session (a killed holder is replaced at once, a hung one is evicted), every driver's
takeover reaches the row dispatch fences on, and a driver whose server is missing says so."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import psycopg
import pytest

from engine import LeaseExpired, LeaseNotOwned, ManualClock
from engine.backends.lease_drivers import lease_driver
from engine.domain.errors import InvalidInput, StorageError
from engine.ports.lease import LeasePort
from engine.ports.storage import Storage
from tests.conformance._lease_drivers import delete_redis_keys, open_driver, redis_prefix
from tests.helpers import resolver_at
from tests.pg import PG_URL

KEY = "scheduler"
TTL_MS = 30_000

on_postgres = pytest.mark.parametrize("storage", ["postgres"], indirect=True)
on_sqlite = pytest.mark.parametrize("storage", ["sqlite"], indirect=True)


class Nodes:
    """Lease drivers of one kind over one store, as separate nodes would open them."""

    def __init__(self, storage: Storage, clock: ManualClock, stack: ExitStack) -> None:
        self.storage = storage
        self.clock = clock
        self.stack = stack
        self.prefix = redis_prefix()

    def advisory(self) -> LeasePort:
        return self.stack.enter_context(open_driver("advisory", self.storage, self.clock))

    def redis(self) -> LeasePort:
        return self.stack.enter_context(
            open_driver("redis", self.storage, self.clock, prefix=self.prefix)
        )


@pytest.fixture
def nodes(storage: Storage, clock: ManualClock) -> Iterator[Nodes]:
    with ExitStack() as stack:
        opened = Nodes(storage, clock, stack)
        stack.callback(delete_redis_keys, opened.prefix)
        yield opened


def advance_ms(clock: ManualClock, ms: int) -> None:
    clock.advance(ms / 1000)


def holder_pid(storage: Storage, key: str) -> int:
    """The backend pid of the session holding `key`'s advisory lock, as recorded."""
    with psycopg.connect(storage_url(storage), autocommit=True) as conn:
        row = conn.execute("SELECT pid FROM lease_sessions WHERE key = %s", (key,)).fetchone()
    assert row is not None, f"no session recorded for {key}"
    return int(row[0])


def storage_url(storage: Storage) -> str:
    url = getattr(storage, "url", None)
    assert isinstance(url, str)
    return url


def terminate(pid: int) -> None:
    """What an administrator (or a dying network) does to a session."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


def session_alive(pid: int) -> bool:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
        return bool(row.fetchone() == (1,))


def dispatch_as(storage: Storage, clock: ManualClock, token: str) -> None:
    storage.dispatcher.dispatch_due(
        lease_key=KEY,
        token=token,
        node_id="node",
        now_ms=clock.now_ms(),
        limit=10,
        resolve=resolver_at(clock.now_ms()),
    )


# --- advisory lock: a holder's session ------------------------------------------------------


@on_postgres
def test_advisory_a_killed_holders_lease_is_free_for_another_node_at_once(nodes: Nodes) -> None:
    a, b = nodes.advisory(), nodes.advisory()
    assert a.acquire(KEY, "token-a", "node-a", TTL_MS) is not None
    assert b.acquire(KEY, "token-b", "node-b", TTL_MS) is None

    terminate(holder_pid(nodes.storage, KEY))
    taken = b.acquire(KEY, "token-b", "node-b", TTL_MS)  # the clock has not moved

    assert taken is not None
    assert b.current(KEY) == taken


@on_postgres
def test_advisory_a_killed_holders_renew_fails_once_another_node_took_over(
    nodes: Nodes,
) -> None:
    a, b = nodes.advisory(), nodes.advisory()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    terminate(holder_pid(nodes.storage, KEY))
    assert b.acquire(KEY, "token-b", "node-b", TTL_MS) is not None

    with pytest.raises(LeaseNotOwned):
        a.renew(KEY, "token-a", TTL_MS)


@on_postgres
def test_advisory_a_killed_holders_renew_fails_even_if_nobody_took_over(nodes: Nodes) -> None:
    a = nodes.advisory()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    terminate(holder_pid(nodes.storage, KEY))

    with pytest.raises(LeaseExpired, match="session holding its lock was lost"):
        a.renew(KEY, "token-a", TTL_MS)


@on_postgres
def test_advisory_a_killed_holders_dispatch_is_refused_after_the_takeover(
    nodes: Nodes, clock: ManualClock
) -> None:
    a, b = nodes.advisory(), nodes.advisory()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    terminate(holder_pid(nodes.storage, KEY))
    b.acquire(KEY, "token-b", "node-b", TTL_MS)

    with pytest.raises(LeaseNotOwned):
        dispatch_as(nodes.storage, clock, "token-a")
    dispatch_as(nodes.storage, clock, "token-b")


@on_postgres
def test_advisory_a_node_whose_session_died_acquires_again_on_a_new_one(nodes: Nodes) -> None:
    a = nodes.advisory()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    old = holder_pid(nodes.storage, KEY)
    terminate(old)

    again = a.acquire(KEY, "token-a2", "node-a", TTL_MS)

    assert again is not None
    assert holder_pid(nodes.storage, KEY) != old


@on_postgres
def test_advisory_release_frees_the_lock_for_another_node_at_once(nodes: Nodes) -> None:
    a, b = nodes.advisory(), nodes.advisory()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)

    a.release(KEY, "token-a")

    assert b.acquire(KEY, "token-b", "node-b", TTL_MS) is not None


# --- advisory lock: a holder alive but no longer renewing -----------------------------------


@on_postgres
def test_advisory_a_live_holder_is_not_evicted(nodes: Nodes, clock: ManualClock) -> None:
    a, b = nodes.advisory(), nodes.advisory()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    pid = holder_pid(nodes.storage, KEY)
    advance_ms(clock, TTL_MS - 1)

    assert b.acquire(KEY, "token-b", "node-b", TTL_MS) is None
    assert session_alive(pid)
    assert a.renew(KEY, "token-a", TTL_MS).token == "token-a"


@on_postgres
def test_advisory_a_holder_whose_lease_expired_is_evicted_by_a_contender(
    nodes: Nodes, clock: ManualClock
) -> None:
    a, b = nodes.advisory(), nodes.advisory()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)  # a's session lives on, but it stopped renewing

    taken = b.acquire(KEY, "token-b", "node-b", TTL_MS)

    assert taken is not None
    assert b.current(KEY) == taken


@on_postgres
def test_advisory_an_evicted_holders_session_is_terminated(
    nodes: Nodes, clock: ManualClock
) -> None:
    a, b = nodes.advisory(), nodes.advisory()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    pid = holder_pid(nodes.storage, KEY)
    advance_ms(clock, TTL_MS + 1)

    b.acquire(KEY, "token-b", "node-b", TTL_MS)

    assert not session_alive(pid)
    with pytest.raises(LeaseNotOwned):
        a.renew(KEY, "token-a", TTL_MS)


@on_sqlite
def test_advisory_lease_on_sqlite_is_refused_saying_it_needs_postgresql(
    storage: Storage, clock: ManualClock
) -> None:
    with pytest.raises(InvalidInput, match="needs a PostgreSQL database"):
        lease_driver("advisory", storage, clock)


# --- Redis ----------------------------------------------------------------------------------


@on_postgres
def test_redis_after_a_takeover_dispatch_refuses_the_old_token(
    nodes: Nodes, clock: ManualClock
) -> None:
    a, b = nodes.redis(), nodes.redis()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    dispatch_as(nodes.storage, clock, "token-a")
    advance_ms(clock, TTL_MS + 1)
    assert b.acquire(KEY, "token-b", "node-b", TTL_MS) is not None

    with pytest.raises(LeaseNotOwned):
        dispatch_as(nodes.storage, clock, "token-a")


@on_postgres
def test_redis_after_a_takeover_dispatch_accepts_the_new_token(
    nodes: Nodes, clock: ManualClock
) -> None:
    a, b = nodes.redis(), nodes.redis()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)
    b.acquire(KEY, "token-b", "node-b", TTL_MS)

    dispatch_as(nodes.storage, clock, "token-b")


@on_postgres
def test_redis_renew_extends_the_row_dispatch_fences_on(nodes: Nodes, clock: ManualClock) -> None:
    a = nodes.redis()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS - 1000)
    a.renew(KEY, "token-a", TTL_MS)
    advance_ms(clock, 2000)  # past the first expiry

    dispatch_as(nodes.storage, clock, "token-a")


@on_postgres
def test_redis_release_removes_the_row(nodes: Nodes, clock: ManualClock) -> None:
    a = nodes.redis()
    a.acquire(KEY, "token-a", "node-a", TTL_MS)

    a.release(KEY, "token-a")

    assert nodes.storage.leases.current(KEY) is None


@on_postgres
def test_redis_key_expires_on_redis_own_clock_too(nodes: Nodes) -> None:
    import redis  # noqa: PLC0415

    from tests.pg import REDIS_URL  # noqa: PLC0415

    nodes.redis().acquire(KEY, "token-a", "node-a", TTL_MS)

    client = redis.Redis.from_url(REDIS_URL)
    try:
        remaining = client.pttl(f"{nodes.prefix}lease:{KEY}")
    finally:
        client.close()
    assert 0 < remaining <= TTL_MS  # a holder that vanished is reclaimed by Redis itself


@on_sqlite
def test_redis_unreachable_is_a_storage_error_naming_the_url_and_the_fix(
    storage: Storage, clock: ManualClock
) -> None:
    url = "redis://127.0.0.1:1/0"  # nothing listens on port 1

    with pytest.raises(StorageError, match=r"redis://127\.0\.0\.1:1/0.*start Redis or fix"):
        lease_driver("redis", storage, clock, url)


@on_sqlite
def test_redis_url_password_is_not_shown_in_the_error(storage: Storage, clock: ManualClock) -> None:
    with pytest.raises(StorageError) as raised:
        lease_driver("redis", storage, clock, "redis://:hunter2@127.0.0.1:1/0")

    assert "hunter2" not in str(raised.value)


@on_sqlite
def test_redis_lease_without_a_url_is_invalid_input(storage: Storage, clock: ManualClock) -> None:
    with pytest.raises(InvalidInput, match="redis_url"):
        lease_driver("redis", storage, clock)


@on_sqlite
def test_an_unknown_lease_driver_is_invalid_input_listing_the_choices(
    storage: Storage, clock: ManualClock
) -> None:
    with pytest.raises(InvalidInput, match="row, advisory, redis"):
        lease_driver("zookeeper", storage, clock)


@on_sqlite
def test_the_row_driver_is_the_stores_own_lease(storage: Storage, clock: ManualClock) -> None:
    assert lease_driver("row", storage, clock) is storage.leases

"""The lease port's contract, on every backend and every lease driver (the row, a PostgreSQL
advisory lock, a Redis key)."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine import LeaseExpired, LeaseNotOwned, ManualClock
from engine.ports.lease import Lease, LeasePort
from engine.ports.storage import Storage
from tests.conformance._lease_drivers import (
    DRIVER_PARAMS,
    delete_redis_keys,
    open_driver,
    redis_prefix,
)
from tests.conformance._lease_racer import StoreAddress, address_of, race

KEY = "scheduler"
TTL_MS = 30_000

pytestmark = pytest.mark.parametrize(("storage", "driver"), DRIVER_PARAMS, indirect=["storage"])


@pytest.fixture
def leases(storage: Storage, driver: str, clock: ManualClock) -> Iterator[LeasePort]:
    """The driver under test, over the `storage` fixture's store and the manual clock."""
    with open_driver(driver, storage, clock) as opened:
        yield opened


def advance_ms(clock: ManualClock, ms: int) -> None:
    clock.advance(ms / 1000)


def token() -> str:
    return uuid.uuid4().hex


# --- acquire -------------------------------------------------------------------------------


def test_acquire_on_a_free_key_returns_a_lease(leases: LeasePort) -> None:
    lease = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    assert lease is not None
    assert leases.current(KEY) == lease


def test_acquire_is_refused_while_another_token_holds_the_key(leases: LeasePort) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is None


def test_refused_acquire_leaves_the_holder_in_place(leases: LeasePort) -> None:
    held = leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    leases.acquire(KEY, "token-b", "node-b", TTL_MS)

    assert leases.current(KEY) == held


def test_different_keys_are_independent(leases: LeasePort) -> None:
    first = leases.acquire("key-1", "token-a", "node-a", TTL_MS)
    second = leases.acquire("key-2", "token-b", "node-b", TTL_MS)

    assert first is not None
    assert second is not None
    assert leases.current("key-1") == first
    assert leases.current("key-2") == second


def test_lease_names_the_key_token_and_holder(leases: LeasePort) -> None:
    lease = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    assert lease is not None
    assert (lease.key, lease.token, lease.holder) == (KEY, "token-a", "node-a")


def test_lease_expires_ttl_after_it_was_acquired(leases: LeasePort, clock: ManualClock) -> None:
    now = clock.now_ms()

    lease = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    assert lease is not None
    assert lease.acquired_at == now
    assert lease.expires_at == now + TTL_MS


def test_acquire_by_the_holding_token_keeps_the_lease(
    leases: LeasePort, clock: ManualClock
) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS // 2)

    again = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    assert again is not None
    assert again.token == "token-a"
    assert again.expires_at == clock.now_ms() + TTL_MS
    assert leases.current(KEY) == again


# --- expiry --------------------------------------------------------------------------------


def test_current_is_none_on_a_free_key(leases: LeasePort) -> None:
    assert leases.current(KEY) is None


def test_current_is_none_once_the_lease_expired(leases: LeasePort, clock: ManualClock) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)

    assert leases.current(KEY) is None


def test_expired_lease_can_be_acquired_by_another_token(
    leases: LeasePort, clock: ManualClock
) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)

    taken = leases.acquire(KEY, "token-b", "node-b", TTL_MS)

    assert taken is not None
    assert (taken.token, taken.holder) == ("token-b", "node-b")
    assert taken.expires_at == clock.now_ms() + TTL_MS
    assert leases.current(KEY) == taken


def test_expired_lease_can_be_acquired_again_by_its_former_token(
    leases: LeasePort, clock: ManualClock
) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)

    again = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    assert again is not None
    assert again.expires_at == clock.now_ms() + TTL_MS


def test_lease_not_yet_expired_blocks_another_token(leases: LeasePort, clock: ManualClock) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS - 1)

    assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is None


# --- renew ---------------------------------------------------------------------------------


def test_renew_extends_the_expiry_from_now(leases: LeasePort, clock: ManualClock) -> None:
    acquired = leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    assert acquired is not None
    advance_ms(clock, TTL_MS // 2)

    renewed = leases.renew(KEY, "token-a", TTL_MS)

    assert renewed.expires_at == clock.now_ms() + TTL_MS
    assert renewed.expires_at > acquired.expires_at
    assert leases.current(KEY) == renewed


def test_renew_keeps_the_key_token_and_holder(leases: LeasePort, clock: ManualClock) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, 1000)

    renewed = leases.renew(KEY, "token-a", TTL_MS)

    assert (renewed.key, renewed.token, renewed.holder) == (KEY, "token-a", "node-a")


def test_renew_with_another_token_raises_not_owned(leases: LeasePort) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    with pytest.raises(LeaseNotOwned):
        leases.renew(KEY, "token-b", TTL_MS)


def test_renew_with_another_token_leaves_the_lease_unchanged(leases: LeasePort) -> None:
    held = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    with pytest.raises(LeaseNotOwned):
        leases.renew(KEY, "token-b", TTL_MS)

    assert leases.current(KEY) == held


def test_renew_of_a_free_key_raises_not_owned(leases: LeasePort) -> None:
    with pytest.raises(LeaseNotOwned):
        leases.renew(KEY, "token-a", TTL_MS)


def test_renew_after_expiry_raises_expired_even_if_nobody_took_it(
    leases: LeasePort, clock: ManualClock
) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)

    with pytest.raises(LeaseExpired):
        leases.renew(KEY, "token-a", TTL_MS)


def test_renew_after_expiry_does_not_resurrect_the_lease(
    leases: LeasePort, clock: ManualClock
) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)

    with pytest.raises(LeaseExpired):
        leases.renew(KEY, "token-a", TTL_MS)

    assert leases.current(KEY) is None
    assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is not None


def test_renew_after_another_token_took_the_expired_lease_raises_not_owned(
    leases: LeasePort, clock: ManualClock
) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)
    leases.acquire(KEY, "token-b", "node-b", TTL_MS)

    with pytest.raises(LeaseNotOwned):
        leases.renew(KEY, "token-a", TTL_MS)


def test_renewed_lease_still_blocks_a_competitor_past_the_first_expiry(
    leases: LeasePort, clock: ManualClock
) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS - 1000)
    leases.renew(KEY, "token-a", TTL_MS)
    advance_ms(clock, 2000)  # past the first expiry, within the renewed one

    assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is None
    current = leases.current(KEY)
    assert current is not None
    assert current.token == "token-a"


# --- release -------------------------------------------------------------------------------


def test_release_frees_the_key_at_once(leases: LeasePort) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    leases.release(KEY, "token-a")

    assert leases.current(KEY) is None


def test_release_allows_another_token_to_acquire_immediately(leases: LeasePort) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    leases.release(KEY, "token-a")

    taken = leases.acquire(KEY, "token-b", "node-b", TTL_MS)

    assert taken is not None
    assert taken.token == "token-b"


def test_release_of_a_free_key_is_a_no_op(leases: LeasePort) -> None:
    leases.release(KEY, "token-a")

    assert leases.current(KEY) is None


def test_release_of_an_expired_lease_is_a_no_op(leases: LeasePort, clock: ManualClock) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)

    leases.release(KEY, "token-a")

    assert leases.current(KEY) is None
    assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is not None


def test_release_of_an_expired_lease_by_another_token_is_a_no_op(
    leases: LeasePort, clock: ManualClock
) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)

    leases.release(KEY, "token-b")

    assert leases.current(KEY) is None


def test_release_twice_is_a_no_op(leases: LeasePort) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    leases.release(KEY, "token-a")

    leases.release(KEY, "token-a")

    assert leases.current(KEY) is None


def test_release_with_another_token_raises_not_owned(leases: LeasePort) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    with pytest.raises(LeaseNotOwned):
        leases.release(KEY, "token-b")


def test_release_with_another_token_leaves_the_lease_in_place(leases: LeasePort) -> None:
    held = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

    with pytest.raises(LeaseNotOwned):
        leases.release(KEY, "token-b")

    assert leases.current(KEY) == held
    assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is None


def test_release_by_a_deposed_token_leaves_the_new_holder_in_place(
    leases: LeasePort, clock: ManualClock
) -> None:
    leases.acquire(KEY, "token-a", "node-a", TTL_MS)
    advance_ms(clock, TTL_MS + 1)
    taken = leases.acquire(KEY, "token-b", "node-b", TTL_MS)

    with pytest.raises(LeaseNotOwned):
        leases.release(KEY, "token-a")

    assert leases.current(KEY) == taken


def test_acquire_release_acquire_cycle_passes_the_lease_back_and_forth(leases: LeasePort) -> None:
    assert leases.acquire(KEY, "token-a", "node-a", TTL_MS) is not None
    assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is None
    leases.release(KEY, "token-a")
    assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is not None
    assert leases.acquire(KEY, "token-a", "node-a", TTL_MS) is None
    leases.release(KEY, "token-b")
    assert leases.acquire(KEY, "token-a", "node-a", TTL_MS) is not None


# --- mutual exclusion under concurrency ----------------------------------------------------

THREADS = 8
THREAD_ROUNDS = 20


def test_threads_racing_to_acquire_a_free_key_yield_exactly_one_holder(leases: LeasePort) -> None:
    barrier = threading.Barrier(THREADS)

    def contend(key: str, contender: str) -> Lease | None:
        barrier.wait(timeout=30)  # start every acquire together
        return leases.acquire(key, contender, f"thread-{contender}", TTL_MS)

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        for round_no in range(THREAD_ROUNDS):
            key = f"thread-race-{round_no}"
            tokens = [token() for _ in range(THREADS)]
            futures = [pool.submit(contend, key, t) for t in tokens]
            winners = [f.result(timeout=60) for f in futures]
            won = [lease for lease in winners if lease is not None]

            assert len(won) == 1, f"round {round_no}: {len(won)} threads acquired {key}"
            current = leases.current(key)
            assert current is not None
            assert current.token == won[0].token


PROCESSES = 4
PROCESS_ROUNDS = 3
PROCESS_DEADLINE_S = 120.0
RACE_KEYS = [f"process-race-{n}" for n in range(PROCESS_ROUNDS)]


def test_processes_racing_to_acquire_a_free_key_yield_exactly_one_holder(
    storage: Storage, driver: str, leases: LeasePort
) -> None:
    # `leases` is not raced here: it only skips the test where the driver's server is missing.
    prefix = redis_prefix()
    address = address_of(storage, driver, prefix)
    if address is None:
        pytest.fail(
            f"{type(storage).__name__} cannot be reopened in another process: "
            "add it to tests/conformance/_lease_racer.py"
        )
    try:
        reports = _race(address)
    finally:
        if driver == "redis":
            delete_redis_keys(prefix)

    errors = [r[3] for r in reports if r[0] == "error"]
    assert not errors, "\n".join(str(e) for e in errors)
    for key in RACE_KEYS:
        winners = [r[1] for r in reports if r[0] == "won" and r[2] == key and r[3]]
        assert len(winners) == 1, f"{len(winners)} processes acquired {key}"
        seen = Counter(r[3] for r in reports if r[0] == "holder" and r[2] == key)
        assert seen == Counter({winners[0]: PROCESSES}), f"holders seen for {key}: {seen}"


def _race(address: StoreAddress) -> list[tuple[str, str, str, object]]:
    """Start the racers on `address`, and gather their reports."""
    tokens = [token() for _ in range(PROCESSES)]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    racers = [
        context.Process(target=race, args=(address, RACE_KEYS, t, barrier, results), daemon=True)
        for t in tokens
    ]
    for racer in racers:
        racer.start()
    try:
        reports = _collect(results, expected=2 * PROCESSES * PROCESS_ROUNDS)
    finally:
        for racer in racers:
            racer.join(timeout=30)
            if racer.is_alive():
                racer.kill()
    return reports


def _collect(
    results: multiprocessing.queues.Queue[tuple[str, str, str, object]], expected: int
) -> list[tuple[str, str, str, object]]:
    """Every racer's reports, or what arrived before the deadline (a racer error ends early)."""
    deadline = time.monotonic() + PROCESS_DEADLINE_S
    reports: list[tuple[str, str, str, object]] = []
    while len(reports) < expected:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"racers sent {len(reports)} of {expected} reports in time: {reports}")
        try:
            report = results.get(timeout=remaining)
        except queue.Empty:
            continue
        reports.append(report)
        if report[0] == "error":
            break
    return reports

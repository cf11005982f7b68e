"""The shipped lease suite on every backend and every lease driver (the row, a PostgreSQL
advisory lock, a Redis key mirrored into the row), and what only our stores can be put through:
racers in separate processes over the store's address."""

from __future__ import annotations

import multiprocessing
import queue
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import ClassVar

import pytest

from engine import ManualClock
from engine.ports.lease import LeasePort
from engine.ports.storage import Storage
from engine.testing.conformance.lease import LeaseConformance
from tests.conformance._backends import OnPostgres, OnSqlite
from tests.conformance._lease_drivers import delete_redis_keys, open_driver, redis_prefix
from tests.conformance._lease_racer import StoreAddress, address_of, open_store, race

PROCESSES = 4
PROCESS_ROUNDS = 3
PROCESS_DEADLINE_S = 120.0
RACE_KEYS = [f"process-race-{n}" for n in range(PROCESS_ROUNDS)]


class OurLeases(LeaseConformance):
    """A lease driver of ours over a new store of one of our backends (mixed in before it).

    The contender is another client as another node opens one: a second store on the same
    database and its own driver over it (its own advisory session, its own Redis client).
    """

    driver: ClassVar[str]
    # Where this test's store is, for contenders and racers: set by open_leases (pytest makes
    # an instance of the class per test).
    address: StoreAddress | None = None

    def open_storage(self, clock: ManualClock, directory: Path) -> AbstractContextManager[Storage]:
        raise NotImplementedError(f"{type(self).__name__} must mix in a backend")

    @contextmanager
    def open_leases(self, clock: ManualClock) -> Iterator[LeasePort]:
        prefix = redis_prefix()  # shared by every client of this test's store, deleted after
        with (
            tempfile.TemporaryDirectory(prefix="vortos-lease-") as directory,
            self.open_storage(clock, Path(directory)) as storage,
        ):
            self.address = address_of(storage, self.driver, prefix)
            try:
                with open_driver(self.driver, storage, clock, prefix=prefix) as leases:
                    yield leases
            finally:
                if self.driver == "redis":
                    delete_redis_keys(prefix)

    @contextmanager
    def open_contender(self, leases: LeasePort, clock: ManualClock) -> Iterator[LeasePort]:
        address = self._address()
        store = open_store(address, clock)
        try:
            with open_driver(self.driver, store, clock, prefix=address.redis_prefix) as contender:
                yield contender
        finally:
            store.close()

    def _address(self) -> StoreAddress:
        if self.address is None:
            pytest.fail(
                f"{type(self).__name__}'s store cannot be reopened by another client: "
                "add its backend to tests/conformance/_lease_racer.py"
            )
        return self.address

    def test_processes_racing_to_acquire_a_free_key_yield_exactly_one_holder(
        self,
        leases: LeasePort,  # not raced: it opens the store the racers reopen
    ) -> None:
        reports = _race(self._address())

        errors = [r[3] for r in reports if r[0] == "error"]
        assert not errors, "\n".join(str(e) for e in errors)
        for key in RACE_KEYS:
            winners = [r[1] for r in reports if r[0] == "won" and r[2] == key and r[3]]
            assert len(winners) == 1, f"mutual exclusion: {len(winners)} processes acquired {key}"
            seen = Counter(r[3] for r in reports if r[0] == "holder" and r[2] == key)
            assert seen == Counter({winners[0]: PROCESSES}), f"holders seen for {key}: {seen}"


class TestSqliteRow(OnSqlite, OurLeases):
    driver = "row"


class TestPostgresRow(OnPostgres, OurLeases):
    driver = "row"


class TestPostgresAdvisory(OnPostgres, OurLeases):
    driver = "advisory"


class TestPostgresRedis(OnPostgres, OurLeases):
    driver = "redis"


def _race(address: StoreAddress) -> list[tuple[str, str, str, object]]:
    """Start the racers on `address`, and gather their reports."""
    tokens = [uuid.uuid4().hex for _ in range(PROCESSES)]
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

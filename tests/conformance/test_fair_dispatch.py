"""The dispatch suite on our backends, and what it cannot check through the ports: a commit
made by another process's store wakes a waiter, PostgreSQL's listener reconnects, and the
words our refusals of lease shards use."""

from __future__ import annotations

import threading
import time

import pytest

from engine import InvalidInput
from engine.domain.audit import KeyRing
from engine.ports.storage import Storage
from engine.testing.conformance.builders import make_schedule
from engine.testing.conformance.fair_dispatch import FairDispatchConformance, dispatch_as, due
from tests.conformance._backends import SUITE_KEYS, OnPostgres, OnSqlite
from tests.conformance._lease_racer import address_of, open_store


class OurStores:
    """What needs a store's address, or our own wording: for our backends only."""

    def audit_keys(self) -> KeyRing:
        return SUITE_KEYS

    def test_a_commit_through_another_connection_wakes_a_waiter(self, storage: Storage) -> None:
        address = address_of(storage)
        assert address is not None
        other = open_store(address)
        try:
            storage.changes.wait(5.0)
            timer = threading.Timer(0.2, lambda: other.schedules.insert(make_schedule("elsewhere")))
            started = time.monotonic()
            timer.start()
            woke = storage.changes.wait(30.0)
            timer.join()
        finally:
            other.close()

        assert woke is True
        assert time.monotonic() - started < 10.0

    @pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0)])
    def test_a_shard_that_does_not_exist_is_refused_saying_so(
        self, leader: Storage, shard: tuple[int, int]
    ) -> None:
        with pytest.raises(InvalidInput, match="does not exist"):
            dispatch_as(leader, "t", shard=shard)


class TestOnSqlite(OnSqlite, OurStores, FairDispatchConformance):
    serialises_writes = True

    def test_lease_shards_are_refused_as_needing_postgresql(self, leader: Storage) -> None:
        due(leader, "acme", 40)

        with pytest.raises(InvalidInput, match="lease shards need PostgreSQL"):
            dispatch_as(leader, "t", shard=(0, 2))

        assert leader.runs.count() == 0


class TestOnPostgres(OnPostgres, OurStores, FairDispatchConformance):
    def test_the_change_feed_hears_commits_again_after_its_connection_broke(
        self, storage: Storage
    ) -> None:
        import psycopg  # noqa: PLC0415 - the postgres extra

        from engine.backends.postgres import PostgresBackend  # noqa: PLC0415
        from engine.backends.postgres.changes import LISTEN_QUERY  # noqa: PLC0415
        from engine.backends.postgres.connection import application_name  # noqa: PLC0415

        assert isinstance(storage, PostgresBackend)
        storage.changes.wait(5.0)
        with psycopg.connect(storage.url, autocommit=True) as admin:
            schema = admin.execute("SELECT current_schema()").fetchone()
            assert schema is not None
            # This process's listener: named as its other sessions, found by what it waits on.
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND query = %s AND datname = current_database()",
                (application_name(), LISTEN_QUERY),
            ).fetchall()
        assert ended == [(True,)]
        # Notifications sent while it was away are lost: reconnecting counts as a change.
        assert storage.changes.wait(30.0) is True
        assert storage.changes.wait(0.2) is False
        threading.Timer(0.2, lambda: storage.schedules.insert(make_schedule("after"))).start()
        assert storage.changes.wait(30.0) is True

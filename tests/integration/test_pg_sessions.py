"""Every engine session on PostgreSQL has server-side limits and TCP keepalives, and a session
lost (cut by the server, or a server not yet there) is retried and said as what it is, at
start-up and at runtime (issue 19, items 1 and 5)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from engine.backends.postgres import PostgresBackend
from engine.backends.postgres.advisory_lease import PostgresAdvisoryLease
from engine.backends.postgres.changes import LISTEN_QUERY
from engine.backends.postgres.connection import SESSION_SETTINGS
from engine.domain.audit import KeyRing
from tests.integration.pg_nodes import Reader, every_second, fresh_database, start_node
from tests.integration.processes import wait_for
from tests.pg import PG_AUDIT_KEY

LIMITS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
KEEPALIVES = ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")
BAD_URL_HINT = "check the host and port"


@pytest.fixture
def db() -> Iterator[tuple[str, Reader]]:
    with fresh_database() as opened:
        yield opened


def _settings(conn: psycopg.Connection[tuple[object, ...]]) -> dict[str, str]:
    names = [*LIMITS, *KEEPALIVES]
    row = conn.execute("SELECT " + ", ".join(f"current_setting('{n}')" for n in names)).fetchone()
    assert row is not None
    return dict(zip(names, (str(v) for v in row), strict=True))


def _assert_limited(conn: psycopg.Connection[tuple[object, ...]], what: str) -> None:
    found = _settings(conn)
    for name in (*LIMITS, *KEEPALIVES):
        assert found[name] not in ("0", "0ms"), f"{what}: {name} is not set ({found})"
    # SHOW gives units; the session's own value in ms / s is what was asked for.
    with conn.cursor() as cur:
        for name, value in SESSION_SETTINGS.items():
            setting = cur.execute(
                "SELECT setting FROM pg_settings WHERE name = %s", (name,)
            ).fetchone()
            assert setting is not None, name
            assert setting[0] == value, f"{what}: {name} = {setting[0]}, not {value}"
    params = conn.info.get_parameters()
    assert params.get("keepalives") == "1", f"{what}: no client keepalives ({params})"
    assert "keepalives_idle" in params, f"{what}: {params}"


def test_every_engine_session_has_timeouts_and_keepalives(db: tuple[str, Reader]) -> None:
    url, _ = db
    backend = PostgresBackend(url, audit_keys=lambda: KeyRing([PG_AUDIT_KEY.encode()]))
    try:
        _assert_limited(backend.pool.get(), "pool session")
        advisory = PostgresAdvisoryLease(backend.pool, backend.clock, backend.leases)
        try:
            with advisory._mutex:  # the session it holds its locks on
                _assert_limited(advisory._session(), "advisory lease session")
        finally:
            advisory.close()
        listener = backend.changes._connect()  # the LISTEN connection's opener
        try:
            _assert_limited(listener, "change listener")
        finally:
            listener.close()
    finally:
        backend.close()


# --- start-up --------------------------------------------------------------------------------


class Proxy:
    """A TCP port that refuses connections until `allow()`, then forwards them to the
    PostgreSQL server: a server that is not there yet, then is."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self._listener: socket.socket | None = None
        self._closed = threading.Event()

    def allow(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            self._listener.close()


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


def test_a_server_not_there_at_start_up_is_waited_for(
    db: tuple[str, Reader], tmp_path: Path
) -> None:
    url, reader = db
    every_second(url, reader)
    pg = urlsplit(url)
    proxy = Proxy((pg.hostname or "127.0.0.1", pg.port or 5432))
    a = start_node(_through(url, proxy.port), "a", tmp_path, ttl="3s")
    try:
        wait_for(lambda: "retrying in" in a.log, 30, "a to say it retries the connection")
        assert a.process.poll() is None, a.log
        assert "cannot connect to database" in a.log, a.log
        proxy.allow()
        wait_for(lambda: reader.runs_by("a") >= 2, 60, "a to connect and dispatch")
    finally:
        a.terminate()
        proxy.close()


def test_sessions_cut_during_start_up_are_retried(db: tuple[str, Reader], tmp_path: Path) -> None:
    url, reader = db
    every_second(url, reader)
    a = start_node(url, "a", tmp_path, ttl="3s")
    try:
        # Cut its sessions until it has been seen losing one (or it is already serving).
        deadline = time.monotonic() + 30
        while "lost the connection" not in a.log and time.monotonic() < deadline:
            reader.terminate_pool_sessions(a.pid)
            assert a.process.poll() is None, a.log
            time.sleep(0.02)
        assert "lost the connection" in a.log, a.log
        wait_for(lambda: reader.runs_by("a") >= 2, 60, "a to dispatch after the cuts")
        assert a.process.poll() is None, a.log
        assert BAD_URL_HINT not in a.log, a.log
    finally:
        a.terminate()


def test_a_session_cut_at_runtime_is_logged_as_a_lost_connection(
    db: tuple[str, Reader], tmp_path: Path
) -> None:
    url, reader = db
    every_second(url, reader)
    a = start_node(url, "a", tmp_path, ttl="3s")
    try:
        wait_for(lambda: reader.runs_by("a") >= 2, 30, "a to dispatch")
        deadline = time.monotonic() + 30
        while "lost the connection" not in a.log and time.monotonic() < deadline:
            reader.terminate_pool_sessions(a.pid)
            time.sleep(0.2)
        assert "lost the connection to database" in a.log, a.log
        cut_at = reader.now_ms()
        wait_for(
            lambda: reader.first_dispatch_by("a", cut_at) is not None, 30, "a to dispatch again"
        )
        assert a.process.poll() is None, a.log
        assert BAD_URL_HINT not in a.log, a.log
    finally:
        a.terminate()


def test_the_change_listener_is_named_as_its_node_and_backs_off_from_cuts(
    db: tuple[str, Reader], tmp_path: Path
) -> None:
    """The listener's session is `vortos HOST:PID` like the node's others (so cutting one
    node's sessions cuts it too); cut again and again, it reconnects with a growing delay,
    saying it lost the connection to the database, instead of logging dozens of lines a
    second."""
    url, reader = db
    every_second(url, reader)
    a = start_node(url, "a", tmp_path, ttl="3s")
    listener = "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s AND query = %s"
    named = (f"vortos %:{a.pid}", LISTEN_QUERY)
    try:
        wait_for(lambda: reader.runs_by("a") >= 2, 30, "a to dispatch")
        wait_for(lambda: bool(reader.rows(listener, named)), 30, "a's listener")
        started = time.monotonic()
        while time.monotonic() - started < 5.0:
            reader.rows(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE %s AND query = %s",
                named,
            )
            time.sleep(0.02)
        lost = a.log.count("change feed: lost the connection to database")
        assert lost >= 1, a.log
        # 0.1 s doubling to 5 s: a handful in 5 s, not one per cut (there were ~250 cuts).
        assert lost <= 8, a.log
        assert BAD_URL_HINT not in a.log, a.log
        wait_for(lambda: bool(reader.rows(listener, named)), 30, "a to listen again")
        assert a.process.poll() is None, a.log
    finally:
        a.terminate()

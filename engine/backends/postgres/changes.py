"""Wake-ups on change: LISTEN on channel `vortos`, on a connection of the feed's own.

The schema's triggers notify the channel with the schema's name when a commit changes
schedules or makes fires available (see schema.sql). One listener thread per feed counts the
notifications meant for this schema; a waiter returns as soon as the count moved since its
thread last looked, so a sleeping daemon or consumer wakes at once, and never polls the
database. A listener whose connection broke reconnects, and counts that as a change:
notifications sent while it was away are lost.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from typing import TYPE_CHECKING

from engine.backends.postgres.connection import (
    CONNECT_TIMEOUT_S,
    PgPool,
    application_name,
    connect_kwargs,
    limit_session,
)

if TYPE_CHECKING:
    import psycopg

    from engine.backends.postgres.connection import Row

log = logging.getLogger(__name__)

CHANNEL = "vortos"
# The listener's session is named as every session of the process is (`vortos HOST:PID`,
# connection.application_name), so an operator who cuts one node's sessions cuts it too; its
# query, `LISTEN vortos`, tells it apart.
LISTEN_QUERY = f"LISTEN {CHANNEL}"
# With the caller's own event to watch as well, the count is looked at this often (a lock and
# an integer, no I/O), while the event itself is waited on directly.
_LOOK_EVERY_S = 0.025
# How long a first wait lets the listener connect before it returns anyway.
_START_TIMEOUT_S = float(CONNECT_TIMEOUT_S)
_RECONNECT_FIRST_S = 0.1
_RECONNECT_MAX_S = 5.0


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PostgresChangeFeed:
    def __init__(self, pool: PgPool) -> None:
        self._pool = pool
        self._changed = threading.Condition()
        self._count = 0  # changes seen (notifications for this schema, pokes, reconnects)
        self._seen: dict[int, int] = {}
        self._listening = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        # Written to by close(): wakes the listener out of its select at once.
        self._stop_r, self._stop_w = socket.socketpair()

    def wait(self, seconds: float, wake: threading.Event | None = None) -> bool:
        self._start()
        me = threading.get_ident()
        with self._changed:
            seen = self._seen.get(me)
            if seen is None:
                # A thread's first wait has no baseline: a commit made since its last look
                # would go unseen for the whole wait. Report a change; the caller looks again.
                self._seen[me] = self._count
                return True
        deadline = time.monotonic() + max(0.0, seconds)
        while True:
            with self._changed:
                if self._count != seen:
                    self._seen[me] = self._count
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if wake is None:
                    self._changed.wait(remaining)
                    continue
            # The caller's own event is waited on directly: a worker thread finishing must
            # wake its consumer at once, not at the next look.
            if wake.wait(min(remaining, _LOOK_EVERY_S)):
                return True

    def notify(self) -> None:
        self._bump()

    def close(self) -> None:
        """Stop the listener and close its connection (waits for its thread briefly)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):  # nothing listens any more
            self._stop_w.send(b"x")
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)
        self._stop_r.close()
        self._stop_w.close()

    def _bump(self) -> None:
        with self._changed:
            self._count += 1
            self._changed.notify_all()

    def _start(self) -> None:
        """Start the listener on first need (a CLI command that never waits opens none), and
        give it a moment to listen: a first wait then reports a change, and the caller's look
        after it is followed by a listening feed."""
        if self._thread is None and not self._closed.is_set():
            with self._changed:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._listen, name="vortos-listen", daemon=True
                    )
                    self._thread.start()
            self._listening.wait(_START_TIMEOUT_S)

    def _listen(self) -> None:
        backoff = _RECONNECT_FIRST_S
        where = self._pool.where
        while not self._closed.is_set():
            try:
                conn = self._connect()
            except Exception as exc:  # noqa: BLE001 - any failure: wait and try again
                log.warning(
                    "change feed: cannot connect to database %s (%s); retrying in %.1f s",
                    where,
                    _first_line(exc),
                    backoff,
                )
                self._listening.set()  # a first wait does not wait for a server that is down
                if self._closed.wait(backoff):
                    return
                backoff = min(backoff * 2, _RECONNECT_MAX_S)
                continue
            up_since = time.monotonic()
            try:
                schema = conn.execute("SELECT current_schema()").fetchone()
                conn.execute(LISTEN_QUERY)
                # Whatever was committed before now went unheard (the first time, a first
                # wait's baseline includes this).
                self._bump()
                self._listening.set()
                self._drain(conn, None if schema is None else schema[0])
            except Exception as exc:  # noqa: BLE001 - a broken connection: reconnect
                if self._closed.is_set():
                    return
                # Backing off from a connection cut again and again (a loop of
                # pg_terminate_backend, a server refusing after login): one that stayed up a
                # while starts over from the first delay.
                if time.monotonic() - up_since > _RECONNECT_MAX_S:
                    backoff = _RECONNECT_FIRST_S
                log.warning(
                    "change feed: lost the connection to database %s (%s); reconnecting in %.1f s",
                    where,
                    _first_line(exc),
                    backoff,
                )
                if self._closed.wait(backoff):
                    return
                backoff = min(backoff * 2, _RECONNECT_MAX_S)
            finally:
                conn.close()

    def _connect(self) -> psycopg.Connection[Row]:
        import psycopg  # noqa: PLC0415 - the postgres extra

        # The engine's session limits and keepalives: a server that vanished without closing
        # the connection (a host down, a cable cut) is noticed instead of never.
        conn = psycopg.connect(
            self._pool.url,
            **connect_kwargs(self._pool.url),
            application_name=application_name(),
        )
        try:
            limit_session(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _drain(self, conn: psycopg.Connection[Row], schema: str | None) -> None:
        """Count this schema's notifications until close() or the connection breaks."""
        pgconn = conn.pgconn
        wanted = None if schema is None else schema.encode()
        stop = self._stop_r.fileno()
        while not self._closed.is_set():
            ready, _, _ = select.select([pgconn.socket, stop], [], [])
            if stop in ready:
                return
            pgconn.consume_input()  # raises once the connection is broken
            changed = False
            while (note := pgconn.notifies()) is not None:
                changed = changed or note.extra == wanted
            if changed:
                self._bump()

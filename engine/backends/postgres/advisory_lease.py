"""The lease as a session-level advisory lock, mirrored into the lease row.

Each instance keeps one connection of its own (not a pooled one) whose session holds
`pg_try_advisory_lock` on every key it leads. The server frees the lock the moment that session
ends, so a holder that crashed, or whose connection was killed, is replaced at once instead of a
TTL later. The row still carries the token and the expiry on the injected clock: dispatch fences
on it, and it tells a live session that stopped renewing (a hung process) from a working one; a
contender terminates such a session's backend (`pg_terminate_backend`, on the pid recorded in
`lease_sessions` and confirmed in `pg_locks`) and takes over.

Every row write of the holder is made on the session that holds the lock. A session's writes
all land before the server frees its lock, and a successor writes only once it has the lock, so
a deposed holder's late write can never put its token back into the row.

Tokens asking through the same instance share its session's lock; between them the row decides,
as it does for the row lease.

A standby asks again every STANDBY_RETRY_MS (`standby_retry_ms`, which the daemon reads), not
at the holder's expiry: a killed holder's socket closes, the server ends its session and frees
the lock at once, and the next ask takes it. A release notifies the change channel too. The
session has the engine's limits (connection.limit_session), and each of its transactions on the
row limits its own idle time and waits to a third of the TTL: a holder frozen between its
statements loses its transaction (and the row lock) long before its lease could lapse.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import NoReturn, TypeVar

from engine.backends.postgres.connection import (
    PgPool,
    Row,
    advisory_key,
    connect_kwargs,
    first,
    limit_session,
    redact,
    require_driver,
    scalar,
    storage_errors,
    translate,
    validate_url,
)
from engine.backends.postgres.lease import PostgresLease
from engine.domain.clock import Clock
from engine.domain.errors import LeaseExpired, LeaseNotOwned, StorageError
from engine.ports.lease import Lease

try:  # the `postgres` extra
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - PgPool and require_driver say what to install
    psycopg = None  # type: ignore[assignment]

log = logging.getLogger("vortos.postgres")
T = TypeVar("T")

# How long a contender waits for the backend it terminated to exit (and free its lock).
TERMINATE_WAIT_MS = 5000
# How often a standby tries the lock: a round trip each, and a killed holder replaced that soon.
STANDBY_RETRY_MS = 250
# A transaction on the lease row may idle, wait or run this share of the TTL at most.
_TX_LIMIT_SHARE = 3
_LIMIT_TX = (
    "SELECT set_config('idle_in_transaction_session_timeout', %(limit)s, true), "
    "set_config('statement_timeout', %(limit)s, true), set_config('lock_timeout', %(limit)s, true)"
)

_SELECT = (
    "SELECT key, token, holder, acquired_at, renewed_at, expires_at FROM leases WHERE key = %s"
)
_UPSERT = (
    "INSERT INTO leases (key, token, holder, acquired_at, renewed_at, expires_at) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO UPDATE SET "
    "token = excluded.token, holder = excluded.holder, acquired_at = excluded.acquired_at, "
    "renewed_at = excluded.renewed_at, expires_at = excluded.expires_at"
)
_RECORD_SESSION = (
    "INSERT INTO lease_sessions (key, pid) VALUES (%s, pg_backend_pid()) "
    "ON CONFLICT (key) DO UPDATE SET pid = excluded.pid"
)
# The recorded session of `key` (only while it really holds the key's lock: a pid from an old
# record may since belong to an unrelated backend) and the expiry of its lease, read in one
# snapshot: the holder writes both in one transaction, so a holder that has just committed is
# never seen recorded but without its lease.
_LOCK_HOLDER = (
    "SELECT s.pid, le.expires_at FROM lease_sessions s "
    "JOIN pg_locks l ON l.pid = s.pid LEFT JOIN leases le ON le.key = s.key "
    "WHERE s.key = %s AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid::bigint = %s AND l.objid::bigint = %s"
)


def _limit_tx(conn: psycopg.Connection[Row], ttl_ms: int) -> None:
    """Bound the open transaction's idle time, statements and lock waits (see the module)."""
    conn.execute(_LIMIT_TX, {"limit": str(max(100, ttl_ms // _TX_LIMIT_SHARE))})


class PostgresAdvisoryLease:
    """The lease on `key` held as a session advisory lock, mirrored into the `leases` row."""

    standby_retry_ms = STANDBY_RETRY_MS

    def __init__(self, url_or_pool: str | PgPool, clock: Clock, row: PostgresLease) -> None:
        require_driver()
        self.url = url_or_pool.url if isinstance(url_or_pool, PgPool) else url_or_pool
        validate_url(self.url)
        self.where = redact(self.url)
        self._clock = clock
        self._row = row
        self._mutex = threading.Lock()  # the session is used by one thread at a time
        self._conn: psycopg.Connection[Row] | None = None
        self._schema = ""
        self._held: set[str] = set()  # keys whose lock the current session holds
        with self._mutex, storage_errors(self.where):
            self._session()  # an unreachable server fails here, not at the first election

    # -- the port ---------------------------------------------------------------------------

    def acquire(self, key: str, token: str, holder: str, ttl_ms: int) -> Lease | None:
        with self._mutex:
            return self._on_session(lambda conn: self._acquire(conn, key, token, holder, ttl_ms))

    def renew(self, key: str, token: str, ttl_ms: int) -> Lease:
        with self._mutex:
            conn = self._conn
            if conn is None or self._lost() or key not in self._held:
                self._refuse_unlocked(key, token)
            try:
                with conn.transaction():
                    _limit_tx(conn, ttl_ms)
                    row = first(conn, f"{_SELECT} FOR UPDATE", (key,))
                    now = self._clock.now_ms()  # after any wait for the row
                    if row is None or row[1] != token:
                        raise LeaseNotOwned(f"lease {key} is not held by this token")
                    if row[5] <= now:
                        raise LeaseExpired(f"lease {key} expired {now - row[5]} ms ago")
                    conn.execute(
                        "UPDATE leases SET renewed_at = %s, expires_at = %s WHERE key = %s",
                        (now, now + ttl_ms, key),
                    )
                    return Lease(key, token, row[2], row[3], now, now + ttl_ms)
            except psycopg.Error as exc:
                if self._lost():
                    self._refuse_unlocked(key, token)
                raise translate(exc, self.where) from None

    def release(self, key: str, token: str) -> None:
        with self._mutex:
            self._on_session(lambda conn: self._release(conn, key, token))

    def current(self, key: str) -> Lease | None:
        return self._row.current(key)

    def close(self) -> None:
        """End the session: every lock it holds is freed (the rows expire on their own)."""
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._held.clear()

    # -- the session ------------------------------------------------------------------------

    def _session(self) -> psycopg.Connection[Row]:
        """The session holding this instance's locks, opened anew if it was lost."""
        if self._conn is not None and not self._lost():
            return self._conn
        conn: psycopg.Connection[Row] = psycopg.connect(
            self.url, **connect_kwargs(self.url), application_name="vortos-lease"
        )
        try:
            limit_session(conn)
            self._schema = str(scalar(conn, "SELECT current_schema()"))
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _lost(self) -> bool:
        """True (and the session forgotten, with every lock it held) if it is gone."""
        conn = self._conn
        if conn is None or not (conn.broken or conn.closed):
            return False
        conn.close()
        self._conn = None
        self._held.clear()
        return True

    def _on_session(self, op: Callable[[psycopg.Connection[Row]], T]) -> T:
        """`op` on the session; once more on a new one if the session turns out to have died
        since the last call (its locks died with it, which `op` then sees)."""
        try:
            return op(self._session())
        except psycopg.Error as exc:
            if not self._lost():
                raise translate(exc, self.where) from None
        try:
            return op(self._session())
        except psycopg.Error as exc:
            self._lost()
            raise translate(exc, self.where) from None

    def _lock_key(self, key: str) -> int:
        # The schema is part of the name: deployments sharing one database must not collide.
        return advisory_key(f"lease:{self._schema}.{key}")

    # -- the operations ---------------------------------------------------------------------

    def _acquire(
        self, conn: psycopg.Connection[Row], key: str, token: str, holder: str, ttl_ms: int
    ) -> Lease | None:
        fresh = key not in self._held
        if fresh:
            lock = self._lock_key(key)
            if not self._try_lock(conn, lock) and not (
                self._evict_stale(conn, key, lock) and self._try_lock(conn, lock)
            ):
                return None
            self._held.add(key)
        try:
            with conn.transaction():
                _limit_tx(conn, ttl_ms)
                row = first(conn, f"{_SELECT} FOR UPDATE", (key,))
                now = self._clock.now_ms()  # after any wait for the row: a lease not lapsed
                live = row is not None and row[5] > now
                # A lock newly obtained means its previous session is gone: its row, live or
                # not, is taken over. Within this session the row decides between tokens.
                if not fresh and live and row is not None and row[1] != token:
                    return None
                acquired = row[3] if live and row is not None and row[1] == token else now
                lease = Lease(key, token, holder, acquired, now, now + ttl_ms)
                conn.execute(
                    _UPSERT,
                    (key, token, holder, lease.acquired_at, lease.renewed_at, lease.expires_at),
                )
                conn.execute(_RECORD_SESSION, (key,))
                return lease
        except BaseException:
            if fresh and not conn.broken:
                with suppress(psycopg.Error):
                    self._unlock(conn, key)
            raise

    def _try_lock(self, conn: psycopg.Connection[Row], lock: int) -> bool:
        return bool(scalar(conn, "SELECT pg_try_advisory_lock(%s)", (lock,)))

    def _unlock(self, conn: psycopg.Connection[Row], key: str) -> None:
        self._held.discard(key)
        conn.execute("SELECT pg_advisory_unlock(%s)", (self._lock_key(key),))

    def _evict_stale(self, conn: psycopg.Connection[Row], key: str, lock: int) -> bool:
        """Terminate the session holding `key`'s lock if its lease expired on the clock (it
        is alive but no longer renewing); True when it was terminated."""
        holder = first(conn, _LOCK_HOLDER, (key, (lock >> 32) & 0xFFFFFFFF, lock & 0xFFFFFFFF))
        if holder is None:
            # No recorded holder of the lock: it is between taking the lock and committing
            # its lease (or between releasing them), not stale.
            return False
        pid, expires_at = holder
        if expires_at is not None and expires_at > self._clock.now_ms():
            return False  # a live holder
        log.warning(
            "lease %s: its holder's session (backend %s) is alive but its lease expired; "
            "terminating it",
            key,
            pid,
        )
        try:
            return bool(
                scalar(conn, "SELECT pg_terminate_backend(%s, %s)", (pid, TERMINATE_WAIT_MS))
            )
        except pg_errors.InsufficientPrivilege:
            raise StorageError(
                f"database {self.where}: lease {key} is held by a stale session (backend {pid}) "
                "that this role may not terminate; run every node as the same role, or grant "
                "this one pg_signal_backend"
            ) from None

    def _release(self, conn: psycopg.Connection[Row], key: str, token: str) -> None:
        row = first(conn, _SELECT, (key,))
        if row is not None and row[1] != token and row[5] > self._clock.now_ms():
            raise LeaseNotOwned(f"lease {key} is held by {row[2]}, not by this token")
        if key in self._held:
            # Unlock first: a contender that takes the lock in between writes its own row,
            # which the deletes below (of this token, of this session) leave alone.
            self._unlock(conn, key)
        with conn.transaction():
            conn.execute("DELETE FROM leases WHERE key = %s AND token = %s", (key, token))
            conn.execute(
                "DELETE FROM lease_sessions WHERE key = %s AND pid = pg_backend_pid()", (key,)
            )
            # Standbys asleep in the change feed wake at the commit and take the lock.
            conn.execute("SELECT pg_notify('vortos', current_schema())")

    def _refuse_unlocked(self, key: str, token: str) -> NoReturn:
        """Renewal by a token whose session does not hold the lock: raise what the contract
        asks for."""
        with storage_errors(self.where):
            row = first(self._session(), _SELECT, (key,))
        now = self._clock.now_ms()
        if row is None or row[1] != token:
            raise LeaseNotOwned(f"lease {key} is not held by this token")
        if row[5] <= now:
            raise LeaseExpired(f"lease {key} expired {now - row[5]} ms ago")
        raise LeaseExpired(
            f"lease {key}: the database session holding its lock was lost (the server "
            "restarted, or the session was terminated); acquire it again"
        )

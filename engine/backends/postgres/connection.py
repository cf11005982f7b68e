"""Connecting to PostgreSQL: database URLs, one pooled connection per thread, errors that say
what to do, and the schema's version.

The engine's stores are written like the SQLite ones: a thread takes "its" connection, reads in
autocommit, and writes inside `write_tx`, which nests as a savepoint inside a transaction the
thread already has open (the service's unit of work: a change and its audit entry together).
The connections come from a psycopg-pool pool, checked out per thread; a connection that broke
(the server restarted, an administrator ran pg_terminate_backend) is handed back to the pool,
which discards it, and the thread's next call gets a fresh one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from engine.backends.postgres.dialect import DIALECT
from engine.backends.sql import Args
from engine.domain.errors import DatabaseUnavailable, StorageError, VortosError
from engine.domain.redact import redact_url, remember, scrub, scrub_echoes

try:  # the `postgres` extra
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError:  # pragma: no cover - exercised on machines without the extra
    psycopg = None  # type: ignore[assignment]

SCHEMA_VERSION = 5
# Serialises `vortos db migrate` runs (and first-time creators) on one database.
MIGRATE_LOCK = 0x566F7274  # "Vort"
CONNECT_TIMEOUT_S = 10
POOL_MAX = 16
# A connection checked out by a thread is held while the thread lives; more threads than this
# wait up to the timeout for one (a clear error, not a hang).
POOL_TIMEOUT_S = 30.0
MIGRATE_HINT = "run `vortos --db URL db migrate` to create or upgrade it"

# Every engine session (the pool's, the advisory lease's, the change listener's) is opened with
# these server-side limits, so nothing a stuck client holds outlives them: a statement, a wait
# for a lock, a transaction left idle (a process frozen or partitioned mid-transaction: the
# server ends its session and frees its locks). The hot lease paths tighten them further, to
# the lease's own remaining life (dispatch, the lease statements). A migration lifts them.
STATEMENT_TIMEOUT_MS = 60_000
LOCK_TIMEOUT_MS = 10_000
IDLE_IN_TRANSACTION_TIMEOUT_MS = 15_000
# TCP keepalives on both ends: the server notices a client host that vanished (and frees its
# locks) and the client a server that did, in about idle + interval x count seconds instead of
# the kernel's two hours.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
SESSION_SETTINGS: dict[str, str] = {
    "statement_timeout": str(STATEMENT_TIMEOUT_MS),
    "lock_timeout": str(LOCK_TIMEOUT_MS),
    "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_TIMEOUT_MS),
    "tcp_keepalives_idle": str(KEEPALIVE_IDLE_S),
    "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL_S),
    "tcp_keepalives_count": str(KEEPALIVE_COUNT),
}
_SET_SESSION = "SELECT " + ", ".join(
    f"set_config('{name}', %s, false)" for name in SESSION_SETTINGS
)
# libpq's client-side keepalives, unless the URL sets its own.
_CLIENT_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": KEEPALIVE_IDLE_S,
    "keepalives_interval": KEEPALIVE_INTERVAL_S,
    "keepalives_count": KEEPALIVE_COUNT,
}
# How libpq and the server say a session ended under the client (server restart, backend
# terminated, network cut), as opposed to a connection that could never be made.
_LOST_MARKERS = (
    "server closed the connection unexpectedly",
    "terminating connection",
    "connection is lost",
    "the connection is closed",
    "consuming input failed",
    "could not receive data from server",
    "could not send data to server",
    "connection reset",
    "broken pipe",
    "ssl syscall error",
    "eof detected",
    "idle-in-transaction timeout",
)
# A server that is not (yet) there: refused, unreachable, starting up or shutting down.
_UNREACHABLE_MARKERS = (
    "connection refused",
    "timeout expired",
    "no route to host",
    "network is unreachable",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
)

Row = tuple[Any, ...]
log = logging.getLogger("vortos.postgres")


# The one redactor's, under the name the PostgreSQL modules (and their users) import.
redact = redact_url


def application_name() -> str:
    """Who a server-side session belongs to, for operators reading pg_stat_activity (and tests
    that cut one process's connections): host:pid, as the default node id."""
    return f"vortos {socket.gethostname()}:{os.getpid()}"[:63]


def require_driver() -> None:
    if psycopg is None:
        raise StorageError(
            "PostgreSQL needs the `postgres` extra: pip install 'vortos[postgres]' "
            "(psycopg 3 and psycopg-pool)"
        )


def schema_sql() -> str:
    return resources.files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")


def translate(exc: Exception, where: str, url: str | None = None) -> StorageError:
    """Turn psycopg's complaint into an operator's message. libpq may quote pieces of the URL
    it connected with: given `url`, any piece of its password is scrubbed out."""
    said = scrub(str(exc)) if url is None else scrub_echoes(str(exc), url)
    text = said.strip().splitlines()[0] if said.strip() else type(exc).__name__
    if isinstance(exc, PoolTimeout):
        return DatabaseUnavailable(
            f"database {where}: no connection could be made within {POOL_TIMEOUT_S:.0f}s; "
            "check that the server is up and reachable, and that it accepts this many clients"
        )
    if isinstance(exc, pg_errors.UndefinedTable):
        return StorageError(f"database {where} has no Vortos schema ({text}); {MIGRATE_HINT}")
    if isinstance(exc, pg_errors.InvalidCatalogName):
        return StorageError(
            f"database {where}: {text}; create it (createdb) or fix the database name in the URL"
        )
    if isinstance(exc, pg_errors.InvalidPassword | pg_errors.InvalidAuthorizationSpecification):
        return StorageError(f"database {where}: {text}; fix the user or password in the URL")
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return StorageError(
            f"database {where}: {text}; grant this role the privileges Vortos needs, or use "
            "the role that ran `vortos db migrate`"
        )
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return StorageError(
            f"database {where} is read-only here ({text}); point --db at the primary"
        )
    if _session_lost(exc, said):
        return DatabaseUnavailable(f"lost the connection to database {where}: {_detail(said)}")
    if isinstance(exc, psycopg.OperationalError):
        return _connect_error(said, where)
    return StorageError(f"database {where}: {text}")


def _session_lost(exc: Exception, said: str) -> bool:
    """Whether `exc` ended a session that was working (not a connection never made)."""
    if isinstance(
        exc,
        pg_errors.AdminShutdown
        | pg_errors.CrashShutdown
        | pg_errors.IdleInTransactionSessionTimeout,
    ):
        return True
    if not isinstance(exc, psycopg.OperationalError) or said.lstrip().startswith(
        "connection failed"
    ):
        return False
    lowered = said.lower()
    return any(marker in lowered for marker in _LOST_MARKERS)


def _detail(message: str) -> str:
    """libpq's first line, without its prefixes."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    detail = lines[0] if lines else "connection failed"
    for prefix in ("connection failed: ", "connection is bad: ", "consuming input failed: "):
        detail = detail.removeprefix(prefix)
    if "FATAL:" in detail:
        detail = detail.split("FATAL:", 1)[1].strip()
    return detail


def connect_kwargs(url: str) -> dict[str, Any]:
    """What every engine connection is opened with besides the URL: autocommit, the connect
    timeout, libpq's TCP keepalives (unless the URL chose its own)."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    keepalives = {k: v for k, v in _CLIENT_KEEPALIVES.items() if k not in given}
    return {"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S, **keepalives}


def limit_session(conn: psycopg.Connection[Row]) -> None:
    """Give a new engine session its server-side limits (SESSION_SETTINGS), in one round
    trip. The connection must be in autocommit (or the settings would end with a rollback)."""
    conn.execute(_SET_SESSION, tuple(SESSION_SETTINGS.values()))


def _connect_error(message: str, where: str) -> StorageError:
    """libpq's connection failures carry no SQLSTATE: the remedy is chosen from the text."""
    detail = _detail(message)
    lowered = detail.lower()
    if any(marker in lowered for marker in _UNREACHABLE_MARKERS):
        # Down, restarting, or not where the URL says: only time tells which.
        return DatabaseUnavailable(
            f"cannot connect to database {where}: {detail}; check that the server is running "
            "and accepts connections from this host (it may be restarting), and the URL's host "
            "and port"
        )
    if "database" in lowered and "does not exist" in lowered:
        remedy = "create it (createdb NAME) or fix the database name in the URL"
    elif "role" in lowered and "does not exist" in lowered:
        remedy = "fix the user in the URL, or create the role"
    elif "password" in lowered or "authentication" in lowered:
        remedy = "fix the user or password in the URL (or the server's pg_hba.conf)"
    elif "translate host name" in lowered or "name or service not known" in lowered:
        remedy = "fix the host name in the URL"
    elif lowered.startswith("invalid ") or "connection option" in lowered:
        # libpq refusing a parameter of the URL (`invalid sslmode value`, `invalid connection
        # option`, `invalid integer value`) before connecting: not the host, port or server.
        remedy = "fix that option in the URL (see libpq's connection parameters)"
    else:
        remedy = (
            "check the host and port in the URL, and that the server is running and accepts "
            "connections from this host"
        )
    return StorageError(f"cannot connect to database {where}: {detail}; {remedy}")


@contextmanager
def storage_errors(where: str) -> Iterator[None]:
    """Translate psycopg errors raised inside the block into StorageError."""
    try:
        yield
    except VortosError:
        raise
    except psycopg.Error as exc:
        raise translate(exc, where) from None
    except PoolTimeout as exc:
        raise translate(exc, where) from None


# Written so that the redactor, which masks whatever follows `user:` in a URL anywhere in a
# message, leaves the form whole (`user[:password]@` was shown as `user[:***@`).
URL_FORM = "postgresql://user@host:5432/database?options (user:password@ where it needs a password)"


def validate_url(url: str) -> None:
    """Refuse a URL libpq would misread, before any connection is tried."""
    remember(url)  # whatever later quotes a piece of it, the password is scrubbed
    try:
        urlsplit(url).port  # noqa: B018 - a port that is not a number raises here
        psycopg.conninfo.conninfo_to_dict(url)
    except (psycopg.ProgrammingError, ValueError) as exc:
        raise StorageError(
            f"invalid PostgreSQL URL {redact(url)}: {scrub_echoes(str(exc).strip(), url)}; "
            f"the form is {URL_FORM}"
        ) from None
    if not urlsplit(url).path.strip("/"):
        raise StorageError(
            f"invalid PostgreSQL URL {redact(url)}: it names no database; the form is {URL_FORM}"
        )


class PgPool:
    """One connection per thread from a psycopg-pool pool, opened lazily, replaced when broken
    (the SqlPool the shared store code runs on)."""

    dialect = DIALECT

    def __init__(self, url: str, *, readonly: bool = False, max_size: int = POOL_MAX) -> None:
        require_driver()
        validate_url(url)
        self.url = url
        self.where = redact(url)
        self.readonly = readonly
        self._local = threading.local()
        self._probe()
        self._pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
            url,
            min_size=0,
            max_size=max_size,
            open=False,
            timeout=POOL_TIMEOUT_S,
            kwargs={**connect_kwargs(url), "application_name": application_name()},
            configure=self._configure,
            name="vortos",
        )
        self._pool.open(wait=False)

    def _configure(self, conn: psycopg.Connection[Row]) -> None:
        conn.autocommit = True
        limit_session(conn)
        if self.readonly:
            # A reader (the CLI's reads, the doctor) cannot write even by mistake.
            conn.execute("SET default_transaction_read_only = on")

    def _probe(self) -> None:
        """One direct connection first: a wrong host, database, user or password is reported
        at once, with the server's reason, instead of as a pool timeout after retries."""
        try:
            psycopg.connect(self.url, **connect_kwargs(self.url)).close()
        except psycopg.Error as exc:
            raise translate(exc, self.where, self.url) from None

    def get(self) -> psycopg.Connection[Row]:
        """This thread's connection (a new one if it had none or its one broke)."""
        conn: psycopg.Connection[Row] | None = getattr(self._local, "conn", None)
        if conn is not None and (conn.broken or conn.closed):
            self.release_current()
            conn = None
        if conn is None:
            with storage_errors(self.where):
                conn = self._pool.getconn()
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()  # a previous holder left it mid-transaction
            self._local.conn = conn
        return conn

    def read(self, sql: str, args: Args = ()) -> list[Row]:
        conn = self.get()
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            # Outside a transaction a read can be asked again: a session the server ended
            # since this thread last used it (a restart, pg_terminate_backend) costs nothing
            # but a new connection.
            try:
                return conn.execute(sql, args).fetchall()
            except psycopg.Error as exc:
                error = translate(exc, self.where)
                if not (conn.broken and isinstance(error, DatabaseUnavailable)):
                    raise error from None
                log.warning("%s; reading again on a new connection", error)
                self.release_current()
        with storage_errors(self.where):
            return self.get().execute(sql, args).fetchall()

    def write(self, sql: str, args: Args = ()) -> int:
        with self.transaction() as conn:
            return int(conn.execute(sql, args).rowcount)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Row]]:
        conn = self.get()
        with storage_errors(self.where), write_tx(conn):
            yield conn

    def release_current(self) -> None:
        """Give this thread's connection back (a thread that is about to end, or a broken one:
        the pool discards a broken connection)."""
        conn: psycopg.Connection[Row] | None = getattr(self._local, "conn", None)
        if conn is None:
            return
        self._local.conn = None
        try:
            self._pool.putconn(conn)
        except Exception:  # noqa: BLE001 - a pool already closed takes nothing back
            conn.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Row]]:
        """A connection of its own for the block (not this thread's), e.g. for LISTEN."""
        with storage_errors(self.where), self._pool.connection() as conn:
            yield conn

    def close(self) -> None:
        self._local = threading.local()
        self._pool.close()


@contextmanager
def write_tx(conn: psycopg.Connection[Row]) -> Iterator[psycopg.Connection[Row]]:
    """A transaction (READ COMMITTED), committed at the end of the block and rolled back on any
    exception; inside one already open on this connection, a savepoint of it, so the outer
    one decides whether everything lands."""
    with conn.transaction():
        yield conn


def rows(
    conn: psycopg.Connection[Row], sql: str, args: tuple[Any, ...] | list[Any] = ()
) -> list[Row]:
    return conn.execute(sql, args).fetchall()


def first(
    conn: psycopg.Connection[Row], sql: str, args: tuple[Any, ...] | list[Any] = ()
) -> Row | None:
    return conn.execute(sql, args).fetchone()


def scalar(conn: psycopg.Connection[Row], sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
    row = first(conn, sql, args)
    return None if row is None else row[0]


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for pg_advisory_*lock from a name (not hashtext, whose
    values may change between server versions)."""
    return int.from_bytes(
        hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True
    )


# --- the schema ------------------------------------------------------------------------------


def schema_version(conn: psycopg.Connection[Row]) -> int | None:
    """The version recorded in vortos_meta of the connection's current schema, or None when the
    schema holds no Vortos tables."""
    exists = scalar(
        conn,
        "SELECT count(*) FROM information_schema.tables "
        "WHERE table_schema = current_schema() AND table_name = 'vortos_meta'",
    )
    if not exists:
        return None
    value = scalar(conn, "SELECT value FROM vortos_meta WHERE key = 'schema_version'")
    return None if value is None else int(value)


def check_schema(conn: psycopg.Connection[Row], where: str) -> None:
    """Refuse a database whose schema is missing, older or newer than this Vortos's."""
    current = scalar(conn, "SELECT current_schema()")
    if current is None:
        raise StorageError(
            f"database {where}: no schema of the search_path exists; create it "
            "(CREATE SCHEMA ...) or fix search_path, then run `vortos db migrate`"
        )
    version = schema_version(conn)
    if version is None:
        raise StorageError(
            f"database {where} (schema {current}) has no Vortos schema; {MIGRATE_HINT}"
        )
    if version > SCHEMA_VERSION:
        raise StorageError(
            f"database {where}: its Vortos schema (version {version}) is newer than this Vortos "
            f"understands ({SCHEMA_VERSION}); upgrade vortos"
        )
    if version < SCHEMA_VERSION:
        raise StorageError(
            f"database {where}: its Vortos schema is version {version}, this Vortos needs "
            f"{SCHEMA_VERSION}; {MIGRATE_HINT}"
        )


def migrate(conn: psycopg.Connection[Row], where: str) -> tuple[int | None, int]:
    """Create the schema, or upgrade it to SCHEMA_VERSION, in one transaction serialised with
    any other migrator. Returns (version before, version after); before is None when created.
    A schema that holds tables of another application is refused, untouched."""
    from engine.backends.postgres.migrations import MIGRATIONS  # noqa: PLC0415

    with write_tx(conn):
        # A migration may wait for another one and rewrite big tables: no engine limit on it.
        conn.execute(
            "SELECT set_config('lock_timeout', '0', true), "
            "set_config('statement_timeout', '0', true), "
            "set_config('idle_in_transaction_session_timeout', '0', true)"
        )
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
        current = scalar(conn, "SELECT current_schema()")
        if current is None:
            raise StorageError(
                f"database {where}: no schema of the search_path exists; create it "
                "(CREATE SCHEMA ...) or fix search_path"
            )
        version = schema_version(conn)
        if version is None:
            others = [
                r[0]
                for r in rows(
                    conn,
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() ORDER BY table_name LIMIT 5",
                )
            ]
            if others:
                raise StorageError(
                    f"database {where}: schema {current} holds other tables "
                    f"({', '.join(others)}) and no Vortos schema; Vortos will not touch it: "
                    "use another schema (options=-csearch_path=NAME in the URL) or database"
                )
            conn.execute(schema_sql())
            _stamp(conn, SCHEMA_VERSION)
            return None, SCHEMA_VERSION
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"database {where}: its Vortos schema (version {version}) is newer than this "
                f"Vortos understands ({SCHEMA_VERSION}); upgrade vortos"
            )
        missing = [v for v in range(version + 1, SCHEMA_VERSION + 1) if v not in MIGRATIONS]
        if missing:
            raise StorageError(
                f"no upgrade path from schema version {version} to {SCHEMA_VERSION} "
                f"(missing {missing}); restore a backup"
            )
        for step in range(version + 1, SCHEMA_VERSION + 1):
            conn.execute(MIGRATIONS[step])
        _stamp(conn, SCHEMA_VERSION)
        return version, SCHEMA_VERSION


def _stamp(conn: psycopg.Connection[Row], version: int) -> None:
    conn.execute(
        "INSERT INTO vortos_meta (key, value) VALUES ('schema_version', %s) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (str(version),),
    )

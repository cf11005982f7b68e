"""Opening a SQLite database file safely: refuse what is not ours, create or upgrade what is.

One apsw connection per thread (apsw connections must not be shared across threads while a
statement runs). Writes always start with BEGIN IMMEDIATE: a deferred BEGIN that later needs the
write lock can only fail, never wait, when another connection wrote meanwhile.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import apsw

from engine.backends.sql import Args
from engine.backends.sqlite.dialect import DIALECT
from engine.domain.errors import DatabaseUnreadable, StorageError, VortosError
from engine.file_modes import create_private, current_file_access

APPLICATION_ID = 0x566F7274  # "Vort"
SCHEMA_VERSION = 13
SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 5000
CACHE_KIB = 64 * 1024

# Upgrades from version N-1 to N, applied in order inside one transaction. schema.sql is always
# the newest version; each entry here is frozen once released (a test checks that upgrading the
# oldest schema gives exactly what schema.sql creates).
MIGRATIONS: dict[int, str] = {
    # Execution: static schedules, retry policies, the run life cycle, claims and settlements.
    2: """
ALTER TABLE schedules ADD COLUMN origin TEXT NOT NULL DEFAULT 'dynamic'
    CHECK (origin = 'dynamic' OR origin = 'static');
ALTER TABLE schedules ADD COLUMN retry TEXT NOT NULL DEFAULT '{}';
ALTER TABLE runs ADD COLUMN started_at INTEGER;
ALTER TABLE runs ADD COLUMN consumer TEXT;
ALTER TABLE runs ADD COLUMN exit_code INTEGER;
ALTER TABLE runs ADD COLUMN output TEXT;
ALTER TABLE runs ADD COLUMN abandoned INTEGER NOT NULL DEFAULT 0;
CREATE TRIGGER runs_legal_transition BEFORE UPDATE OF state ON runs
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'dispatched' AND (NEW.state = 'running' OR NEW.state = 'skipped'
                                      OR NEW.state = 'cancelled' OR NEW.state = 'dead_lettered'))
    OR (OLD.state = 'running' AND (NEW.state = 'completed' OR NEW.state = 'failed'
                                   OR NEW.state = 'dead_lettered' OR NEW.state = 'cancelled'
                                   OR NEW.state = 'dispatched' OR NEW.state = 'skipped'))
    OR ((OLD.state = 'failed' OR OLD.state = 'dead_lettered') AND NEW.state = 'dispatched')
)
BEGIN
    SELECT RAISE(ABORT, 'illegal run state transition');
END;
ALTER TABLE fire_queue ADD COLUMN consecutive_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fire_queue ADD COLUMN reschedules INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fire_queue ADD COLUMN abandoned_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fire_queue ADD COLUMN last_abandoned_by TEXT;
ALTER TABLE fire_queue ADD COLUMN last_abandoned_at INTEGER;
ALTER TABLE fire_queue ADD COLUMN stale_ack_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fire_queue ADD COLUMN last_stale_ack_by TEXT;
ALTER TABLE fire_queue ADD COLUMN last_stale_ack_at INTEGER;
ALTER TABLE fire_queue ADD COLUMN discard_reason TEXT;
ALTER TABLE fire_queue ADD COLUMN cancel_requested_at INTEGER;
ALTER TABLE fire_queue ADD COLUMN requeued_at_attempt INTEGER NOT NULL DEFAULT 0;
CREATE INDEX fire_queue_open_by_schedule ON fire_queue (schedule_id, available_at)
    WHERE completed_at IS NULL AND discarded_at IS NULL;
CREATE INDEX fire_queue_claimed ON fire_queue (schedule_id)
    WHERE lease_token IS NOT NULL;
CREATE INDEX fire_queue_dead ON fire_queue (discarded_at)
    WHERE discarded_at IS NOT NULL;
""",
    # The console: its header counts schedules by state on every refresh.
    3: """
CREATE INDEX schedules_inactive ON schedules (status) WHERE status <> 'active';
""",
    # Governance: the audit chain.
    4: """
CREATE TABLE audit_entries (
    chain       TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    event       TEXT NOT NULL,
    actor       TEXT NOT NULL,
    tenant      TEXT,
    schedule_id TEXT,
    slot_key    TEXT,
    at          INTEGER NOT NULL,
    data        TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL,
    key_id      TEXT NOT NULL,
    signature   TEXT NOT NULL,
    PRIMARY KEY (chain, seq)
) WITHOUT ROWID;
CREATE TRIGGER audit_entries_no_update BEFORE UPDATE ON audit_entries
BEGIN
    SELECT RAISE(ABORT, 'the audit chain is append-only');
END;
CREATE TRIGGER audit_entries_no_delete BEFORE DELETE ON audit_entries
BEGIN
    SELECT RAISE(ABORT, 'the audit chain is append-only');
END;
CREATE TABLE audit_checkpoints (
    chain     TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    hash      TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    signature TEXT NOT NULL,
    PRIMARY KEY (chain, seq)
) WITHOUT ROWID;
CREATE TABLE audit_verified (
    chain       TEXT PRIMARY KEY,
    seq         INTEGER NOT NULL,
    hash        TEXT NOT NULL,
    verified_at INTEGER NOT NULL,
    key_id      TEXT NOT NULL,
    signature   TEXT NOT NULL
) WITHOUT ROWID;
""",
    # Governance: operators and their roles.
    5: """
CREATE TABLE operator_grants (
    operator   TEXT NOT NULL,
    role       TEXT NOT NULL
               CHECK (role = 'viewer' OR role = 'operator' OR role = 'approver'
                      OR role = 'admin'),
    tenant     TEXT NOT NULL,
    granted_by TEXT NOT NULL,
    granted_at INTEGER NOT NULL,
    PRIMARY KEY (operator, role, tenant)
) WITHOUT ROWID;
""",
    # Governance: four-eyes approval requests.
    6: """
CREATE TABLE approvals (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    schedule     TEXT NOT NULL,
    operation    TEXT NOT NULL,
    digest       TEXT NOT NULL,
    change       TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    requested_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    state        TEXT NOT NULL
                 CHECK (state = 'pending' OR state = 'approved' OR state = 'rejected'
                        OR state = 'consumed'),
    decided_by   TEXT,
    decided_at   INTEGER,
    reason       TEXT,
    consumed_at  INTEGER
) WITHOUT ROWID;
CREATE INDEX approvals_by_digest ON approvals (tenant, digest, state);
""",
    # Tenants: a fair share of each dispatch transaction per tenant.
    7: """
-- Fair dispatch: when one tenant has more due than its share of a dispatch transaction, the
-- others' due schedules are found here, tenant by tenant, wherever they sit in the due order.
CREATE INDEX schedules_due_by_tenant ON schedules (tenant, next_fire_at)
    WHERE status = 'active' AND next_fire_at IS NOT NULL;
""",
    # Static overrides: what the code declares, and an operator's pause or resume that outlives
    # deploys. A static schedule paused before this version was paused by an operator.
    8: """
ALTER TABLE schedules ADD COLUMN declared_paused INTEGER NOT NULL DEFAULT 0;
ALTER TABLE schedules ADD COLUMN override TEXT;
UPDATE schedules
   SET override = json_object('state', 'paused', 'by', 'an operator (before overrides were kept)',
                              'at', updated_at, 'note', pause_note)
 WHERE origin = 'static' AND status = 'paused';
""",
    # Retention: per-tenant overrides of how long run history is kept (0: a legal hold).
    # IF NOT EXISTS: a file stamped back to an older version (as tests do to replay an
    # upgrade) may hold the table already.
    9: """
CREATE TABLE IF NOT EXISTS retention_overrides (
    tenant TEXT PRIMARY KEY,
    days   INTEGER NOT NULL CHECK (days >= 0),
    reason TEXT,
    set_by TEXT NOT NULL,
    set_at INTEGER NOT NULL
) WITHOUT ROWID;
""",
    # Plug-ins: audit sinks' positions and plug-in health.
    10: """
-- Plug-ins (engine.plugins): how far each audit sink's copy reaches in each chain, and each
-- node's latest report on its plug-ins' health (what `vortos doctor` shows).
CREATE TABLE IF NOT EXISTS audit_sink_positions (
    sink       TEXT NOT NULL,
    chain      TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (sink, chain)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS plugin_health (
    node_id       TEXT NOT NULL,
    port          TEXT NOT NULL,
    plugin        TEXT NOT NULL,
    calls         INTEGER NOT NULL,
    failures      INTEGER NOT NULL,
    timeouts      INTEGER NOT NULL,
    dropped       INTEGER NOT NULL,
    busy_since    INTEGER,
    backlog       INTEGER NOT NULL,
    last_error    TEXT,
    last_error_at INTEGER,
    reported_at   INTEGER NOT NULL,
    PRIMARY KEY (node_id, port, plugin)
) WITHOUT ROWID;
""",
    # The audit chain at scale: key lineage and identity, seals, chain openings, anchors.
    11: """
ALTER TABLE audit_entries ADD COLUMN seal TEXT;
-- Epoch seals and rotations of each chain (a verification resuming from a mark checks the
-- newest one below it): partial, so no other entry writes it.
CREATE INDEX audit_entries_transitions ON audit_entries (chain, seq)
WHERE event = 'audit.epoch_sealed' OR event = 'audit.key_rotated';
-- The highest run id ever used, once the run that held it was deleted (an edit withdrew it
-- unrun, retention pruned it): SQLite would hand out a deleted largest id again, and an audit
-- entry that names a run id must name that run forever. PostgreSQL's sequence never reuses.
CREATE TABLE run_id_floor (
    one   INTEGER PRIMARY KEY CHECK (one = 1),
    floor INTEGER NOT NULL
);
CREATE TRIGGER runs_id_floor AFTER DELETE ON runs
WHEN OLD.id > coalesce((SELECT floor FROM run_id_floor), 0)
BEGIN
    INSERT OR REPLACE INTO run_id_floor (one, floor) VALUES (1, OLD.id);
END;
-- The database's identity and its audit key lineage (engine.domain.audit_keys): epoch 0 is
-- the root key, recorded by the first process that needs a key; each later epoch's public key
-- is endorsed by the epoch before. Only public halves and fingerprints are stored.
CREATE TABLE audit_identity (
    one         INTEGER PRIMARY KEY CHECK (one = 1),
    database_id TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE TABLE audit_keys (
    epoch       INTEGER PRIMARY KEY,
    key_id      TEXT NOT NULL UNIQUE,
    public_key  TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind = 'root' OR kind = 'evolved' OR kind = 'rotated'),
    started_at  INTEGER NOT NULL,
    endorsement TEXT NOT NULL
);
-- Each chain and the sequence of its opening entry (the entries before it predate openings).
CREATE TABLE audit_chains (
    chain      TEXT PRIMARY KEY,
    opened_seq INTEGER NOT NULL
) WITHOUT ROWID;
-- Where each chain's archived part ends: the entries up to seq were sealed into an archive
-- and may be pruned; verification resumes from this signed point.
CREATE TABLE audit_anchors (
    chain     TEXT PRIMARY KEY,
    seq       INTEGER NOT NULL,
    hash      TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    at        INTEGER NOT NULL,
    signature TEXT NOT NULL,
    archive   TEXT NOT NULL
) WITHOUT ROWID;
DROP TRIGGER audit_entries_no_delete;
CREATE TRIGGER audit_entries_no_delete BEFORE DELETE ON audit_entries
WHEN OLD.seq > coalesce((SELECT seq FROM audit_anchors WHERE chain = OLD.chain), 0)
BEGIN
    SELECT RAISE(ABORT, 'the audit chain is append-only: only archived entries may go');
END;
""",
    12: """
-- Trigger kinds are registered in code (engine.domain.triggers), not listed in a CHECK: the
-- schedules table is rebuilt without it (SQLite cannot drop a CHECK in place), its rows and
-- indexes as they were. Columns are named: an upgraded file added them in its own order.
CREATE TABLE schedules_rebuilt (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    name         TEXT NOT NULL,
    -- A kind registered in engine.domain.triggers: data, not a CHECK list, so a new trigger
    -- type needs no table rebuild.
    trigger_kind TEXT NOT NULL,
    trigger_spec TEXT NOT NULL,                 -- JSON, see engine.domain.triggers
    timezone     TEXT NOT NULL,                 -- IANA name
    command      TEXT NOT NULL,
    payload      TEXT NOT NULL,                 -- canonical JSON object
    misfire      TEXT NOT NULL,                 -- JSON {kind, catch_up_cap, max_age_ms, grace_ms}
    overlap      TEXT NOT NULL,
    jitter_ms    INTEGER NOT NULL DEFAULT 0,
    -- CHECKs are written as OR chains: an IN list builds a temporary index at every insert,
    -- which tripled the cost of a dispatch.
    status       TEXT NOT NULL
                 CHECK (status = 'active' OR status = 'paused' OR status = 'disabled'),
    sensitive    INTEGER NOT NULL DEFAULT 0,
    metadata     TEXT NOT NULL DEFAULT '{}',
    pause_note   TEXT,
    version      INTEGER NOT NULL,              -- optimistic lock on the definition
    next_slot_at INTEGER,                       -- cursor: first slot not yet resolved
    next_fire_at INTEGER,                       -- when that slot is due (slot + jitter)
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    -- 'static': declared in code with @scheduled and synced at start (only pause/resume at
    -- runtime); 'dynamic': created through the service.
    origin       TEXT NOT NULL DEFAULT 'dynamic'
                 CHECK (origin = 'dynamic' OR origin = 'static'),
    retry        TEXT NOT NULL DEFAULT '{}',    -- JSON {max_attempts, backoff_ms, backoff_cap_ms}
    -- Static schedules: the code declares it paused (@scheduled(paused=True)) ...
    declared_paused INTEGER NOT NULL DEFAULT 0,
    -- ... and an operator's pause or resume that outlives deploys until cleared:
    -- JSON {state, by, at, note}, or NULL.
    override     TEXT,
    UNIQUE (tenant, name)
);
INSERT INTO schedules_rebuilt (
    id, tenant, name, trigger_kind, trigger_spec, timezone, command, payload, misfire,
    overlap, jitter_ms, status, sensitive, metadata, pause_note, version, next_slot_at,
    next_fire_at, created_at, updated_at, origin, retry, declared_paused, override
)
SELECT
    id, tenant, name, trigger_kind, trigger_spec, timezone, command, payload, misfire,
    overlap, jitter_ms, status, sensitive, metadata, pause_note, version, next_slot_at,
    next_fire_at, created_at, updated_at, origin, retry, declared_paused, override
FROM schedules;
DROP TABLE schedules;
ALTER TABLE schedules_rebuilt RENAME TO schedules;
-- The due scan reads only this index: its cost follows the number due, not the number stored.
CREATE INDEX schedules_due ON schedules (next_fire_at)
    WHERE status = 'active' AND next_fire_at IS NOT NULL;

-- Fair dispatch: when one tenant has more due than its share of a dispatch transaction, the
-- others' due schedules are found here, tenant by tenant, wherever they sit in the due order.
CREATE INDEX schedules_due_by_tenant ON schedules (tenant, next_fire_at)
    WHERE status = 'active' AND next_fire_at IS NOT NULL;

-- The console counts schedules by state on every refresh: the few that are not active are read
-- here, the active ones are the rest. Partial, so it never serves (nor slows) an active-only
-- query such as the due scan, and dispatch never writes it.
CREATE INDEX schedules_inactive ON schedules (status) WHERE status <> 'active';
""",
    # Issue 19: per-schedule command time limits, a fire's failures and consumer deaths counted
    # apart (fire_queue.failures, abandoned_at_requeue), the `timed_out` run state (the runs
    # table rebuilt: SQLite cannot change a CHECK in place; columns named, an upgraded file
    # added them in its own order), and the node registry that shares lease shards out.
    13: """
ALTER TABLE schedules ADD COLUMN timeout_ms INTEGER;
ALTER TABLE fire_queue ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fire_queue ADD COLUMN abandoned_at_requeue INTEGER NOT NULL DEFAULT 0;
CREATE TABLE runs_rebuilt (
    id            INTEGER PRIMARY KEY,
    tenant        TEXT NOT NULL,
    schedule_id   TEXT NOT NULL,
    schedule_name TEXT NOT NULL,
    slot_key      TEXT NOT NULL,
    slot_at       INTEGER NOT NULL,
    due_at        INTEGER NOT NULL,
    kind          TEXT NOT NULL
                  CHECK (kind = 'scheduled' OR kind = 'manual' OR kind = 'backfill'),
    state         TEXT NOT NULL
                  CHECK (state = 'dispatched' OR state = 'running' OR state = 'completed'
                         OR state = 'failed' OR state = 'dead_lettered' OR state = 'skipped'
                         OR state = 'cancelled' OR state = 'timed_out'),
    dispatched_at INTEGER NOT NULL,
    node_id       TEXT NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    finished_at   INTEGER,
    error         TEXT,
    started_at    INTEGER,                     -- the latest attempt's start
    consumer      TEXT,                        -- who ran (or runs) the latest attempt
    exit_code     INTEGER,                     -- process commands
    output        TEXT,                        -- tail of what the command printed or returned
    abandoned     INTEGER NOT NULL DEFAULT 0,  -- attempts whose consumer vanished
    -- The slot key alone decides "already dispatched": unique per tenant. slot_at is a function
    -- of the key (the key spells the instant), so leading with it changes nothing about what is
    -- unique, and makes every dispatch append at the end of this index instead of writing one
    -- random page per fire.
    UNIQUE (slot_at, slot_key, tenant)
);
INSERT INTO runs_rebuilt (
    id, tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, kind, state,
    dispatched_at, node_id, attempts, finished_at, error, started_at, consumer, exit_code,
    output, abandoned
)
SELECT
    id, tenant, schedule_id, schedule_name, slot_key, slot_at, due_at, kind, state,
    dispatched_at, node_id, attempts, finished_at, error, started_at, consumer, exit_code,
    output, abandoned
FROM runs;
DROP TABLE runs;
ALTER TABLE runs_rebuilt RENAME TO runs;
-- A schedule's history, newest first, and its last slot. The ledger as a whole is read in id
-- order (the order of dispatch), so it needs no index on time: every index costs each dispatch.
CREATE INDEX runs_by_schedule ON runs (schedule_id, slot_at);

-- The store, not only the code, enforces the run life cycle (see engine.domain.run):
-- dispatched -> running | skipped | cancelled | dead_lettered;
-- running -> completed | failed | dead_lettered | cancelled | timed_out
--            | dispatched (retry, release)
--            | skipped (an abandoned attempt of a schedule paused meanwhile);
-- failed | dead_lettered | timed_out -> dispatched (requeue). completed, skipped, cancelled
-- are final.
CREATE TRIGGER runs_legal_transition BEFORE UPDATE OF state ON runs
WHEN NEW.state <> OLD.state AND NOT (
       (OLD.state = 'dispatched' AND (NEW.state = 'running' OR NEW.state = 'skipped'
                                      OR NEW.state = 'cancelled' OR NEW.state = 'dead_lettered'))
    OR (OLD.state = 'running' AND (NEW.state = 'completed' OR NEW.state = 'failed'
                                   OR NEW.state = 'dead_lettered' OR NEW.state = 'cancelled'
                                   OR NEW.state = 'dispatched' OR NEW.state = 'skipped'
                                   OR NEW.state = 'timed_out'))
    OR ((OLD.state = 'failed' OR OLD.state = 'dead_lettered' OR OLD.state = 'timed_out')
        AND NEW.state = 'dispatched')
)
BEGIN
    SELECT RAISE(ABORT, 'illegal run state transition');
END;
CREATE TRIGGER runs_id_floor AFTER DELETE ON runs
WHEN OLD.id > coalesce((SELECT floor FROM run_id_floor), 0)
BEGIN
    INSERT OR REPLACE INTO run_id_floor (one, floor) VALUES (1, OLD.id);
END;
-- The nodes of a deployment, each beating while it runs (engine.runtime.nodes): lease shards
-- are shared out among the live ones, and a node started with another shard count is refused.
CREATE TABLE nodes (
    node_id      TEXT PRIMARY KEY,
    shards       INTEGER NOT NULL,  -- the shard count it runs with
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,  -- live until then unless it beats again
    lease_driver TEXT NOT NULL DEFAULT 'row'  -- how it holds its leases: every node the same
);
""",
}


def schema_sql() -> str:
    """schema.sql: inside the wheel as engine/schema.sql, beside the package in a checkout."""
    packaged = resources.files("engine").joinpath("schema.sql")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parents[3] / "schema.sql").read_text(encoding="utf-8")


def _refuse(
    path: Path, problem: str, remedy: str, kind: type[StorageError] = StorageError
) -> StorageError:
    return kind(f"cannot use database {path}: {problem}; {remedy}")


def inspect_path(path: Path, *, create: bool) -> bool:
    """Check the path before SQLite touches it. Returns True when the file exists already."""
    if path.is_dir():
        raise _refuse(path, "it is a directory", f"give a file path such as {path / 'vortos.db'}")
    if not path.exists():
        if not create:
            raise StorageError(
                f"no database at {path}: create it with `vortos --db {path} db init` "
                "(or add a schedule, which creates it)"
            )
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise _refuse(path, f"directory {parent} does not exist", "create it first")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise _refuse(
                path,
                f"directory {parent} is not writable",
                "choose a writable location or fix its permissions",
            )
        return False
    if not os.access(path, os.R_OK):
        raise _refuse(path, "the file is not readable", "fix its permissions")
    with path.open("rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    if header and header != SQLITE_HEADER:
        raise _refuse(
            path,
            "it is not a SQLite database (wrong file header)",
            "point --db at a Vortos database, or at a new file name",
        )
    return True


# Waits between tries for a lock another process holds: short at first (a dispatch or claim
# transaction lasts a few ms), longer while it stays held. SQLite's own busy timeout sleeps
# 1, 2, 5, 10 ... 100 ms, so consumer processes sharing one file spent most of a contended
# second asleep after the lock was free.
_BUSY_WAITS_S = (0.0002, 0.0005, 0.001, 0.001, 0.002, 0.002, 0.005)


def busy_handler(timeout_ms: int) -> Callable[[int], bool]:
    """A busy handler giving up after `timeout_ms` of tries for one lock."""
    started: list[float] = [0.0]

    def retry(prior_calls: int) -> bool:
        now = time.monotonic()
        if prior_calls == 0:
            started[0] = now
        elif (now - started[0]) * 1000 >= timeout_ms:
            return False
        time.sleep(_BUSY_WAITS_S[min(prior_calls, len(_BUSY_WAITS_S) - 1)])
        return True

    return retry


def connect(
    path: Path,
    *,
    readonly: bool,
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    fine_busy: bool = True,
) -> apsw.Connection:
    """A configured connection. Raises StorageError for anything SQLite refuses."""
    flags = (
        apsw.SQLITE_OPEN_READONLY
        if readonly
        else (apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
    )
    try:
        conn = apsw.Connection(str(path), flags=flags)
        if fine_busy:
            conn.set_busy_handler(busy_handler(busy_timeout_ms))
        else:
            # Creating or upgrading a file (and switching it to WAL, which needs it alone):
            # SQLite's longer sleeps leave room for the one lock no other process may share.
            conn.set_busy_timeout(busy_timeout_ms)
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        if not readonly:
            conn.execute("PRAGMA synchronous = NORMAL")
    except apsw.Error as exc:
        raise translate(exc, path) from None
    return conn


def translate(exc: apsw.Error, path: Path) -> StorageError:
    """Turn SQLite's complaint into an operator's message."""
    if isinstance(exc, apsw.NotADBError):
        return _refuse(
            path,
            "it is not a SQLite database",
            "point --db at a Vortos database",
            DatabaseUnreadable,
        )
    if isinstance(exc, apsw.CorruptError):
        return _refuse(path, "the file is corrupt", "restore it from a backup", DatabaseUnreadable)
    if isinstance(exc, apsw.IOError):
        return _refuse(
            path, f"reading or writing it failed ({exc})", "check the disk", DatabaseUnreadable
        )
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        return StorageError(
            f"database {path} stayed locked by another process past the busy timeout; "
            "try again, or find the process holding it"
        )
    if isinstance(exc, apsw.ReadOnlyError):
        return _refuse(
            path,
            "it is read-only here",
            "use a writable location, or fix the file's and directory's permissions; where "
            "changes go through `vortos run --control-socket`, set VORTOS_CONTROL_SOCKET",
        )
    if isinstance(exc, apsw.CantOpenError):
        return _refuse(
            path,
            "SQLite cannot open it (or its -wal/-shm files)",
            "check that the file and its directory are readable and writable",
            DatabaseUnreadable,
        )
    if isinstance(exc, apsw.FullError):
        return _refuse(path, "the disk is full", "free some space")
    return StorageError(f"database {path}: {exc}")


Row = tuple[Any, ...]


def rows(conn: apsw.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[Row]:
    """All rows of a query (typed loosely: SQLite values are dynamically typed)."""
    return list(conn.execute(sql, args))


def first(conn: apsw.Connection, sql: str, args: tuple[Any, ...] = ()) -> Row | None:
    """The first row of a query, or None."""
    row: Row | None = conn.execute(sql, args).fetchone()
    return row


def scalar(conn: apsw.Connection, sql: str, args: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row (None when there is no row)."""
    row = first(conn, sql, args)
    return None if row is None else row[0]


@contextmanager
def write_tx(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception.

    Inside a transaction already open on this connection (the service's unit of work: a
    change and its audit entry together), it is a savepoint of that transaction instead, so
    the outer one decides whether everything lands."""
    if not conn.get_autocommit():
        conn.execute("SAVEPOINT vortos_inner")
        try:
            yield conn
        except BaseException:
            if not conn.get_autocommit():
                conn.execute("ROLLBACK TO vortos_inner")
                conn.execute("RELEASE vortos_inner")
            raise
        conn.execute("RELEASE vortos_inner")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def prepare(path: Path, *, create: bool, write: bool) -> None:
    """Make sure `path` holds a current Vortos schema: create, upgrade, or refuse.

    Nothing is written to a file that turns out not to be ours. The look and the change happen
    in one transaction, so processes opening a new file at the same moment create it once.
    """
    existed = inspect_path(path, create=create)
    if not existed and write:
        _create_file(path)
    conn = connect(path, readonly=not write and existed, fine_busy=False)
    created = False
    try:
        if write and conn.readonly("main"):
            raise _refuse(
                path,
                "it is read-only here",
                "use a writable location, or fix the file's permissions; where changes go "
                "through `vortos run --control-socket`, set VORTOS_CONTROL_SOCKET",
            )
        # A write transaction serialises creators and upgraders; a reader takes a snapshot so
        # it never sees a schema half-stamped by another process.
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            created = _create_or_check(conn, path, write=write)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if created:
            conn.execute("PRAGMA journal_mode = WAL")  # only outside a transaction
    except apsw.Error as exc:
        raise translate(exc, path) from None
    finally:
        conn.close()


def _create_file(path: Path) -> None:
    """The new database file at its private mode, whatever the umask (SQLite gives its -wal
    and -shm the database's mode, and, run as root, its owner and group)."""
    try:
        os.close(create_private(path, current_file_access()))
    except FileExistsError:
        pass  # another process made it a moment ago: the schema is made once, below
    except OSError as exc:
        raise _refuse(
            path, f"it cannot be created ({exc.strerror})", "check the directory"
        ) from None


def _create_or_check(conn: apsw.Connection, path: Path, *, write: bool) -> bool:
    """Inside the caller's transaction: refuse, create (True) or upgrade the schema."""
    app_id = scalar(conn, "PRAGMA application_id")
    version = scalar(conn, "PRAGMA user_version")
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    if app_id != APPLICATION_ID:
        if tables or app_id != 0:
            shown = ", ".join(sorted(tables)[:5]) or f"application id {app_id:#x}"
            raise _refuse(
                path,
                f"it belongs to another application ({shown})",
                "Vortos will not touch it: point --db at another file",
            )
        if not write:
            raise StorageError(f"database {path} is empty: run `vortos --db {path} db init`")
        conn.execute(schema_sql())
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return True
    if version > SCHEMA_VERSION:
        raise _refuse(
            path,
            f"its schema (version {version}) is newer than this Vortos "
            f"understands ({SCHEMA_VERSION})",
            "upgrade vortos",
        )
    if version < SCHEMA_VERSION:
        if not write:
            raise StorageError(
                f"database {path} has schema version {version}; this Vortos needs "
                f"{SCHEMA_VERSION}: run `vortos --db {path} db init` to upgrade it in place"
            )
        _migrate(conn, version, MIGRATIONS, SCHEMA_VERSION)
    return False


def upgrade(conn: apsw.Connection, current: int, migrations: dict[int, str], target: int) -> None:
    """Apply migrations current+1 .. target in one transaction: all of them or none."""
    with write_tx(conn):
        _migrate(conn, current, migrations, target)


def _migrate(conn: apsw.Connection, current: int, migrations: dict[int, str], target: int) -> None:
    missing = [v for v in range(current + 1, target + 1) if v not in migrations]
    if missing:
        raise StorageError(
            f"no upgrade path from schema version {current} to {target} (missing {missing}); "
            "restore a backup or recreate the database"
        )
    for version in range(current + 1, target + 1):
        conn.execute(migrations[version])
    conn.execute(f"PRAGMA user_version = {target}")


_WRITERS: dict[str, threading.RLock] = {}
_WRITERS_LOCK = threading.Lock()


def writer_lock(path: Path) -> threading.RLock:
    """The lock this process's writers of `path` take for a write transaction (reentrant:
    a thread already writing takes a savepoint, not a second transaction)."""
    key = os.path.realpath(path)
    with _WRITERS_LOCK:
        found = _WRITERS.get(key)
        if found is None:
            found = _WRITERS[key] = threading.RLock()
        return found


class ConnectionPool:
    """One connection per thread to one file, opened lazily and closed together (the
    SqlPool the shared store code runs on)."""

    dialect = DIALECT

    def __init__(
        self,
        path: Path,
        *,
        readonly: bool = False,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        on_open: Callable[[apsw.Connection], None] | None = None,
    ) -> None:
        self.path = path
        self.readonly = readonly
        self.busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._all: list[apsw.Connection] = []
        self._lock = threading.Lock()
        self._on_open = on_open

    def get(self) -> apsw.Connection:
        conn: apsw.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path, readonly=self.readonly, busy_timeout_ms=self.busy_timeout_ms)
            if self._on_open is not None:
                self._on_open(conn)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def read(self, sql: str, args: Args = ()) -> list[Row]:
        with self._renewed_when_unreadable(), storage_errors(self.path):
            return list(self.get().execute(sql, args))

    @contextmanager
    def _renewed_when_unreadable(self) -> Iterator[None]:
        """A connection that met an unreadable file is closed: SQLite keeps it failing with
        'not a database' even once the file reads right again (seen after a moment of a bad
        header with the WAL checkpointed away), where a fresh one reads the file anew."""
        try:
            yield
        except DatabaseUnreadable:
            conn: apsw.Connection | None = getattr(self._local, "conn", None)
            if conn is not None and conn.get_autocommit():
                self.release_current()
            raise

    def write(self, sql: str, args: Args = ()) -> int:
        with self.transaction() as conn:
            conn.execute(sql, args)
            return int(conn.changes())

    @contextmanager
    def transaction(self) -> Iterator[apsw.Connection]:
        conn = self.get()
        if not conn.get_autocommit():  # a savepoint of this thread's open transaction
            with storage_errors(self.path), write_tx(conn):
                yield conn
            return
        # One writer at a time per file in this process: threads queue here and start the
        # moment the previous transaction ends, instead of in SQLite's busy handler, which
        # sleeps 1, 2, 5 ... 100 ms between tries (a consumer settling and the daemon
        # dispatching in one `vortos run` waited there). Other processes still meet the busy
        # handler.
        lock = writer_lock(self.path)
        # Bounded like SQLite's own wait: a writer stuck behind another thread past the busy
        # timeout gets the same retryable error, never a wait that cannot end.
        if not lock.acquire(timeout=self.busy_timeout_ms / 1000):
            raise StorageError(
                f"database {self.path} stayed locked by another writer of this process past "
                "the busy timeout; try again"
            )
        try:
            with self._renewed_when_unreadable(), storage_errors(self.path), write_tx(conn):
                yield conn
        finally:
            lock.release()

    def release_current(self) -> None:
        """Close this thread's connection (a thread that is about to end)."""
        conn: apsw.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            return
        self._local.conn = None
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)
        conn.close()

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()


@contextmanager
def storage_errors(path: Path) -> Iterator[None]:
    """Translate SQLite errors raised inside the block into StorageError."""
    try:
        yield
    except VortosError:
        raise
    except apsw.Error as exc:
        raise translate(exc, path) from None

-- Vortos embedded schema (SQLite). The engine applies it to a new file and stamps
-- PRAGMA application_id (0x566F7274, "Vort") and PRAGMA user_version (the schema version).
-- Instants are integer milliseconds since the Unix epoch, UTC.

CREATE TABLE vortos_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE schedules (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    name         TEXT NOT NULL,
    -- CHECKs are written as OR chains: an IN list builds a temporary index at every insert,
    -- which tripled the cost of a dispatch.
    trigger_kind TEXT NOT NULL
                 CHECK (trigger_kind = 'cron' OR trigger_kind = 'interval' OR trigger_kind = 'once'),
    trigger_spec TEXT NOT NULL,                 -- JSON, see engine.domain.triggers
    timezone     TEXT NOT NULL,                 -- IANA name
    command      TEXT NOT NULL,
    payload      TEXT NOT NULL,                 -- canonical JSON object
    misfire      TEXT NOT NULL,                 -- JSON {kind, catch_up_cap, max_age_ms, grace_ms}
    overlap      TEXT NOT NULL,
    jitter_ms    INTEGER NOT NULL DEFAULT 0,
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
    UNIQUE (tenant, name)
);

-- The due scan reads only this index: its cost follows the number due, not the number stored.
CREATE INDEX schedules_due ON schedules (next_fire_at)
    WHERE status = 'active' AND next_fire_at IS NOT NULL;

CREATE TABLE runs (
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
                         OR state = 'cancelled'),
    dispatched_at INTEGER NOT NULL,
    node_id       TEXT NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    finished_at   INTEGER,
    error         TEXT,
    -- The slot key alone decides "already dispatched": unique per tenant. slot_at is a function
    -- of the key (the key spells the instant), so leading with it changes nothing about what is
    -- unique, and makes every dispatch append at the end of this index instead of writing one
    -- random page per fire.
    UNIQUE (slot_at, slot_key, tenant)
);

-- A schedule's history, newest first, and its last slot. The ledger as a whole is read in id
-- order (the order of dispatch), so it needs no index on time: every index costs each dispatch.
CREATE INDEX runs_by_schedule ON runs (schedule_id, slot_at);

-- One fire per run, keyed by the run's id; the slot key and the rest of the run are in `runs`.
CREATE TABLE fire_queue (
    run_id        INTEGER PRIMARY KEY REFERENCES runs (id),
    tenant        TEXT NOT NULL,
    schedule_id   TEXT NOT NULL,
    slot_at       INTEGER NOT NULL,
    command       TEXT NOT NULL,
    payload       TEXT NOT NULL,
    available_at  INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    lease_token   TEXT,
    consumed_till INTEGER,
    consumed_by   TEXT,
    completed_at  INTEGER,
    discarded_at  INTEGER,
    last_error    TEXT
);

CREATE INDEX fire_queue_open ON fire_queue (available_at)
    WHERE completed_at IS NULL AND discarded_at IS NULL;

CREATE TABLE leases (
    key         TEXT PRIMARY KEY,
    token       TEXT NOT NULL,
    holder      TEXT NOT NULL,
    acquired_at INTEGER NOT NULL,
    renewed_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;

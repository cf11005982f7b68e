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
    -- How long one attempt of its command may run (NULL: the command's own limit, if any).
    timeout_ms   INTEGER,
    UNIQUE (tenant, name)
);

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
    last_error    TEXT,
    -- Settlement bookkeeping, as in a job store: streaks, abandonment, stale acks.
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    reschedules          INTEGER NOT NULL DEFAULT 0,
    abandoned_count      INTEGER NOT NULL DEFAULT 0,
    last_abandoned_by    TEXT,
    last_abandoned_at    INTEGER,
    stale_ack_count      INTEGER NOT NULL DEFAULT 0,
    last_stale_ack_by    TEXT,
    last_stale_ack_at    INTEGER,
    discard_reason       TEXT,
    cancel_requested_at  INTEGER,               -- cancel-other asked the holder to stop
    -- attempts when an operator last requeued it: the retry budget starts over from there
    requeued_at_attempt  INTEGER NOT NULL DEFAULT 0,
    -- What the two budgets count since the last requeue: failed attempts that were retried
    -- (the retry budget; never a reschedule, a release or a dead consumer), and
    -- abandoned_count then (the consumer-death budget counts the abandonments after it).
    failures             INTEGER NOT NULL DEFAULT 0,
    abandoned_at_requeue INTEGER NOT NULL DEFAULT 0
);

-- Claims read open fires in the order they became available.
CREATE INDEX fire_queue_open ON fire_queue (available_at)
    WHERE completed_at IS NULL AND discarded_at IS NULL;

-- One schedule's open fires (overlap decisions); only open rows are in it.
CREATE INDEX fire_queue_open_by_schedule ON fire_queue (schedule_id, available_at)
    WHERE completed_at IS NULL AND discarded_at IS NULL;

-- Fires under a claim: what runs now. Rows enter it at claim, so dispatch never writes it.
CREATE INDEX fire_queue_claimed ON fire_queue (schedule_id)
    WHERE lease_token IS NOT NULL;

-- Dead letters, for `vortos queue list`.
CREATE INDEX fire_queue_dead ON fire_queue (discarded_at)
    WHERE discarded_at IS NOT NULL;

CREATE TABLE leases (
    key         TEXT PRIMARY KEY,
    token       TEXT NOT NULL,
    holder      TEXT NOT NULL,
    acquired_at INTEGER NOT NULL,
    renewed_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;

-- The audit chain (see engine.domain.audit): one chain per tenant ('tenant:<name>') and one for
-- the system ('system'). Each entry's hash covers its content and the previous hash; each is
-- HMAC-signed with a key that is never stored here. The triggers stop accidental edits; a
-- deliberate one (triggers dropped) is what `vortos audit verify` finds.
CREATE TABLE audit_entries (
    chain       TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    event       TEXT NOT NULL,
    actor       TEXT NOT NULL,
    tenant      TEXT,
    schedule_id TEXT,
    slot_key    TEXT,
    at          INTEGER NOT NULL,
    data        TEXT NOT NULL,              -- canonical JSON
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL,
    key_id      TEXT NOT NULL,
    signature   TEXT NOT NULL,
    seal        TEXT,                       -- Ed25519, on openings, seals and rotations
    PRIMARY KEY (chain, seq)
) WITHOUT ROWID;

CREATE TRIGGER audit_entries_no_update BEFORE UPDATE ON audit_entries
BEGIN
    SELECT RAISE(ABORT, 'the audit chain is append-only');
END;

CREATE TRIGGER audit_entries_no_delete BEFORE DELETE ON audit_entries
WHEN OLD.seq > coalesce((SELECT seq FROM audit_anchors WHERE chain = OLD.chain), 0)
BEGIN
    SELECT RAISE(ABORT, 'the audit chain is append-only: only archived entries may go');
END;

-- Every CHECKPOINT_EVERY entries: the chain's running hash at that entry, signed, so that a
-- verification can resume from the last one it checked instead of the chain's start.
CREATE TABLE audit_checkpoints (
    chain     TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    hash      TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    signature TEXT NOT NULL,
    PRIMARY KEY (chain, seq)
) WITHOUT ROWID;

-- How far each chain was last verified (signed, so it cannot be moved forward without the key).
CREATE TABLE audit_verified (
    chain       TEXT PRIMARY KEY,
    seq         INTEGER NOT NULL,
    hash        TEXT NOT NULL,
    verified_at INTEGER NOT NULL,
    key_id      TEXT NOT NULL,
    signature   TEXT NOT NULL
) WITHOUT ROWID;

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

-- Operators and their roles, per tenant ('*': every tenant). The first account to change a
-- database through the CLI or the console, while this is empty, becomes its admin.
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

-- Four-eyes: a sensitive change waits for a second operator. `digest` pins exactly the change
-- approved; executing it moves the request to 'consumed'. Expiry is judged on read
-- (expires_at), so nothing needs to sweep.
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

-- Retention: how long a tenant's run history is kept, overriding the sweeper's default (see
-- engine.retention). days = 0 is a legal hold: nothing of the tenant is ever pruned.
CREATE TABLE retention_overrides (
    tenant TEXT PRIMARY KEY,
    days   INTEGER NOT NULL CHECK (days >= 0),
    reason TEXT,
    set_by TEXT NOT NULL,
    set_at INTEGER NOT NULL
) WITHOUT ROWID;

-- Plug-ins (engine.plugins): how far each audit sink's copy reaches in each chain, and each
-- node's latest report on its plug-ins' health (what `vortos doctor` shows).
CREATE TABLE audit_sink_positions (
    sink       TEXT NOT NULL,
    chain      TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (sink, chain)
) WITHOUT ROWID;
CREATE TABLE plugin_health (
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

"""Upgrades of the PostgreSQL schema: version N-1 to N, applied in order in one transaction by
`vortos db migrate`. schema.sql is always the newest version; an entry here is frozen once
released (a test checks that upgrading the oldest schema gives what schema.sql creates)."""

from __future__ import annotations

MIGRATIONS: dict[int, str] = {
    # Plug-ins: audit sinks' positions and plug-in health.
    2: """
-- Plug-ins (engine.plugins): how far each audit sink's copy reaches in each chain, and each
-- node's latest report on its plug-ins' health (what `vortos doctor` shows).
CREATE TABLE audit_sink_positions (
    sink       TEXT NOT NULL,
    chain      TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (sink, chain)
);
CREATE TABLE plugin_health (
    node_id       TEXT NOT NULL,
    port          TEXT NOT NULL,
    plugin        TEXT NOT NULL,
    calls         BIGINT NOT NULL,
    failures      BIGINT NOT NULL,
    timeouts      BIGINT NOT NULL,
    dropped       BIGINT NOT NULL,
    busy_since    BIGINT,
    backlog       BIGINT NOT NULL,
    last_error    TEXT,
    last_error_at BIGINT,
    reported_at   BIGINT NOT NULL,
    PRIMARY KEY (node_id, port, plugin)
);
""",
    # The audit chain at scale: key lineage and identity, seals, chain openings, anchors.
    3: """
ALTER TABLE audit_entries ADD COLUMN seal TEXT;
-- Epoch seals and rotations of each chain (a verification resuming from a mark checks the
-- newest one below it): partial, so no other entry writes it.
CREATE INDEX audit_entries_transitions ON audit_entries (chain, seq)
WHERE event = 'audit.epoch_sealed' OR event = 'audit.key_rotated';
-- The database's identity and audit key lineage, chain openings and archive anchors (see
-- the SQLite schema).
CREATE TABLE audit_identity (
    one         INTEGER PRIMARY KEY CHECK (one = 1),
    database_id TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE TABLE audit_keys (
    epoch       INTEGER PRIMARY KEY,
    key_id      TEXT NOT NULL UNIQUE,
    public_key  TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('root', 'evolved', 'rotated')),
    started_at  BIGINT NOT NULL,
    endorsement TEXT NOT NULL
);
CREATE TABLE audit_chains (
    chain      TEXT PRIMARY KEY,
    opened_seq BIGINT NOT NULL
);
CREATE TABLE audit_anchors (
    chain     TEXT PRIMARY KEY,
    seq       BIGINT NOT NULL,
    hash      TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    at        BIGINT NOT NULL,
    signature TEXT NOT NULL,
    archive   TEXT NOT NULL
);
-- Entries up to a chain's anchor were archived (and verified there): only they may go.
CREATE FUNCTION vortos_audit_prune_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.seq <= coalesce((SELECT seq FROM audit_anchors WHERE chain = OLD.chain), 0) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit chain is append-only: only archived entries may go'
        USING ERRCODE = 'insufficient_privilege';
END $$;
DROP TRIGGER audit_entries_no_delete ON audit_entries;
CREATE TRIGGER audit_entries_no_delete BEFORE DELETE ON audit_entries
    FOR EACH ROW EXECUTE FUNCTION vortos_audit_prune_only();
""",
    # Trigger kinds are registered in code (engine.domain.triggers), not listed in a CHECK.
    4: """
ALTER TABLE schedules DROP CONSTRAINT IF EXISTS schedules_trigger_kind_check;
""",
    # Command time limits per schedule, a fire's failures and consumer deaths counted apart,
    # the `timed_out` run state, and the node registry that shares lease shards out
    # (engine.runtime.nodes).
    5: """
ALTER TABLE schedules ADD COLUMN timeout_ms BIGINT;
ALTER TABLE fire_queue ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fire_queue ADD COLUMN abandoned_at_requeue INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs DROP CONSTRAINT runs_state_check;
ALTER TABLE runs ADD CONSTRAINT runs_state_check
    CHECK (state IN ('dispatched', 'running', 'completed', 'failed',
                     'dead_lettered', 'skipped', 'cancelled', 'timed_out'));
-- The legal moves as the trigger's WHEN condition: the function only refuses (schema.sql).
DROP TRIGGER runs_legal_transition ON runs;
CREATE OR REPLACE FUNCTION vortos_runs_legal_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'illegal run state transition' USING ERRCODE = 'check_violation';
END $$;
CREATE TRIGGER runs_legal_transition BEFORE UPDATE OF state ON runs
    FOR EACH ROW WHEN (NEW.state <> OLD.state AND NOT (
           (OLD.state = 'dispatched' AND NEW.state IN ('running', 'skipped', 'cancelled',
                                                       'dead_lettered'))
        OR (OLD.state = 'running' AND NEW.state IN ('completed', 'failed', 'dead_lettered',
                                                    'cancelled', 'dispatched', 'skipped',
                                                    'timed_out'))
        OR (OLD.state IN ('failed', 'dead_lettered', 'timed_out') AND NEW.state = 'dispatched')
))
    EXECUTE FUNCTION vortos_runs_legal_transition();
CREATE TABLE nodes (
    node_id      TEXT PRIMARY KEY,
    shards       INTEGER NOT NULL,
    started_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    lease_driver TEXT NOT NULL DEFAULT 'row'
);
-- Room on each runs page for a run's later writes as HOT updates (see schema.sql): pages
-- written from now on.
ALTER TABLE runs SET (fillfactor = 60);
""",
}

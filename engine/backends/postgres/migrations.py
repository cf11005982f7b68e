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
}

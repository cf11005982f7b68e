"""Upgrades of the PostgreSQL schema: version N-1 to N, applied in order in one transaction by
`vortos db migrate`. schema.sql is always the newest version; an entry here is frozen once
released (a test checks that upgrading the oldest schema gives what schema.sql creates)."""

from __future__ import annotations

MIGRATIONS: dict[int, str] = {}

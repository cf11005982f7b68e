"""What an operator may know about the database itself (`vortos db info`)."""

from __future__ import annotations

from typing import Any

from engine.backends.sql.diagnostics import store_counts
from engine.ports.lease import LEADER_LEASE
from engine.service.core import ServiceCore

# The facts that count rows of every tenant: only a viewer of every tenant sees them.
COUNTS = tuple(store_counts(lambda _sql: 0))


class SiteFacts(ServiceCore):
    def database_info(self, *, actor: str | None = None) -> dict[str, Any]:
        """Where the database is, its schema, the leader; the counts of what it holds only
        to a reader of every tenant (they count every tenant's rows)."""
        facts = self._storage.describe()
        lease = self._storage.leases.current(LEADER_LEASE)
        facts["leader"] = None if lease is None else lease.holder
        if not self.scope(actor).every:
            for key in COUNTS:
                facts.pop(key, None)
            facts["counts"] = "shown to a viewer of every tenant only"
        return facts

"""Reading the audit chains as an operator: only the chains of tenants they may view."""

from __future__ import annotations

from collections.abc import Sequence

from engine.domain.access import PermissionDenied, chain_visible
from engine.domain.audit import AuditEntry, chain_tenant
from engine.domain.errors import InvalidInput
from engine.service.core import ServiceCore


class AuditTrail(ServiceCore):
    def audit_chains(
        self, *, actor: str | None = None, wanted: Sequence[str] | None = None
    ) -> list[str]:
        """The chains `actor` may read (of `wanted`, when given: each must exist and be
        readable, else a clear error)."""
        scope = self.scope(actor)
        known = self._storage.audit.chains()
        visible = [c for c in known if chain_visible(scope, c)]
        if wanted is None:
            return visible
        for chain in wanted:
            if chain not in known:
                raise InvalidInput(
                    f"no audit chain {chain!r} (chains: {', '.join(visible) or 'none'})"
                )
            if chain not in visible:
                raise PermissionDenied(
                    f"{actor} may not read audit chain {chain!r}: that needs the viewer role "
                    + (
                        "in every tenant"
                        if chain_tenant(chain) is None
                        else f"in tenant {chain_tenant(chain)}"
                    )
                )
        return list(dict.fromkeys(wanted))

    def audit_latest(
        self, *, actor: str | None = None, chain: str | None = None, limit: int = 20
    ) -> list[AuditEntry]:
        """The newest entries, newest first, of `chain` or of every chain `actor` may read."""
        chains = self.audit_chains(actor=actor, wanted=None if chain is None else [chain])
        if chain is None and len(chains) == len(self._storage.audit.chains()):
            return self._storage.audit.latest(None, limit=limit)
        found: list[AuditEntry] = []
        for one in chains:
            found += self._storage.audit.latest(one, limit=limit)
        found.sort(key=lambda e: (e.at, e.chain, e.seq), reverse=True)
        return found[:limit]

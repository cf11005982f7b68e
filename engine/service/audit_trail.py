"""Reading the audit chains as an operator: only the chains of tenants they may view."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from engine.domain.access import PermissionDenied, chain_visible
from engine.domain.audit import AuditEntry, KeyRing, chain_tenant
from engine.domain.errors import InvalidInput
from engine.governance.audit import export
from engine.service.core import ServiceCore

AUDIT_PAGE_MAX = 10_000  # entries in one page of a chain


class AuditTrail(ServiceCore):
    def audit_chains(
        self, *, actor: str | None = None, wanted: Sequence[str] | None = None
    ) -> list[str]:
        """The chains `actor` may read (of `wanted`, when given: each must exist and be
        readable, else a clear error). Every chain it may read, asked of an account that may
        view no tenant at all, is refused (see `listing_scope`)."""
        scope = self.scope(actor) if wanted is not None else self.listing_scope(actor)
        known = self._storage.audit.chains()
        visible = [c for c in known if chain_visible(scope, c)]
        if wanted is None:
            return visible
        for chain in wanted:
            # Refused before looked up, as every read: whether another tenant's chain exists
            # is not for this actor to learn.
            if not chain_visible(scope, chain):
                raise PermissionDenied(
                    f"{actor} may not read audit chain {chain!r}: that needs the viewer role "
                    + (
                        "in every tenant"
                        if chain_tenant(chain) is None
                        else f"in tenant {chain_tenant(chain)}"
                    )
                )
            if chain not in known:
                raise InvalidInput(
                    f"no audit chain {chain!r} (chains: {', '.join(visible) or 'none'})"
                )
        return list(dict.fromkeys(wanted))

    def audit_chains_to_verify(
        self,
        *,
        actor: str | None = None,
        wanted: Sequence[str] | None = None,
        expected: Sequence[str] = (),
    ) -> tuple[list[str], int]:
        """The chains a verification by `actor` checks (of `wanted`, or every one it may
        read; each of `expected` must be readable too), and how many others exist that it
        may not read and so does not check. A verification that could check nothing is
        refused (PermissionDenied), never reported as intact or empty: only who may read
        every chain learns that there is none."""
        self.audit_chains(actor=actor, wanted=list(expected))
        if wanted is None:
            self.listing_scope(actor, so="it may read no audit chain and nothing was verified")
        readable = self.audit_chains(actor=actor, wanted=wanted)
        scope = self.scope(actor)
        if wanted is not None or scope.every:
            return readable, 0
        known = self._storage.audit.chains()
        if known and not readable:
            raise PermissionDenied(
                f"{actor} may read no audit chain here (it may view {scope.describe()}, which "
                "has no audit chain yet; other chains exist), so nothing was verified: "
                "verifying a tenant's chain needs the viewer role in that tenant (an admin "
                f"runs `vortos operators grant {actor} viewer --tenant T`), and every chain, "
                "with the system chain, the viewer role in every tenant "
                f"(`vortos operators grant {actor} viewer`)"
            )
        return readable, len(known) - len(readable)

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

    def audit_entries(
        self, chain: str, *, actor: str | None = None, after_seq: int = 0, limit: int = 1000
    ) -> list[AuditEntry]:
        """One chain's entries after `after_seq`, oldest first (an export's page): the chain
        must exist and be readable by `actor`."""
        if not 1 <= limit <= AUDIT_PAGE_MAX:
            raise InvalidInput(f"limit {limit} is out of range: use 1 to {AUDIT_PAGE_MAX}")
        if after_seq < 0:
            raise InvalidInput(f"after_seq {after_seq} is negative: sequence numbers start at 1")
        self.audit_chains(actor=actor, wanted=[chain])
        return self._storage.audit.entries(chain, after_seq=after_seq, limit=limit)

    def audit_export(
        self,
        out: TextIO,
        *,
        actor: str | None = None,
        chains: Sequence[str] | None = None,
        keys: KeyRing | None = None,
    ) -> int:
        """Every entry of `chains` (default: every chain `actor` may read) as JSON lines, chain
        by chain, each chain's head signed with `keys` when given
        (engine.governance.audit.export); how many."""
        return export(
            self._storage.audit,
            out,
            chains=self.audit_chains(actor=actor, wanted=chains),
            keys=keys,
        )

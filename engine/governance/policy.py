"""The default policy (roles per tenant) and access control: identity, decision, and the first
admin of a database."""

from __future__ import annotations

import logging

from engine.domain.access import (
    ANY_TENANT,
    EVERY_TENANT,
    GLOBAL_OPERATIONS,
    LEAST_ROLE,
    Grant,
    Identity,
    Operation,
    PermissionDenied,
    Role,
    TenantScope,
    includes,
    visible_scope,
)
from engine.domain.audit import AuditEvent
from engine.domain.clock import Clock
from engine.ports.policy import Decision, IdentityProvider, Policy
from engine.ports.storage import Storage

log = logging.getLogger("vortos.policy")


def scope_of(policy: Policy, identity: Identity) -> TenantScope:
    """What the policy lets `identity` view (see engine.domain.access.visible_scope)."""
    return visible_scope(
        identity, lambda tenant: policy.decide(identity, Operation.VIEW, tenant).allowed
    )


class RoleBasedPolicy:
    """Allowed when the operator holds, in the operation's tenant or in every tenant, a role
    that includes the least role the operation needs (see LEAST_ROLE); operator management
    counts only grants in every tenant."""

    def decide(self, identity: Identity, operation: Operation, tenant: str | None) -> Decision:
        needed = LEAST_ROLE[operation]
        scope = None if operation in GLOBAL_OPERATIONS else tenant
        held = identity.roles_in(scope)
        if any(includes(role, needed) for role in held):
            return Decision(allowed=True, reason="")
        where = "in every tenant" if scope is None else f"in tenant {scope}"
        has = ", ".join(sorted({r.value for r in held})) or "no role"
        command = f"vortos operators grant {identity.operator} {needed.value}"
        if scope is not None:
            command += f" --tenant {scope}"
        return Decision(
            allowed=False,
            reason=f"{identity.operator} may not {operation.value} {where}: that needs the "
            f"{needed.value} role there (has: {has}); an admin can grant it with `{command}`",
        )


class StoredIdentities:
    """Identities from the database's operator grants."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def identity(self, operator: str) -> Identity:
        return Identity(operator, tuple(self._storage.operators.grants(operator)))


class AccessControl:
    """Authorises service calls. While a database has no operator at all, the first account
    to change it becomes its admin (in every tenant), recorded in the system audit chain."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        policy: Policy | None = None,
        identities: IdentityProvider | None = None,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self.policy: Policy = policy or RoleBasedPolicy()
        self.identities: IdentityProvider = identities or StoredIdentities(storage)

    def authorize(self, actor: str, operation: Operation, tenant: str | None) -> Identity:
        """Refuse unless the policy allows. While the database has no operator at all, every
        account may act: its change then makes it the first admin (see `within_change`)."""
        identity = self.identities.identity(actor)
        if self._storage.operators.count() == 0:
            return identity
        decision = self.policy.decide(identity, operation, tenant)
        if not decision.allowed:
            raise PermissionDenied(decision.reason)
        return identity

    def scope(self, actor: str) -> TenantScope:
        """The tenants `actor` may view: every tenant while the database has no operator (as
        for changes, see `authorize`), else as the policy decides for the actor's grants."""
        if self._storage.operators.count() == 0:
            return EVERY_TENANT
        return scope_of(self.policy, self.identities.identity(actor))

    def claim_first_admin(self, actor: str) -> None:
        """Inside a change's own transaction, as it records what it changed: while the
        database has no operator at all, the actor becomes its first admin. A change that fails,
        or that changes nothing, grants nothing."""
        if self._storage.operators.count() > 0:
            return
        grant = Grant(actor, Role.ADMIN, ANY_TENANT)
        self._storage.operators.grant(grant, by=actor, at=self._clock.now_ms())
        self._storage.audit.append(
            [
                AuditEvent(
                    "operator.granted",
                    actor=actor,
                    data={
                        "operator": actor,
                        "role": Role.ADMIN.value,
                        "tenant": ANY_TENANT,
                        "first_admin": True,
                    },
                )
            ]
        )
        log.info("%s is this database's first operator: admin in every tenant", actor)

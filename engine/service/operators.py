"""Operators and their roles: list, grant, revoke (admin only; every change audited)."""

from __future__ import annotations

import logging

from engine.domain.access import (
    ANY_TENANT,
    Grant,
    Operation,
    Role,
    validate_operator,
)
from engine.domain.audit import AuditEvent
from engine.domain.errors import Conflict, NotFound
from engine.domain.schedule import validate_name
from engine.service.core import ServiceCore

log = logging.getLogger("vortos.service")


class OperatorAdmin(ServiceCore):
    def operators(self, *, actor: str) -> list[Grant]:
        self._authorize(actor, Operation.MANAGE_OPERATORS, None)
        return self._storage.operators.grants()

    def grant_role(
        self, operator: str, role: Role, *, actor: str, tenant: str = ANY_TENANT
    ) -> bool:
        """Grant `role` in `tenant` ('*': every tenant); False when it was already held."""
        grant = self._checked(operator, role, tenant)
        self._authorize(actor, Operation.MANAGE_OPERATORS, None)
        with self._changing(actor, Operation.MANAGE_OPERATORS, None):
            if self.access is not None:
                # Before this grant lands: the first operator of a database is whoever grants.
                self.access.claim_first_admin(actor)
            added = self._storage.operators.grant(grant, by=actor, at=self._clock.now_ms())
            if added:
                self._record_grant("operator.granted", actor, grant)
        if added:
            log.info("%s granted %s %s in %s", actor, operator, role.value, grant.scope)
        return added

    def revoke_role(
        self, operator: str, role: Role, *, actor: str, tenant: str = ANY_TENANT
    ) -> None:
        grant = self._checked(operator, role, tenant)
        self._authorize(actor, Operation.MANAGE_OPERATORS, None)
        with self._changing(actor, Operation.MANAGE_OPERATORS, None):
            held = self._storage.operators.grants(operator)
            if grant not in held:
                raise NotFound(
                    f"{operator} does not hold {role.value} in {grant.scope}: "
                    "`vortos operators list` shows every grant"
                )
            admins = [
                g
                for g in self._storage.operators.grants()
                if g.role is Role.ADMIN and g.tenant == ANY_TENANT
            ]
            if grant.role is Role.ADMIN and grant.tenant == ANY_TENANT and len(admins) == 1:
                raise Conflict(
                    f"{operator} is the last admin of this database: grant admin to another "
                    "operator first"
                )
            self._storage.operators.revoke(grant)
            self._record_grant("operator.revoked", actor, grant)
        log.info("%s revoked %s %s in %s", actor, operator, role.value, grant.scope)

    def _checked(self, operator: str, role: Role, tenant: str) -> Grant:
        validate_operator(operator)
        if tenant != ANY_TENANT:
            validate_name(tenant, what="tenant")
        return Grant(operator, role, tenant)

    def _record_grant(self, event: str, actor: str, grant: Grant) -> None:
        self._append(
            actor,
            [
                AuditEvent(
                    event,
                    actor=actor,
                    data={
                        "operator": grant.operator,
                        "role": grant.role.value,
                        "tenant": grant.tenant,
                    },
                )
            ],
        )

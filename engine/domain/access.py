"""Who may do what: operators, their roles per tenant, and the operations a role permits
(pure). The default policy (engine.governance.policy) decides from these tables; a custom
policy may decide otherwise."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from engine.domain.errors import InvalidInput, VortosError

ANY_TENANT = "*"  # a grant in every tenant
_OPERATOR_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")


class Role(StrEnum):
    """Each role includes the one before it: viewer < operator < approver < admin."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"
    ADMIN = "admin"


class Operation(StrEnum):
    VIEW = "view"
    CREATE = "create"
    UPDATE = "update"
    PAUSE = "pause"
    RESUME = "resume"
    DELETE = "delete"
    TRIGGER = "trigger"
    BACKFILL = "backfill"
    REQUEUE = "requeue"  # dead letters: requeue and purge
    APPROVE = "approve"
    MANAGE_RETENTION = "manage-retention"
    MANAGE_OPERATORS = "manage-operators"


_RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.APPROVER: 2, Role.ADMIN: 3}

# The least role that permits each operation (in the operation's tenant, or in every tenant).
LEAST_ROLE: dict[Operation, Role] = {
    Operation.VIEW: Role.VIEWER,
    Operation.CREATE: Role.OPERATOR,
    Operation.UPDATE: Role.OPERATOR,
    Operation.PAUSE: Role.OPERATOR,
    Operation.RESUME: Role.OPERATOR,
    Operation.DELETE: Role.OPERATOR,
    Operation.TRIGGER: Role.OPERATOR,
    Operation.BACKFILL: Role.OPERATOR,
    Operation.REQUEUE: Role.OPERATOR,
    Operation.APPROVE: Role.APPROVER,
    Operation.MANAGE_RETENTION: Role.ADMIN,
    Operation.MANAGE_OPERATORS: Role.ADMIN,
}
# Operations that are not about one tenant's schedules: only a grant in every tenant counts.
GLOBAL_OPERATIONS = frozenset({Operation.MANAGE_OPERATORS})


def includes(role: Role, needed: Role) -> bool:
    return _RANK[role] >= _RANK[needed]


def validate_operator(name: str) -> str:
    if not _OPERATOR_NAME.match(name):
        raise InvalidInput(
            f"operator {name!r} is not an account name: use letters, digits and . _ - @, "
            "at most 64 characters"
        )
    return name


def parse_role(text: str) -> Role:
    try:
        return Role(text.lower())
    except ValueError:
        raise InvalidInput(
            f"unknown role {text!r}: use one of {', '.join(r.value for r in Role)}"
        ) from None


@dataclass(frozen=True, slots=True)
class Grant:
    operator: str
    role: Role
    tenant: str = ANY_TENANT

    @property
    def scope(self) -> str:
        return "every tenant" if self.tenant == ANY_TENANT else f"tenant {self.tenant}"


@dataclass(frozen=True, slots=True)
class Identity:
    """An operator and every grant they hold."""

    operator: str
    grants: tuple[Grant, ...] = ()

    def roles_in(self, tenant: str | None) -> list[Role]:
        """Roles that apply in `tenant` (None: only grants in every tenant apply)."""
        return [
            g.role
            for g in self.grants
            if g.tenant == ANY_TENANT or (tenant is not None and g.tenant == tenant)
        ]

    def best_role_in(self, tenant: str | None) -> Role | None:
        roles = self.roles_in(tenant)
        return max(roles, key=_RANK.__getitem__) if roles else None


class PermissionDenied(VortosError):
    """The policy refused: the message names the missing permission."""

    exit_code = 4

"""Who may do what: operators, their roles per tenant, and the operations a role permits
(pure). The default policy (engine.governance.policy) decides from these tables; a custom
policy may decide otherwise."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from engine.domain.audit import chain_tenant
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


@dataclass(frozen=True, slots=True)
class TenantScope:
    """The tenants an operator may see: every tenant (`tenants` None) or exactly these (maybe
    none). Every read an operator makes is narrowed by it, in the store's query, so a page
    never holds another tenant's rows and never comes back short because they were dropped."""

    tenants: frozenset[str] | None = None

    @property
    def every(self) -> bool:
        return self.tenants is None

    def allows(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def narrow(self, tenant: str | None) -> TenantScope:
        """This scope within `tenant` (None: no narrowing)."""
        if tenant is None:
            return self
        return TenantScope(frozenset({tenant}) if self.allows(tenant) else frozenset())

    @property
    def empty(self) -> bool:
        return self.tenants is not None and not self.tenants

    def describe(self) -> str:
        if self.tenants is None:
            return "every tenant"
        return ", ".join(sorted(self.tenants)) or "no tenant"


EVERY_TENANT = TenantScope()


def chain_visible(scope: TenantScope, chain: str) -> bool:
    """A tenant's audit chain is visible with its tenant; the system chain (leases, operators)
    only to whoever may view every tenant."""
    tenant = chain_tenant(chain)
    return scope.every if tenant is None else scope.allows(tenant)


def visible_scope(identity: Identity, may_view: Callable[[str | None], bool]) -> TenantScope:
    """What `identity` may see, given the policy's view decision: every tenant when viewing
    the whole installation is allowed, else the tenants of its grants that it may view.

    A policy decides per tenant and cannot list tenants, so the candidates are the tenants
    the identity holds grants in."""
    if may_view(None):
        return EVERY_TENANT
    candidates: Iterable[str] = {g.tenant for g in identity.grants if g.tenant != ANY_TENANT}
    return TenantScope(frozenset(t for t in candidates if may_view(t)))


class PermissionDenied(VortosError):
    """The policy refused: the message names the missing permission."""

    exit_code = 4


def views_nothing(actor: str, so: str) -> PermissionDenied:
    """The refusal of a read by an account whose scope is empty: it holds no role that lets it
    view any tenant. It is told so and what to ask for; an empty answer would read as "there
    is nothing here". (While a database has no operator at all, every account views every
    tenant: nobody is refused this.)"""
    return PermissionDenied(
        f"{actor} holds no role that lets it view any tenant here, so {so}: ask an admin for "
        f"one (`vortos operators grant {actor} viewer --tenant T`, or without --tenant for "
        "every tenant)"
    )

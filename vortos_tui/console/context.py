"""What a console session knows: where it reads, who acts, what they may do, which clock and
zone it shows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from zoneinfo import ZoneInfo

from engine import Clock, ReadModel
from engine.domain.access import Identity, Operation
from engine.governance.doctor import Report
from engine.governance.policy import RoleBasedPolicy
from engine.ports.policy import Decision, Policy
from vortos_tui.console.actions import ConsoleActions

DEFAULT_REFRESH_S = 0.5
DEFAULT_PAGE = 100  # rows read per refresh: two screens of a tall terminal
ALLOWED = Decision(allowed=True, reason="")


class NodeRole(StrEnum):
    LEADER = "leader"  # the in-process engine holds the dispatch lease
    STANDBY = "standby"  # the in-process engine waits for the lease
    ATTACHED = "attached"  # no engine in this process: only the console
    DOWN = "engine down"  # the in-process engine stopped on an unexpected error (logged)


@dataclass(frozen=True, slots=True)
class NodeStatus:
    role: NodeRole
    node_id: str | None = None
    # The in-process daemon's dispatch circuit breaker, when it is not closed ("open",
    # "half_open"): no dispatch is tried while it is open.
    breaker: str | None = None


def attached() -> NodeStatus:
    return NodeStatus(NodeRole.ATTACHED)


@dataclass(slots=True)
class ConsoleContext:
    """Everything a view needs, injected: tests give a manual clock and a fixed zone."""

    db_label: str  # the database as the header names it
    model: ReadModel
    clock: Clock
    zone: ZoneInfo
    operator: str  # who acts and reads: the OS account running the console
    actions: ConsoleActions | None  # None: read-only, every verb hidden
    node: Callable[[], NodeStatus] = attached
    refresh_s: float = DEFAULT_REFRESH_S
    page_size: int = DEFAULT_PAGE
    start_view: str = "schedules"
    read_only_reason: str = "--read-only"  # said in the header when actions is None
    operator_label: str | None = None  # how the header names the operator (default: operator)
    # The read model's policy: it decides what the console offers (the service decides again
    # on every change, so an offer shown from an older reading is still refused if it must be).
    policy: Policy = field(default_factory=RoleBasedPolicy)
    # The operator's grants as the newest overview read them (None: the database has no
    # operator yet, or nothing was read yet: every account may do everything).
    identity: Identity | None = None
    # Runs every doctor check on a worker thread (None: the Doctor view says it cannot).
    doctor: Callable[[], Report] | None = None

    @property
    def read_only(self) -> bool:
        return self.actions is None

    def may(self, operation: Operation, tenant: str | None) -> Decision:
        """Whether the operator may do `operation` in `tenant`, by the newest reading of their
        grants."""
        if self.identity is None:
            return ALLOWED
        return self.policy.decide(self.identity, operation, tenant)

"""What a console session knows: where it reads, who acts, which clock and zone it shows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from zoneinfo import ZoneInfo

from engine import Clock, ReadModel
from vortos_tui.console.actions import ConsoleActions

DEFAULT_REFRESH_S = 0.5
DEFAULT_PAGE = 100  # rows read per refresh: two screens of a tall terminal


class NodeRole(StrEnum):
    LEADER = "leader"  # the in-process engine holds the dispatch lease
    STANDBY = "standby"  # the in-process engine waits for the lease
    ATTACHED = "attached"  # no engine in this process: only the console
    DOWN = "engine down"  # the in-process engine stopped on an unexpected error (logged)


@dataclass(frozen=True, slots=True)
class NodeStatus:
    role: NodeRole
    node_id: str | None = None


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

    @property
    def read_only(self) -> bool:
        return self.actions is None

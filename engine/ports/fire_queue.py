"""The fire queue: the outbox consumers execute from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Fire:
    """One fire waiting for (or taken by) a consumer; identified by its run."""

    run_id: int
    tenant: str
    schedule_id: str
    slot_key: str
    slot_at: int
    command: str
    payload: dict[str, Any]
    available_at: int
    created_at: int
    attempts: int


class FireQueue(Protocol):
    """Fires written in the same transaction as their run; one fire per run.

    Claiming, settling and fencing arrive with the execution issue; this port reads what is
    waiting.
    """

    def pending(self, limit: int = 100, tenant: str | None = None) -> list[Fire]:
        """Fires not yet settled, oldest first."""
        ...

    def depth(self, tenant: str | None = None) -> int: ...

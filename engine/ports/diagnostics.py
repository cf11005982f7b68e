"""What the doctor asks a backend about itself: facts, read cheaply, that no other port has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class StorageFacts:
    backend: str
    schema_version: int
    supported_schema_version: int
    journal_mode: str | None  # SQLite: wal expected; None where it means nothing
    synchronous: str | None  # SQLite: normal or full expected
    location: str  # a path, or a server and database name


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """The fire queue as the consumers see it, at `now`."""

    oldest_waiting_at: int | None  # available_at of the oldest open, unclaimed, available fire
    waiting: int  # open, unclaimed fires already available
    last_claim_at: int | None  # newest start of a run (a consumer took a fire)
    dead_letters: int


class Diagnostics(Protocol):
    """Contract: every call reads (nothing is written), in one short transaction."""

    def storage_facts(self) -> StorageFacts: ...

    def unreadable_tables(self) -> dict[str, str]:
        """Each table the engine needs that cannot be read, with why (empty: all fine)."""
        ...

    def queue_facts(self, now_ms: int) -> QueueFacts: ...

    def zones_in_use(self) -> list[str]:
        """The distinct time zones of stored schedules."""
        ...

    def clock_skew_ms(self) -> int | None:
        """The database server's clock minus this host's, in ms, measured (to within half a
        round trip); None where the database has no clock of its own (SQLite)."""
        ...

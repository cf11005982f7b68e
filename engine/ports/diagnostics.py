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


@dataclass(frozen=True, slots=True)
class OverLimit:
    """A run still `running` past its schedule's time limit."""

    run_id: int
    tenant: str
    schedule_name: str
    started_at: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class ExecutionFacts:
    """How commands have been running (engine.governance.execution_checks), at `now`."""

    over_limit: list[OverLimit]  # the oldest first, at most a few
    ignored_cancel: list[tuple[int, str]]  # (run id, schedule) of runs since `since`
    abandoned_since: int  # fires (open or settled) whose latest consumer died since `since`
    near_death_budget: list[tuple[int, str, int]]  # (run id, schedule, deaths), open fires


class Diagnostics(Protocol):
    """Contract: every call reads (nothing is written), in one short transaction."""

    def storage_facts(self) -> StorageFacts: ...

    def unreadable_tables(self) -> dict[str, str]:
        """Each table the engine needs that cannot be read, with why (empty: all fine)."""
        ...

    def queue_facts(self, now_ms: int) -> QueueFacts: ...

    def execution_facts(
        self, now_ms: int, since_ms: int, ignored_marker: str, deaths_at_least: int
    ) -> ExecutionFacts:
        """Runs over their schedule's limit at `now_ms`; runs settled since `since_ms` whose
        error holds `ignored_marker`; open fires abandoned since then; open fires with at
        least `deaths_at_least` consumer deaths since their last requeue."""
        ...

    def zones_in_use(self) -> list[str]:
        """The distinct time zones of stored schedules."""
        ...

    def clock_skew_ms(self) -> int | None:
        """The database server's clock minus this host's, in ms, measured (to within half a
        round trip); None where the database has no clock of its own (SQLite)."""
        ...

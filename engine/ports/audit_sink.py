"""A secondary copy of the audit trail: a SIEM, an object store, a log shipper."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from engine.domain.audit import AuditEntry


@runtime_checkable
class AuditSink(Protocol):
    """Receives a copy of every audit entry after it is committed.

    The chains in the database stay the record; a sink is fed from them by the leading `vortos
    run` (engine.runtime.audit_shipper), which keeps each sink's position per chain in the
    database, so a sink that was down catches up, in order, with no gap.

    Contract:
    - `deliver` is given entries of one chain, consecutive, in sequence order, starting just
      after the last entry this sink acknowledged (by returning without raising).
    - Delivery is at least once: after a crash, a timeout or a change of leader, entries the
      sink already stored may come again. A sink stores each (chain, seq) once: skip what is at
      or below the last sequence number it holds of that chain.
    - Raising means "not stored": the same entries come again after a backoff.
    - A call should return within the `plugin_timeout` setting. One that does not is counted as
      a timeout and reported; the sink's next delivery waits for it. Nothing a sink does, raise
      or hang, delays a dispatch: sinks run on threads of their own.
    - `close` releases what the sink holds (files, connections); it is called once, at
      shutdown, after the last `deliver`.
    """

    def deliver(self, entries: Sequence[AuditEntry]) -> None: ...

    def close(self) -> None: ...

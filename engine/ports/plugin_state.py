"""What the engine keeps about its plug-ins: each audit sink's position, and their health."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class PluginHealth:
    """One node's report on one plug-in (engine.runtime.isolation)."""

    node_id: str
    port: str  # the setting that selected it: audit_sinks, metrics
    plugin: str  # the name or dotted path it was selected by
    calls: int  # calls that returned
    failures: int  # calls that raised
    timeouts: int  # calls that ran longer than plugin_timeout
    dropped: int  # events not handed over because the plug-in was behind (metrics)
    busy_since: int | None  # the start of the call running now, None when idle
    backlog: int  # what waits for it: audit entries, metrics events
    last_error: str | None
    last_error_at: int | None
    reported_at: int


class PluginStateStore(Protocol):
    """Contract: every method is one atomic statement; positions only move forward."""

    def sink_positions(self, sink: str) -> dict[str, int]:
        """{chain: last sequence number delivered to `sink`} (chains never delivered absent)."""
        ...

    def advance_sink(self, sink: str, chain: str, seq: int, at: int) -> None:
        """Record that `sink` holds `chain` up to `seq`; a lower `seq` than stored is ignored."""
        ...

    def report_health(self, reports: list[PluginHealth]) -> None:
        """Replace each (node, port, plugin)'s previous report."""
        ...

    def health(self, since_ms: int) -> list[PluginHealth]:
        """Reports made at or after `since_ms`, by port, plug-in and node."""
        ...

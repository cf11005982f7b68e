"""Plug-in state on either SQL backend, one SQL for both (both speak ON CONFLICT)."""

from __future__ import annotations

from typing import Any

from engine.backends.sql import SqlPool
from engine.ports.plugin_state import PluginHealth

_HEALTH_COLUMNS = (
    "node_id, port, plugin, calls, failures, timeouts, dropped, busy_since, backlog, "
    "last_error, last_error_at, reported_at"
)


class SqlPluginStateStore:
    def __init__(self, pool: SqlPool[Any]) -> None:
        self._pool = pool
        self._mark = pool.dialect.mark

    def sink_positions(self, sink: str) -> dict[str, int]:
        rows = self._pool.read(
            f"SELECT chain, seq FROM audit_sink_positions WHERE sink = {self._mark}", (sink,)
        )
        return {str(chain): int(seq) for chain, seq in rows}

    def advance_sink(self, sink: str, chain: str, seq: int, at: int) -> None:
        self._pool.write(
            "INSERT INTO audit_sink_positions (sink, chain, seq, updated_at) "
            f"VALUES ({self._pool.dialect.marks(4)}) ON CONFLICT (sink, chain) DO UPDATE SET "
            "seq = excluded.seq, updated_at = excluded.updated_at "
            "WHERE excluded.seq > audit_sink_positions.seq",
            (sink, chain, seq, at),
        )

    def report_health(self, reports: list[PluginHealth]) -> None:
        sql = (
            f"INSERT INTO plugin_health ({_HEALTH_COLUMNS}) VALUES ({self._pool.dialect.marks(12)})"
            " ON CONFLICT (node_id, port, plugin) DO UPDATE SET calls = excluded.calls, "
            "failures = excluded.failures, timeouts = excluded.timeouts, "
            "dropped = excluded.dropped, busy_since = excluded.busy_since, "
            "backlog = excluded.backlog, last_error = excluded.last_error, "
            "last_error_at = excluded.last_error_at, reported_at = excluded.reported_at"
        )
        for r in reports:
            self._pool.write(
                sql,
                (
                    r.node_id,
                    r.port,
                    r.plugin,
                    r.calls,
                    r.failures,
                    r.timeouts,
                    r.dropped,
                    r.busy_since,
                    r.backlog,
                    r.last_error,
                    r.last_error_at,
                    r.reported_at,
                ),
            )

    def health(self, since_ms: int) -> list[PluginHealth]:
        rows = self._pool.read(
            f"SELECT {_HEALTH_COLUMNS} FROM plugin_health WHERE reported_at >= {self._mark} "
            "ORDER BY port, plugin, node_id",
            (since_ms,),
        )
        return [
            PluginHealth(
                str(r[0]),
                str(r[1]),
                str(r[2]),
                int(r[3]),
                int(r[4]),
                int(r[5]),
                int(r[6]),
                None if r[7] is None else int(r[7]),
                int(r[8]),
                r[9],
                None if r[10] is None else int(r[10]),
                int(r[11]),
            )
            for r in rows
        ]

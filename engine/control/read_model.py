"""The console's read model over the control socket: each call one request, answered by the
server's own read model narrowed to the account the kernel reports. The console opens no
database file.

A failure to reach the server (the service stopped, say) is a StorageError, as the ReadModel
contract wants: the console shows it and reads again at the next refresh, recovering by itself
once the service is back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from engine.control.client import ControlClient
from engine.control.codec import from_wire
from engine.control.wire import ControlUnavailable, ProtocolError
from engine.domain.approvals import Approval
from engine.domain.errors import StorageError
from engine.domain.run import Run
from engine.ports.read_model import (
    AuditOverview,
    FireListQuery,
    Overview,
    Page,
    RunDetail,
    ScheduleDetail,
    ScheduleListQuery,
    ScheduleRow,
)

READ_TIMEOUT_S = 30.0  # one page of a read model; the console reads again at its next refresh


class SocketReadModel:
    """ReadModel whose every call the control socket's server answers (see reads.py)."""

    def __init__(self, client: ControlClient) -> None:
        self.client = ControlClient(client.path, timeout_s=min(client.timeout_s, READ_TIMEOUT_S))

    async def _ask(self, op: str, **args: Any) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(self.client.call, op, args)
        except (ControlUnavailable, ProtocolError) as exc:
            raise StorageError(str(exc)) from None

    async def overview(self, now_ms: int) -> Overview:
        done = await self._ask("console_overview", now_ms=now_ms)
        return from_wire(Overview, done.get("overview"))

    async def schedules(self, query: ScheduleListQuery) -> Page[ScheduleRow]:
        done = await self._ask(
            "console_schedules",
            text=query.text,
            tenant=query.tenant,
            status=None if query.status is None else query.status.value,
            offset=query.offset,
            limit=query.limit,
        )
        return from_wire(Page[ScheduleRow], done.get("page"))

    async def fires(self, query: FireListQuery) -> Page[Run]:
        done = await self._ask(
            "console_fires",
            text=query.text,
            tenant=query.tenant,
            state=None if query.state is None else query.state.value,
            schedule_id=query.schedule_id,
            offset=query.offset,
            limit=query.limit,
        )
        return from_wire(Page[Run], done.get("page"))

    async def schedule(self, schedule_id: str, *, runs: int = 20) -> ScheduleDetail | None:
        done = await self._ask("console_schedule", schedule_id=schedule_id, runs=runs)
        found = done.get("detail")
        return None if found is None else from_wire(ScheduleDetail, found)

    async def run(self, run_id: int) -> RunDetail | None:
        done = await self._ask("console_run", run_id=run_id)
        found = done.get("detail")
        return None if found is None else from_wire(RunDetail, found)

    async def audit(self, chain: str | None = None, *, limit: int = 50) -> AuditOverview:
        done = await self._ask("console_audit", chain=chain, limit=limit)
        return from_wire(AuditOverview, done.get("audit"))

    async def approvals(self, *, limit: int = 100) -> list[Approval]:
        done = await self._ask("console_approvals", limit=limit)
        return from_wire(list[Approval], done.get("approvals"))

    async def close(self) -> None:
        """Nothing stays open between calls: each is a connection of its own."""

"""The console's reads over a control socket as another Unix account: `python -m
tests.security.socket_console_reads USER SOCKET` (as root) drops to USER (as
tests.integration.as_account does), then makes every call of the console's read model over the
socket (engine.control.read_model) and prints, as one JSON object, what each returned: the
tenants of its rows, and the ids it saw. The console itself opens no database file; this is
what it would show.
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread  # noqa: F401 - loaded lazily, from /root: before dropping
import json
import sys
import time
from pathlib import Path
from typing import Any

from engine.control import ControlClient
from engine.control.read_model import SocketReadModel
from engine.domain.errors import StorageError
from engine.ports.read_model import FireListQuery, ScheduleListQuery
from tests.integration.as_account import become


async def read_all(model: SocketReadModel, probe: dict[str, Any]) -> dict[str, Any]:
    overview = await model.overview(int(time.time() * 1000))
    schedules = await model.schedules(ScheduleListQuery(limit=200))
    fires = await model.fires(FireListQuery(limit=200))
    audit = await model.audit(None, limit=200)
    approvals = await model.approvals(limit=200)
    seen: dict[str, Any] = {
        "scope": None if overview.scope.tenants is None else sorted(overview.scope.tenants),
        "schedules": sorted({r.schedule.tenant for r in schedules.rows}),
        "schedule_names": sorted(r.schedule.name for r in schedules.rows),
        "fires": sorted({r.tenant for r in fires.rows}),
        "chains": sorted(c.chain for c in audit.chains),
        "recent": sorted({e.chain for e in audit.recent}),
        "approvals": sorted({a.tenant for a in approvals}),
        "counts": [overview.schedules, overview.dead_letters],
    }
    # Another tenant's rows asked for by id: the server answers as if they were absent.
    seen["foreign_schedule"] = await model.schedule(probe["schedule_id"]) is not None
    seen["foreign_run"] = await model.run(probe["run_id"]) is not None
    own = schedules.rows[0].schedule.id if schedules.rows else None
    seen["own_schedule"] = own is not None and await model.schedule(own) is not None
    return seen


def main() -> None:
    user, path, probe = sys.argv[1:]
    become(user)
    model = SocketReadModel(ControlClient(Path(path)))
    try:
        seen = asyncio.run(read_all(model, json.loads(probe)))
    except StorageError as exc:  # what the console shows as its banner
        print(json.dumps({"error": str(exc)}))
        return
    print(json.dumps(seen))


if __name__ == "__main__":
    main()

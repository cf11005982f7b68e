"""Wake-ups on change: SQLite's data_version moves when another connection commits.

`PRAGMA data_version`, not apsw's `Connection.data_version()`: the file control behind the latter
reports the pager's counter as of the connection's last read, so a waiter that reads nothing
else would see another process's commit only when its wait ran out."""

from __future__ import annotations

import threading
import time

import apsw

from engine.backends.sqlite.connection import (
    ConnectionPool,
    scalar,
    storage_errors,
)

# How often a sleeping leader looks at data_version: a read of shared memory, no disk I/O.
_LOOK_EVERY_S = 0.025


def _data_version(conn: apsw.Connection) -> int:
    return int(scalar(conn, "PRAGMA data_version"))


class SqliteChangeFeed:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._poke = threading.Event()
        self._seen: dict[int, int] = {}

    def wait(self, seconds: float, wake: threading.Event | None = None) -> bool:
        conn = self._pool.get()
        me = threading.get_ident()
        with storage_errors(self._pool.path):
            if me not in self._seen:
                # A thread's first wait has no baseline: a commit made since its last look
                # would go unseen for the whole wait. Report a change; the caller looks again.
                self._seen[me] = _data_version(conn)
                return True
            deadline = time.monotonic() + max(0.0, seconds)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                step = min(remaining, _LOOK_EVERY_S)
                if wake is not None:
                    # The caller's own event is waited on directly: a worker thread finishing
                    # must wake its consumer at once, not at the next look.
                    if wake.wait(step):
                        return True
                    if self._poke.is_set():
                        self._poke.clear()
                        return True
                elif self._poke.wait(step):
                    self._poke.clear()
                    return True
                version = _data_version(conn)
                if version != self._seen[me]:
                    self._seen[me] = version
                    return True

    def notify(self) -> None:
        self._poke.set()

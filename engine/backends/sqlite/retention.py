"""Retention overrides, and the ledger as the retention sweeper walks and prunes it, in SQLite
(the overrides are engine.backends.sql.retention's)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from engine.backends.sql.retention import AGES, OLDER, SqlRetentionStore, age_from_row
from engine.backends.sqlite.connection import ConnectionPool, rows
from engine.ports.retention import RunAge, RunStanding

_IDS = "(SELECT value FROM json_each(?))"


class SqliteRetentionStore(SqlRetentionStore[ConnectionPool]):
    def examine(self, after_run_id: int, limit: int) -> list[RunAge]:
        # The primary key's order: each page is a range seek, whatever the ledger's size.
        sql = f"{AGES} WHERE r.id > ? AND {OLDER} ORDER BY r.id LIMIT ?"
        return [age_from_row(r) for r in self._pool.read(sql, (after_run_id, limit))]

    def delete(
        self, run_ids: Sequence[int], *, still: Callable[[RunAge], bool] | None = None
    ) -> list[RunAge]:
        if not run_ids:
            return []
        with self._pool.transaction() as conn:
            # Judged again under the write lock: only what is terminal (and still wanted) now.
            # The ids given are a sweep's page, close together: one range read of the primary
            # key is cheaper than as many lookups.
            wanted = set(run_ids)
            removable = [
                age
                for age in (
                    age_from_row(r)
                    for r in rows(
                        conn,
                        f"{AGES} WHERE r.id BETWEEN ? AND ? AND {OLDER} ORDER BY r.id",
                        (min(wanted), max(wanted)),
                    )
                    if r[0] in wanted
                )
                if age.standing is not RunStanding.OPEN and (still is None or still(age))
            ]
            if not removable:
                return []
            ids = json.dumps([age.run_id for age in removable])
            conn.execute(f"DELETE FROM fire_queue WHERE run_id IN {_IDS}", (ids,))
            conn.execute(f"DELETE FROM runs WHERE id IN {_IDS}", (ids,))
        return removable

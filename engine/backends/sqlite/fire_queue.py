"""The fire queue in SQLite: claim, heartbeat, settle, requeue (the rest is
engine.backends.sql.fire_queue's).

Every call is one BEGIN IMMEDIATE transaction, so a claim's overlap decision and its claim are
one step: SQLite's single writer means two consumers cannot both see a schedule idle.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

import apsw

from engine.backends.sql import Row
from engine.backends.sql.fire_queue import SettlePlan, SqlFireQueue, held_and_looked
from engine.backends.sql.fire_rows import (
    CANDIDATES,
    CLEAR_CLAIM,
    FIRE_COLUMNS,
    FIRE_FROM,
    candidate_from_row,
    claimable_clause,
    fire_from_row,
    settle_fire_sql,
    settle_run_sql,
    stale_ack_sql,
)
from engine.backends.sqlite.connection import ConnectionPool
from engine.backends.sqlite.runs import insert_run
from engine.domain.overlap import Candidate, plan_claim
from engine.domain.run import NewRun, RunState
from engine.ports.fire_queue import Claim, Outcome

_CLAIMABLE = claimable_clause(":now")
_COMMANDS = "f.command IN (SELECT value FROM json_each(:commands))"
_IDS = "(SELECT value FROM json_each(?))"
_SETTLE_FIRE = {outcome: settle_fire_sql(outcome, "?") for outcome in Outcome}
_SETTLE_RUN = settle_run_sql("?")
_STALE_ACK = stale_ack_sql("?")
# Settling many fires alike in one statement: the ones whose change is the same for all but
# the run id (the ids bound as one JSON list), and their runs, bound as [[id, finished], ...].
_ONE_STATEMENT = frozenset({Outcome.COMPLETE, Outcome.RELEASE})
_SETTLE_FIRES = {
    outcome: settle_fire_sql(outcome, "?").removesuffix("WHERE run_id = ?")
    + f"WHERE run_id IN {_IDS}"
    for outcome in _ONE_STATEMENT
}
_SETTLE_RUNS = (
    "UPDATE runs SET state = ?, error = NULL, output = NULL, exit_code = NULL, "
    "finished_at = j.value ->> 1 FROM json_each(?) AS j WHERE runs.id = j.value ->> 0"
)


class SqliteFireQueue(SqlFireQueue[ConnectionPool]):
    def _insert_run(self, conn: apsw.Connection, run: NewRun, now: int) -> int | None:
        return insert_run(conn, run, now)

    # -- consumers --------------------------------------------------------------------------

    def _take(
        self,
        conn: apsw.Connection,
        claim: Claim,
        now: int,
        limit: int,
        commands: Collection[str] | None,
    ) -> None:
        args: dict[str, Any] = {"now": now}
        only = ""
        if commands is not None:
            args["commands"] = json.dumps(sorted(commands))
            only = f" AND {_COMMANDS}"
        running: dict[str, list[int]] = {}
        for sid, rid in conn.execute(
            "SELECT schedule_id, run_id FROM fire_queue "
            "WHERE lease_token IS NOT NULL AND consumed_till > ?",
            (now,),
        ):
            running.setdefault(sid, []).append(rid)
        found = self._candidates(conn, args, only, running, limit)
        plan = plan_claim(found, running, limit)
        self._apply_claim(conn, claim, plan.claim, now)
        self._finish_unrun(conn, plan.skip, RunState.SKIPPED, now)
        self._finish_unrun(conn, plan.cancel, RunState.CANCELLED, now)
        claim.skipped, claim.cancelled = plan.skip, plan.cancel
        for sid in plan.cancel_running:
            for rid in running.get(sid, []):
                conn.execute(
                    "UPDATE fire_queue SET cancel_requested_at = ? "
                    "WHERE run_id = ? AND cancel_requested_at IS NULL",
                    (now, rid),
                )
                claim.cancel_requested.append(rid)

    def _candidates(
        self,
        conn: apsw.Connection,
        args: dict[str, Any],
        only: str,
        running: dict[str, list[int]],
        limit: int,
    ) -> list[Candidate]:
        found: dict[int, Row] = {}
        defined: dict[str, tuple[str | None, str | None]] = {}
        if running:
            for sid, overlap, status in conn.execute(
                f"SELECT id, overlap, status FROM schedules WHERE id IN {_IDS}",
                (json.dumps(sorted(running)),),
            ):
                defined[sid] = (overlap, status)
        held, looked = held_and_looked(running, defined)
        for row in conn.execute(
            f"{CANDIDATES} WHERE {_CLAIMABLE}{only} "
            "AND f.schedule_id NOT IN (SELECT value FROM json_each(:held)) "
            "ORDER BY f.available_at, f.run_id LIMIT :limit",
            {**args, "held": json.dumps(held), "limit": limit * 2 + 32},
        ):
            found[row[0]] = row
        # The held schedules together: one statement, an index probe per schedule.
        if looked:
            for row in conn.execute(
                f"{CANDIDATES} WHERE "
                "f.schedule_id IN (SELECT value FROM json_each(:looked)) AND "
                f"{_CLAIMABLE}{only} ORDER BY f.available_at, f.run_id LIMIT :cap",
                {**args, "looked": json.dumps(looked), "cap": limit * 2 + 32},
            ):
                found[row[0]] = row
        ordered = sorted(found.values(), key=lambda r: (r[5], r[0]))
        return [candidate_from_row(r) for r in ordered]

    def _apply_claim(
        self, conn: apsw.Connection, claim: Claim, run_ids: list[int], now: int
    ) -> None:
        if not run_ids:
            return
        ids = json.dumps(run_ids)
        # A fire still carrying a token was abandoned: its holder's claim ran out.
        conn.execute(
            "UPDATE fire_queue SET "
            "abandoned_count = abandoned_count + (lease_token IS NOT NULL), "
            "last_abandoned_by = CASE WHEN lease_token IS NOT NULL THEN consumed_by "
            "ELSE last_abandoned_by END, "
            "last_abandoned_at = CASE WHEN lease_token IS NOT NULL THEN consumed_till "
            "ELSE last_abandoned_at END, "
            "lease_token = ?, consumed_till = ?, consumed_by = ?, attempts = attempts + 1, "
            f"cancel_requested_at = NULL WHERE run_id IN {_IDS}",
            (claim.token, claim.claimed_till, claim.consumer, ids),
        )
        conn.execute(
            "UPDATE runs SET state = 'running', started_at = ?, consumer = ?, finished_at = NULL, "
            "exit_code = NULL, output = NULL, "
            "attempts = (SELECT attempts FROM fire_queue WHERE run_id = runs.id), "
            "abandoned = (SELECT abandoned_count FROM fire_queue WHERE run_id = runs.id) "
            f"WHERE id IN {_IDS}",
            (now, claim.consumer, ids),
        )
        claim.fires = [
            fire_from_row(r)
            for r in conn.execute(
                f"SELECT {FIRE_COLUMNS} FROM {FIRE_FROM} WHERE f.run_id IN {_IDS} "
                "ORDER BY f.available_at, f.run_id",
                (ids,),
            )
        ]

    @staticmethod
    def _finish_unrun(
        conn: apsw.Connection, why: dict[int, str], state: RunState, now: int
    ) -> None:
        """Fires decided at claim time never to run (skipped, superseded)."""
        if not why:
            return
        conn.executemany(
            f"UPDATE fire_queue SET completed_at = ?, {CLEAR_CLAIM} WHERE run_id = ?",
            [(now, rid) for rid in why],
        )
        conn.executemany(
            "UPDATE runs SET state = ?, error = ?, finished_at = ? WHERE id = ?",
            [(state.value, reason, now, rid) for rid, reason in why.items()],
        )

    @staticmethod
    def _extend(
        conn: apsw.Connection, token: str, till: int, run_ids: Sequence[int]
    ) -> dict[int, Any]:
        ids = json.dumps(list(run_ids))
        held = dict(
            conn.execute(
                "SELECT run_id, cancel_requested_at FROM fire_queue "
                f"WHERE lease_token = ? AND run_id IN {_IDS}",
                (token, ids),
            )
        )
        conn.execute(
            f"UPDATE fire_queue SET consumed_till = ? WHERE lease_token = ? AND run_id IN {_IDS}",
            (till, token, ids),
        )
        return held

    @staticmethod
    def _held(conn: apsw.Connection, token: str, run_ids: list[int]) -> set[int]:
        return {
            r[0]
            for r in conn.execute(
                f"SELECT run_id FROM fire_queue WHERE lease_token = ? AND run_id IN {_IDS}",
                (token, json.dumps(run_ids)),
            )
        }

    @staticmethod
    def _write_settle(conn: apsw.Connection, token: str, plan: SettlePlan) -> None:
        # The token was matched in this write transaction, which no other writer can enter.
        for outcome, values in plan.fires.items():
            if outcome in _ONE_STATEMENT and len(values) > 1:
                # The same change for every fire of the batch: one statement, not one each.
                when = values[0][:-1]
                conn.execute(_SETTLE_FIRES[outcome], (*when, json.dumps([v[-1] for v in values])))
            else:
                conn.executemany(_SETTLE_FIRE[outcome], values)
        # A run that ended with nothing to record beyond its state and end (a no-op's, say):
        # one statement per state for the batch. The rest (errors, output) one by one.
        plain: dict[str, list[list[int | None]]] = {}
        detailed: list[tuple[Any, ...]] = []
        for run in plan.runs:
            state, error, output, exit_code, finished, run_id = run
            if error is None and output is None and exit_code is None:
                plain.setdefault(state, []).append([run_id, finished])
            else:
                detailed.append(run)
        for state, ended in plain.items():
            if len(ended) == 1:
                detailed.append((state, None, None, None, ended[0][1], ended[0][0]))
            else:
                conn.execute(_SETTLE_RUNS, (state, json.dumps(ended)))
        if detailed:
            conn.executemany(_SETTLE_RUN, detailed)
        if plan.stale:
            conn.executemany(_STALE_ACK, plan.stale)

    # -- operators --------------------------------------------------------------------------

    @staticmethod
    def _make_available(
        conn: apsw.Connection, where: str, args: dict[str, Any], at: int
    ) -> list[int]:
        targets = [r[0] for r in conn.execute(f"SELECT f.run_id FROM fire_queue f {where}", args)]
        if targets:
            conn.execute(
                f"UPDATE fire_queue SET available_at = ?, discarded_at = NULL, "
                f"discard_reason = NULL, consecutive_failures = 0, "
                f"requeued_at_attempt = attempts, {CLEAR_CLAIM} WHERE run_id IN {_IDS}",
                (at, json.dumps(targets)),
            )
        return targets

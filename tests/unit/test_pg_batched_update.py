"""batched_update: a one-row UPDATE of the fire queue's settles made one statement for a batch
(the SQL text and its arrays; tests/integration/test_postgres_fire_queue_cost.py runs them)."""

from __future__ import annotations

import pytest

from engine.backends.postgres.batch import batched_update
from engine.backends.sql.fire_rows import settle_fire_sql, settle_run_sql, stale_ack_sql
from engine.ports.fire_queue import Outcome


def test_each_value_becomes_a_column_of_one_unnest_typed_by_its_values() -> None:
    one = settle_fire_sql(Outcome.COMPLETE, "%s") + " AND lease_token = %s"
    batch = batched_update(one, [(7, 1, "t"), (7, 2, "t")])
    assert batch is not None
    sql, args = batch
    assert sql.startswith("UPDATE fire_queue SET completed_at = u.c0, ")
    assert "FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS u(c0, c1, c2)" in sql
    assert sql.endswith(" WHERE run_id = u.c1 AND lease_token = u.c2")
    assert args == [[7, 7], [1, 2], ["t", "t"]]


def test_a_column_of_nothing_but_none_is_a_null_literal() -> None:
    batch = batched_update(settle_run_sql("%s"), [("completed", None, None, None, 9, 4)])
    assert batch is not None
    sql, args = batch
    assert "error = NULL, output = NULL, exit_code = NULL, finished_at = u.c4" in sql
    assert "AS u(c0, c4, c5) WHERE id = u.c5" in sql
    assert args == [["completed"], [9], [4]]


def test_none_beside_values_stays_in_the_array() -> None:
    batch = batched_update(
        settle_run_sql("%s"),
        [("failed", "boom", None, 1, 9, 4), ("completed", None, None, None, 9, 5)],
    )
    assert batch is not None
    sql, args = batch
    assert "output = NULL" in sql  # none has output: no array for it
    assert args[1] == ["boom", None]
    assert args[2] == [1, None]


def test_two_rows_for_one_key_are_not_batched() -> None:
    # One UPDATE changes a row once: two stale settlements of one fire must count twice.
    assert batched_update(stale_ack_sql("%s"), [("c", 1, 5), ("c", 1, 5)]) is None


def test_a_column_of_mixed_or_unknown_types_is_not_batched() -> None:
    assert (
        batched_update(
            settle_run_sql("%s"), [("a", None, None, 1, 9, 4), ("a", None, None, "x", 9, 5)]
        )
        is None
    )
    assert (
        batched_update(
            settle_run_sql("%s"), [("a", None, None, None, 9.5, 4), ("a", None, None, None, 9, 5)]
        )
        is None
    )
    assert batched_update(settle_run_sql("%s"), [("a", None, None, None, b"x", 4)]) is None


def test_a_bool_is_sent_as_boolean_not_bigint() -> None:
    batch = batched_update("UPDATE t SET flag = %s WHERE id = %s", [(True, 1), (False, 2)])
    assert batch is not None
    assert "unnest(%s::boolean[], %s::bigint[])" in batch[0]


@pytest.mark.parametrize(
    ("sql", "rows", "why"),
    [
        ("UPDATE t SET a = %s WHERE id = %s", [], "at least one row"),
        ("UPDATE t SET a = %s WHERE id = %s", [(1,)], "2 values"),
        ("UPDATE t SET a = %(a)s WHERE id = %s", [(1,)], "placeholders"),
        ("UPDATE t SET a = %s, b = %s", [(1, 2)], "end in WHERE"),
    ],
)
def test_a_statement_it_cannot_batch_is_refused_by_name(
    sql: str, rows: list[tuple[object, ...]], why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        batched_update(sql, rows)

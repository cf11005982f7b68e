"""batched_update and array_literal: the one-row UPDATEs of the fire queue's settles made one
statement for a batch (the SQL text and its parameters;
tests/integration/test_postgres_fire_queue_cost.py runs them on the server)."""

from __future__ import annotations

import pytest

from engine.backends.postgres.arrays import array_literal, int_array
from engine.backends.postgres.batch import batched_update
from engine.backends.sql.fire_rows import settle_fire_sql, settle_run_sql, stale_ack_sql
from engine.ports.fire_queue import Outcome

COMPLETE = settle_fire_sql(Outcome.COMPLETE, "%s") + " AND lease_token = %s"


def test_values_that_differ_become_columns_of_one_unnest_and_the_same_stay_parameters() -> None:
    batch = batched_update(COMPLETE, [(7, 1, "t"), (7, 2, "t")])
    assert batch is not None
    sql, args = batch
    assert sql.startswith("UPDATE fire_queue SET completed_at = %s, ")
    assert " FROM unnest(%s::bigint[]) AS u(c1) WHERE run_id = u.c1 AND lease_token = %s" in sql
    assert args == [7, "{1,2}", "t"]  # in the order their marks appear


def test_each_column_that_differs_is_typed_by_its_values_none_among_them() -> None:
    rows = [("failed", "boom", None, 1, 9, 4), ("completed", None, None, None, 9, 5)]
    batch = batched_update(settle_run_sql("%s"), rows)
    assert batch is not None
    sql, args = batch
    assert sql == (
        "UPDATE runs SET state = u.c0, error = u.c1, output = %s, exit_code = u.c3, "
        "finished_at = %s FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::bigint[]) "
        "AS u(c0, c1, c3, c5) WHERE id = u.c5"
    )
    assert args == [None, 9, '{"failed","completed"}', '{"boom",NULL}', "{1,NULL}", "{4,5}"]


def test_one_row_is_the_statement_as_written() -> None:
    batch = batched_update(COMPLETE, [(7, 1, "t")])
    assert batch is not None
    assert batch[1] == [7, "{1}", "t"]


def test_two_rows_for_one_key_are_not_batched() -> None:
    # One UPDATE changes a row once: two stale settlements of one fire must count twice.
    assert batched_update(stale_ack_sql("%s"), [("c", 1, 5), ("c", 1, 5)]) is None


def test_a_column_of_mixed_or_unknown_types_is_not_batched() -> None:
    run = settle_run_sql("%s")
    assert batched_update(run, [("a", None, None, 1, 9, 4), ("a", None, None, "x", 9, 5)]) is None
    assert (
        batched_update(run, [("a", None, None, None, 9.5, 4), ("a", None, None, None, 9, 5)])
        is None
    )
    assert (
        batched_update(run, [("a", None, None, None, b"x", 4), ("a", None, None, None, b"y", 5)])
        is None
    )


def test_a_bool_is_sent_as_boolean_not_bigint() -> None:
    batch = batched_update("UPDATE t SET flag = %s WHERE id = %s", [(True, 1), (False, 2)])
    assert batch is not None
    assert "unnest(%s::boolean[], %s::bigint[])" in batch[0]
    assert batch[1] == ["{t,f}", "{1,2}"]


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


def test_array_literals_quote_text_and_spell_null_and_booleans() -> None:
    assert int_array([3, -1, 2**62]) == "{3,-1,4611686018427387904}"
    assert int_array([]) == "{}"
    assert array_literal([1, None, True, False]) == "{1,NULL,t,f}"
    assert array_literal(["a", 'say "hi"', "back\\slash", "NULL", "{,}"]) == (
        '{"a","say \\"hi\\"","back\\\\slash","NULL","{,}"}'
    )

"""One UPDATE for many rows: a statement written for one row (`... WHERE key = %s`, each value
a `%s`) turned into one that reads its values from arrays, `FROM unnest(...)`.

The fire queue's settle statements are written once for both backends, a row at a time
(engine.backends.sql.fire_rows); sent as they are, a settle of a hundred fires is two hundred
statements, each parsed, planned and executed by the server on its own. Batched, it is one
statement per kind of change, whatever the number of rows. A value the same in every row (the
settle's time, the claim's token, the state most runs end in) stays one parameter; the others
travel as array literals (engine.backends.postgres.arrays).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.backends.postgres.arrays import array_literal, int_array

# The array type a column of values is sent as, by the Python type of its values.
_ARRAY_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int
    (int, "bigint"),
    (str, "text"),
)
_MARK = "%s"
_WHERE = " WHERE "


def _array_type(kinds: set[type]) -> str | None:
    """The SQL type of an array of values of `kinds` (NoneType among them), or None when they
    have no one type here."""
    kinds = kinds - {type(None)}
    for kind, sql in _ARRAY_TYPES:
        if kinds == {kind}:
            return sql
    return None


def batched_update(one_row: str, rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]] | None:
    """`one_row` (an UPDATE ending in `WHERE <key> = %s ...`, its first value after WHERE the
    key) applied to every row of `rows` (each the values of its %s marks, in order), as one
    statement and its parameters; None when the rows cannot share one: two rows for one key
    (one UPDATE changes a row at most once, the row-by-row statements would change it twice),
    or a column of values of no one type here (the caller sends those row by row)."""
    if not rows:
        raise ValueError("a batched update needs at least one row")
    parts = one_row.split(_MARK)
    width = len(parts) - 1
    if any(len(r) != width for r in rows):
        raise ValueError(f"every row must have the statement's {width} values")
    if "%" in "".join(parts).replace("%%", ""):
        raise ValueError("the statement may have no other placeholders than %s")
    head, where, _ = one_row.rpartition(_WHERE)
    before = head.count(_MARK)  # the marks before WHERE; the first one after it is the key
    if not where or before >= width:
        raise ValueError("the statement must end in WHERE with its key among the values")
    columns = list(zip(*rows, strict=True))
    keys = columns[before]
    if len(set(keys)) != len(keys):
        return None
    names: list[str] = []  # what each mark becomes
    head_args: list[Any] = []  # the one-value parameters before WHERE
    tail_args: list[Any] = []  # and after it
    arrays: list[str] = []
    array_args: list[str] = []
    for i, values in enumerate(columns):
        kinds = set(map(type, values))
        if i != before and len(kinds) == 1 and values.count(values[0]) == len(values):
            names.append(_MARK)  # one value for every row: a parameter, typed by its place
            (head_args if i < before else tail_args).append(values[0])
            continue
        sql_type = _array_type(kinds)
        if sql_type is None:
            return None
        names.append(f"u.c{i}")
        arrays.append(f"{_MARK}::{sql_type}[]")
        array_args.append(int_array(values) if kinds == {int} else array_literal(values))
    text = parts[0]
    for name, part in zip(names, parts[1:], strict=True):
        text += name + part
    head, _, condition = text.rpartition(_WHERE)
    aliases = ", ".join(n.removeprefix("u.") for n in names if n != _MARK)
    sql = f"{head} FROM unnest({', '.join(arrays)}) AS u({aliases}){_WHERE}{condition}"
    return sql, [*head_args, *array_args, *tail_args]

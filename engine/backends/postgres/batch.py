"""One UPDATE for many rows: a statement written for one row (`... WHERE key = %s`, each value
a `%s`) turned into one that reads its values from arrays, `FROM unnest(...)`.

The fire queue's settle statements are written once for both backends, a row at a time
(engine.backends.sql.fire_rows); sent as they are, a settle of a hundred fires is two hundred
statements, each parsed, planned and executed by the server on its own. Batched, it is one
statement per kind of change, whatever the number of rows, and the rows' values travel as a
few arrays (adapted in C by psycopg, not value by value in Python).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The array type a column of values is sent as, by the Python type of its values.
_ARRAY_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int
    (int, "bigint"),
    (float, "double precision"),
    (str, "text"),
)
_MARK = "%s"
_WHERE = " WHERE "


_NULL = "NULL"


def _array_type(values: Sequence[Any]) -> str | None:
    """The SQL type of an array of `values`: _NULL when every value is None (sent as a NULL
    literal instead, which any column takes), None when they have no one type here."""
    present = [v for v in values if v is not None]
    if not present:
        return _NULL
    for kind, sql in _ARRAY_TYPES:
        if all(isinstance(v, kind) and (kind is bool or not isinstance(v, bool)) for v in present):
            return sql
    return None


def batched_update(one_row: str, rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]] | None:
    """`one_row` (an UPDATE ending in `WHERE <key> = %s ...`, its last-but-conditions value the
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
    if not where or head.count(_MARK) >= width:
        raise ValueError("the statement must end in WHERE with its key among the values")
    columns = list(zip(*rows, strict=True))
    key = head.count(_MARK)  # the first mark after WHERE
    keys = columns[key]
    if len(set(keys)) != len(keys):
        return None
    names: list[str] = []
    arrays: list[str] = []
    args: list[Any] = []
    for i, values in enumerate(columns):
        sql_type = _array_type(values)
        if sql_type is None:
            return None
        if sql_type == _NULL:
            names.append(_NULL)
            continue
        names.append(f"u.c{i}")
        arrays.append(f"{_MARK}::{sql_type}[]")
        args.append(list(values))
    aliases = ", ".join(n.removeprefix("u.") for n in names if n != _NULL)
    text = parts[0]
    for name, part in zip(names, parts[1:], strict=True):
        text += name + part
    head, _, condition = text.rpartition(_WHERE)
    sql = f"{head} FROM unnest({', '.join(arrays)}) AS u({aliases}){_WHERE}{condition}"
    return sql, args

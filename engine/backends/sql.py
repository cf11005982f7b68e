"""What the code shared by the SQL backends asks of each one.

SQLite (apsw) and PostgreSQL (psycopg) run the same SQL for most of what the stores do; they
differ in how a value is bound (`?` or `%s`), how a list is bound (JSON read back with
json_each, or an array), and in a few spellings. A `Dialect` says those; a `SqlPool` runs one
statement on the calling thread's connection. What differs beyond that (locking, the single
writer's shortcuts) stays in each backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

Row = tuple[Any, ...]
Args = Sequence[Any] | Mapping[str, Any]
# The condition keeping only the rows of an operator's tenants, and its positional arguments;
# no condition for None (every tenant).
TenantsClause = Callable[[str, frozenset[str] | None], tuple[str | None, list[Any]]]
# A condition that a text column starts with a prefix, and its positional arguments.
StartsWith = Callable[[str, str], tuple[str, list[Any]]]

C_co = TypeVar("C_co", covariant=True)


@dataclass(frozen=True)
class Dialect:
    """How one backend spells what the shared SQL leaves open."""

    mark: str  # the positional placeholder
    named: str  # a named placeholder, `{}` standing for the name
    # `{column}` is one of the list bound at `{mark}` (`{type}`: the SQL type of its items).
    in_list: str
    # A list as `in_list` binds it.
    bind_list: Callable[[Sequence[Any]], Any]
    tenants: TenantsClause
    starts_with: StartsWith
    # Put after a text column in ORDER BY: byte order, which is how SQLite compares text.
    byte_order: str

    def param(self, name: str) -> str:
        """The named placeholder of `name`."""
        return self.named.format(name)

    def one_of(self, column: str, mark: str, sql_type: str) -> str:
        """`column` is one of the list bound at `mark` (of items of `sql_type`)."""
        return self.in_list.format(column=column, mark=mark, type=sql_type)

    def marks(self, count: int) -> str:
        """`count` positional placeholders, comma-separated (a VALUES list)."""
        return ", ".join([self.mark] * count)


class SqlPool(Protocol[C_co]):
    """A backend's connections, one per thread, as shared store code uses them. Each call
    raises the driver's errors as StorageError naming the database."""

    @property
    def dialect(self) -> Dialect: ...

    def read(self, sql: str, args: Args = ()) -> list[Row]:
        """The rows of one statement, outside any transaction of its own."""
        ...

    def write(self, sql: str, args: Args = ()) -> int:
        """One statement in a write transaction of its own (a savepoint of one the thread
        has open); the number of rows it changed."""
        ...

    def transaction(self) -> AbstractContextManager[C_co]:
        """A write transaction on the thread's connection (a savepoint of one it has open),
        committed at the end of the block and rolled back on any exception."""
        ...


def first(pool: SqlPool[Any], sql: str, args: Args = ()) -> Row | None:
    """The first row of a read, or None."""
    found = pool.read(sql, args)
    return found[0] if found else None


def scalar(pool: SqlPool[Any], sql: str, args: Args = ()) -> Any:
    """The first column of the first row of a read (None when there is no row)."""
    row = first(pool, sql, args)
    return None if row is None else row[0]


def count(pool: SqlPool[Any], table: str, column: str, value: Any = None) -> int:
    """The rows of `table`; with `value`, only those whose `column` holds it."""
    if value is None:
        return int(scalar(pool, f"SELECT count(*) FROM {table}"))
    sql = f"SELECT count(*) FROM {table} WHERE {column} = {pool.dialect.mark}"
    return int(scalar(pool, sql, (value,)))


@dataclass
class Where:
    """A WHERE clause put together condition by condition, with its positional arguments in
    the order they are bound."""

    dialect: Dialect
    conditions: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)

    def add(self, condition: str, *args: Any) -> None:
        self.conditions.append(condition)
        self.args += args

    def equal(self, column: str, value: Any) -> None:
        """`column` holds `value`, unless `value` is None (then no condition)."""
        if value is not None:
            self.add(f"{column} = {self.dialect.mark}", value)

    def scope(self, column: str, tenants: frozenset[str] | None) -> None:
        """Only the rows of `tenants` (None: every tenant; empty: none)."""
        condition, args = self.dialect.tenants(column, tenants)
        if condition is not None:
            self.add(condition, *args)

    def __str__(self) -> str:
        return f"WHERE {' AND '.join(self.conditions)}" if self.conditions else ""

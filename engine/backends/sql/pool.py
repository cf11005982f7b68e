"""What the shared store code asks of each SQL backend's connections: a `SqlPool` runs one
statement on the calling thread's connection, spelt in its `Dialect`; and the few helpers every
store uses on one (first, scalar, count, Where)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from engine.backends.sql.dialect import Dialect

Row = tuple[Any, ...]
Args = Sequence[Any] | Mapping[str, Any]
C_co = TypeVar("C_co", covariant=True)


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

"""How one SQL backend spells what the shared SQL (engine.backends.sql) leaves open.

SQLite (apsw) and PostgreSQL (psycopg) run the same SQL for most of what the stores and the
console's read model do; they differ in how a value is bound (`?` or `%s`), how a list is bound
(JSON read back with json_each, or an array), and in a few spellings and orders. One `Dialect`
per backend says all of those, for the stores and the read model alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# The condition keeping only the rows of an operator's tenants, and its positional arguments;
# no condition for None (every tenant), one that is always false for no tenant.
TenantsClause = Callable[[str, frozenset[str] | None], tuple[str | None, list[Any]]]
# A condition that a text column starts with a prefix, and its positional arguments.
StartsWith = Callable[[str, str], tuple[str, list[Any]]]


@dataclass(frozen=True)
class Dialect:
    """How one backend spells what the shared SQL leaves open."""

    mark: str  # the positional placeholder: "?" (SQLite) or "%s" (psycopg)
    named: str  # a named placeholder, `{}` standing for the name
    # `{column}` is one of the list bound at `{mark}` (`{type}`: the SQL type of its items).
    in_list: str
    # A list as `in_list` binds it.
    bind_list: Callable[[Sequence[Any]], Any]
    tenants: TenantsClause
    starts_with: StartsWith
    # Put after a text column in ORDER BY: byte order, which is how SQLite compares text.
    byte_order: str
    # The console's read model (engine.backends.sql.read_model):
    # a subquery per schedule row: its newest RECENT_OUTCOMES runs as space-separated
    # "state:duration" words (duration empty while unfinished), newest first;
    recent: str
    # the ORDER BY of the due part of the schedule list, and of the rest (by tenant, name);
    due_order: str
    idle_order: str
    # every audit chain name the console lists, each once, in byte order.
    chains: str

    def param(self, name: str) -> str:
        """The named placeholder of `name`."""
        return self.named.format(name)

    def one_of(self, column: str, mark: str, sql_type: str) -> str:
        """`column` is one of the list bound at `mark` (of items of `sql_type`)."""
        return self.in_list.format(column=column, mark=mark, type=sql_type)

    def marks(self, count: int) -> str:
        """`count` positional placeholders, comma-separated (a VALUES list)."""
        return ", ".join([self.mark] * count)

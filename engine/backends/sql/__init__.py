"""The SQL the SQLite and PostgreSQL backends share: each store's statements, row codecs and
verdicts (one module per port), the console's read model, and what they ask of a backend (a
`SqlPool` of connections spelling SQL in its `Dialect`). What really differs between the two
(locking, the single writer's shortcuts, the driver) stays in engine.backends.sqlite and
engine.backends.postgres; the schedule and run codec is engine.backends.codec."""

from engine.backends.sql.dialect import Dialect, StartsWith, TenantsClause
from engine.backends.sql.pool import Args, Row, SqlPool, Where, count, first, scalar

__all__ = [
    "Args",
    "Dialect",
    "Row",
    "SqlPool",
    "StartsWith",
    "TenantsClause",
    "Where",
    "count",
    "first",
    "scalar",
]

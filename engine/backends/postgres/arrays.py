"""Arrays sent to PostgreSQL as one array literal (`{1,2,3}`), cast in the SQL (`%s::bigint[]`).

psycopg adapts a Python list element by element in Python (a regular expression per element
decides its quoting): about 1.5 us per element, which for the fire queue's batches (the ids of
a claim, of a settle, their tokens and states) came to more client CPU per fire than the rest
of the claim's SQL. Written here with str.join and str.replace, a list of a few hundred ids is
a few microseconds, and psycopg adapts one string.
"""

from __future__ import annotations

from collections.abc import Iterable

ArrayValue = int | str | bool | None


def _element(value: ArrayValue) -> str:
    if value is None:
        return "NULL"
    if value is True:
        return "t"
    if value is False:
        return "f"
    if isinstance(value, int):
        return str(value)
    # Quoted, with backslash and double quote escaped: any other character stands for itself
    # (NULL as text is the string "NULL", braces and commas are data inside the quotes).
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def array_literal(values: Iterable[ArrayValue]) -> str:
    """The PostgreSQL array literal of `values`, to be cast to its type in the SQL."""
    return "{" + ",".join(map(_element, values)) + "}"


def int_array(values: Iterable[int]) -> str:
    """array_literal for integers only (the common case, without a check per element)."""
    return "{" + ",".join(map(str, values)) + "}"

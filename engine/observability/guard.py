"""A cardinality guard: a bounded number of distinct label values per process.

Every distinct label value is a time series Prometheus keeps: a million schedules must not
become a million series in each family. The first `limit` distinct values keep their own;
later ones are reported under OVERFLOW, and each observation so mapped is counted, so an
operator sees that the cap was reached (and can raise it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

OVERFLOW = "__overflow__"
DEFAULT_MAX_SCHEDULES = 200
DEFAULT_MAX_TENANTS = 200


class CardinalityGuard:
    """Admits the first `limit` distinct keys; `on_overflow` is called for each refusal."""

    def __init__(self, limit: int, on_overflow: Callable[[], None] | None = None) -> None:
        if limit < 0:
            raise ValueError("a cardinality limit must not be negative")
        self.limit = limit
        self._kept: set[Hashable] = set()
        self._lock = threading.Lock()
        self._on_overflow = on_overflow

    def admit(self, key: Hashable) -> bool:
        """Whether `key` keeps its own label value."""
        if key in self._kept:
            return True
        if len(self._kept) < self.limit:  # once full, it stays full: no lock from then on
            with self._lock:
                if key in self._kept:
                    return True
                if len(self._kept) < self.limit:
                    self._kept.add(key)
                    return True
        if self._on_overflow is not None:
            self._on_overflow()
        return False

    def __len__(self) -> int:
        return len(self._kept)

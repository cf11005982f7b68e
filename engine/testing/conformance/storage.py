"""The base of the storage suites: a new, empty store per test, on a manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from engine.domain.clock import ManualClock
from engine.domain.timeutil import parse_instant
from engine.ports.storage import Storage

# The suites' "now" at the start of every test: a Monday, midnight UTC, far from any DST
# transition.
T0 = parse_instant("2026-01-05T00:00:00Z")


class StorageConformance:
    """Subclass a storage suite and implement `open_storage`.

    Each test gets a new, empty store on a ManualClock that starts at T0; the suites move the
    clock themselves. The store must be able to sign audit entries (dispatch audits every
    fire): give it an audit key.
    """

    def open_storage(self, clock: ManualClock, directory: Path) -> AbstractContextManager[Storage]:
        """A context manager giving a new, empty store on `clock`, closed at its end.
        `directory` is a temporary directory of the test's own, for files."""
        raise NotImplementedError(f"{type(self).__name__} must implement open_storage")

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock(T0)

    @pytest.fixture
    def storage(self, clock: ManualClock, tmp_path: Path) -> Iterator[Storage]:
        with self.open_storage(clock, tmp_path) as opened:
            yield opened

"""The storage suites ship in the package: importable by name from engine.testing.conformance,
by a user whose checkout has no `tests`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SUITES = [
    "ScheduleStoreConformance",
    "RunLedgerConformance",
    "TenantIsolationConformance",
    "ApprovalStoreConformance",
]

# Run from the checkout's root, where `tests` is importable: nothing may import it.
PROBE = """
import sys
from engine.testing.conformance import {suite} as suite
from engine.testing.conformance.storage import StorageConformance
assert issubclass(suite, StorageConformance), suite.__mro__
assert any(name.startswith("test_") for name in dir(suite)), "the suite has no tests"
leaked = sorted(m for m in sys.modules if m == "tests" or m.startswith("tests."))
assert not leaked, f"importing {suite} imported {{leaked}}"
"""


@pytest.mark.parametrize("suite", SUITES)
def test_a_suite_imports_by_name_without_importing_our_tests(suite: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(suite=suite)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr

"""The attack suite's fixtures: real Unix accounts (root only) and the documented deployment."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.security.deployment import Accounts, accounts


@pytest.fixture
def ops() -> Iterator[Accounts]:
    """Three operators in a fresh group, and an outsider; removed afterwards."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("creates Unix accounts with useradd: run the tests as root (CI does)")
    with accounts() as made:
        yield made

"""Several processes opening one new database file at the same moment create it once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

pytestmark = pytest.mark.slow

# Imports first, then wait for the go byte on stdin, so that every process opens the file at
# the same moment rather than staggered by its start-up.
OPENER = """
import sys
from engine import open_engine
sys.stdin.read(1)
open_engine(sys.argv[1]).close()
print("ok")
"""


@pytest.mark.parametrize("attempt", range(3))
def test_processes_opening_a_new_file_at_once_all_succeed(tmp_path: Path, attempt: int) -> None:
    db = tmp_path / f"new-{attempt}.db"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        for _ in range(6)
    ]
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("g")
    for process in processes:
        assert process.stdin is not None
        process.stdin.close()  # flushes the byte: all six start within a moment
    codes = [process.wait(60) for process in processes]
    errors = [process.stderr.read() if process.stderr else "" for process in processes]
    assert codes == [0] * 6, errors

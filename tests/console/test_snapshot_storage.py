"""The snapshots live under the top-level snapshots/ folder, and updating one of them leaves
the others alone (syrupy deletes snapshots it believes unused, and with a path spelled the
wrong way it believed every sibling unused)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

ROOT = Path(__file__).resolve().parents[2]
MODULE = "test_snapshots"


def copy_tree(target: Path) -> None:
    """The tests and the snapshots, laid out as in the repository."""
    shutil.copytree(ROOT / "tests", target / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "snapshots", target / "snapshots")


@pytest.mark.slow
@pytest.mark.parametrize(
    "selection",
    [
        [f"tests/console/{MODULE}.py::test_help"],
        [f"tests/console/{MODULE}.py", "-k", "test_help"],
    ],
    ids=["node-id", "keyword"],
)
def test_updating_one_snapshot_keeps_its_siblings(tmp_path: Path, selection: list[str]) -> None:
    copy_tree(tmp_path)
    folder = tmp_path / "snapshots" / MODULE
    before = sorted(p.name for p in folder.iterdir())
    assert len(before) > 1
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--snapshot-update"),
            *("--rootdir", str(tmp_path), "-c", str(ROOT / "pyproject.toml"), *selection),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in folder.iterdir()) == before
    assert not (tmp_path / "tests" / "console" / "__snapshots__").exists()

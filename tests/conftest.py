"""Shared fixtures: real database files, a manual clock, the CLI in a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine import Engine, ManualClock, open_engine
from engine.backends.sqlite import SqliteBackend
from engine.domain.audit import KeyRing
from engine.domain.timeutil import parse_instant
from engine.ports.storage import Storage
from tests.pg import fresh_schema

# A Monday, midnight UTC: far from any DST transition.
T0 = parse_instant("2026-01-05T00:00:00Z")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "vortos.db"


@pytest.fixture
def engine(db_path: Path, clock: ManualClock) -> Iterator[Engine]:
    with open_engine(db_path, clock=clock) as opened:
        yield opened


@pytest.fixture(params=["sqlite", "postgres"])
def storage(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> Iterator[Storage]:
    """Every backend, for the conformance suites, with an audit key (dispatch audits every
    fire). PostgreSQL: a schema of its own in the test database, dropped afterwards."""
    keys = KeyRing([b"conformance-suite-audit-key-0001"])
    if request.param == "postgres":
        from engine.backends.postgres import PostgresBackend  # noqa: PLC0415 - an extra

        with fresh_schema() as url:
            backend: Storage = PostgresBackend(url, clock, audit_keys=lambda: keys)
            yield backend
            backend.close()
        return
    backend = SqliteBackend(tmp_path / f"{request.param}.db", clock, audit_keys=lambda: keys)
    yield backend
    backend.close()


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VORTOS_")}
    env["COLUMNS"] = "200"  # tables unwrapped, so tests read whole rows
    env.update(extra or {})
    return env


def run_cli(
    *args: str, db: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> CliResult:
    """`vortos ARGS` in a real process."""
    command = [sys.executable, "-m", "vortos_tui.cli"]
    if db is not None:
        command += ["--db", str(db)]
    done = subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        env=cli_env(env),
        timeout=timeout,
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)

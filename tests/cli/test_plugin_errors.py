"""Acceptance 4 of the plug-ins issue: a misspelt plug-in name, a dotted path to nothing, a
plug-in that raises on import (or whose import needs a missing dependency): each is one clear
error at start, exit 2, and nothing is touched; whether it is named in vortos.toml, by a
VORTOS_* variable or by --lease-driver, and whichever command starts (`vortos run`, `vortos
consume`, `vortos schedule add`).

Also a plug-in that is found but whose factory raises when built: a clear error too (exit 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.support import assert_clean_error, db_state, no_traceback
from tests.conftest import CliResult, run_cli

LEASE = "lease_driver"
SINKS = "audit_sinks"

MODULES = {
    "plugin_explodes.py": 'raise RuntimeError("the plug-in exploded on import")\n',
    "plugin_needs_dependency.py": "import vortos_test_absent_dependency  # noqa: F401\n",
    "plugin_present.py": (
        '"""Imports fine; its factory fails when called."""\n\n\n'
        "class Exploding:\n"
        "    def __init__(self, context: object) -> None:\n"
        '        raise ValueError("cannot reach the lock server")\n'
    ),
}


@dataclass(frozen=True)
class Case:
    setting: str
    value: str
    words: tuple[str, ...]  # besides the setting and the value, the error line says these


CASES = {
    "misspelt lease driver": Case(
        LEASE, "filelok", ("no lease driver of that name", "known: row", "filelock")
    ),
    "misspelt audit sink": Case(SINKS, "jsnol", ("no audit sink of that name", "jsonl")),
    "path to a missing module": Case(
        LEASE, "vortos_no_such_module:Lease", ("no module named 'vortos_no_such_module'",)
    ),
    "path to a missing attribute": Case(
        SINKS, "plugin_present:NoSuchSink", ("plugin_present has no 'NoSuchSink'",)
    ),
    "raises on import": Case(
        LEASE, "plugin_explodes:Lease", ("RuntimeError: the plug-in exploded on import",)
    ),
    "missing dependency": Case(
        SINKS,
        "plugin_needs_dependency:Sink",
        (
            "ModuleNotFoundError",
            "No module named 'vortos_test_absent_dependency'",
            "a dependency of the plug-in is missing",
        ),
    ),
}
LEASE_CASES = [name for name, case in CASES.items() if case.setting == LEASE]

COMMANDS = {
    "run": ("run",),
    "consume": ("consume",),
    "schedule add": ("schedule", "add", "tick", "--command", "noop", "--every", "1m"),
}


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plugin-modules")
    for name, text in MODULES.items():
        (folder / name).write_text(text)
    return folder


def env_with(modules: Path, **variables: str) -> dict[str, str]:
    path = [str(modules), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path), **variables}


def in_file(case: Case, folder: Path) -> Path:
    """A vortos.toml naming the plug-in (a sink beside a good one: the bad one is named)."""
    config = folder / "plugins.toml"
    if case.setting == SINKS:
        config.write_text(f'audit_sinks = ["jsonl", "{case.value}"]\n')
    else:
        config.write_text(f'{case.setting} = "{case.value}"\n')
    return config


def in_environment(case: Case) -> dict[str, str]:
    value = f"jsonl,{case.value}" if case.setting == SINKS else case.value
    return {"VORTOS_" + case.setting.upper(): value}


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@dataclass(frozen=True)
class Snapshot:
    """A database file's bytes and mtime, and (read last) its content."""

    data: bytes
    mtime_ns: int


def snapshot(db: Path) -> Snapshot:
    return Snapshot(db.read_bytes(), db.stat().st_mtime_ns)


def assert_unchanged(db: Path, before: Snapshot, seed_template: Path) -> None:
    after = snapshot(db)
    assert after.mtime_ns == before.mtime_ns, "the database file was written"
    assert after.data == before.data, "the database file's bytes changed"
    assert db_state(db) == db_state(seed_template), "the database's content changed"


def assert_refused(result: CliResult, case: Case) -> None:
    """Exit 2, and one line naming the setting, the value and what is wrong with it."""
    assert_clean_error(result, 2, f"{case.setting} = {case.value!r}", *case.words)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case_name", CASES)
def test_a_broken_plugin_in_the_config_file_stops_the_command_before_a_database_is_created(
    tmp_path: Path, modules: Path, case_name: str, command: str
) -> None:
    case = CASES[case_name]
    config = in_file(case, tmp_path)
    before = files(tmp_path)

    result = run_cli(
        *COMMANDS[command],
        db=tmp_path / "new.db",
        env=env_with(modules, VORTOS_CONFIG=str(config)),
    )

    assert_refused(result, case)
    assert files(tmp_path) == before, "a file was created or changed"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case_name", CASES)
def test_a_broken_plugin_in_the_environment_leaves_an_existing_database_unchanged(
    seeded_db: Path, seed_template: Path, modules: Path, case_name: str, command: str
) -> None:
    case = CASES[case_name]
    before = snapshot(seeded_db)

    result = run_cli(
        *COMMANDS[command], db=seeded_db, env=env_with(modules, **in_environment(case))
    )

    assert_refused(result, case)
    assert_unchanged(seeded_db, before, seed_template)


@pytest.mark.parametrize("case_name", LEASE_CASES)
def test_a_broken_lease_driver_flag_stops_run_before_a_database_is_created(
    tmp_path: Path, modules: Path, case_name: str
) -> None:
    case = CASES[case_name]
    before = files(tmp_path)

    result = run_cli(
        "run", "--lease-driver", case.value, db=tmp_path / "new.db", env=env_with(modules)
    )

    assert_refused(result, case)
    assert files(tmp_path) == before, "a file was created or changed"


@pytest.mark.parametrize("case_name", LEASE_CASES)
def test_a_broken_lease_driver_flag_leaves_an_existing_database_unchanged(
    seeded_db: Path, seed_template: Path, modules: Path, case_name: str
) -> None:
    case = CASES[case_name]
    before = snapshot(seeded_db)

    result = run_cli("run", "--lease-driver", case.value, db=seeded_db, env=env_with(modules))

    assert_refused(result, case)
    assert_unchanged(seeded_db, before, seed_template)


def test_the_flag_wins_over_a_good_lease_driver_in_the_file(tmp_path: Path, modules: Path) -> None:
    config = tmp_path / "vortos.toml"
    config.write_text('lease_driver = "row"\n')
    case = CASES["raises on import"]

    result = run_cli(
        "run",
        "--lease-driver",
        case.value,
        db=tmp_path / "new.db",
        env=env_with(modules, VORTOS_CONFIG=str(config)),
    )

    assert_refused(result, case)
    assert not (tmp_path / "new.db").exists()


def test_every_broken_plugin_is_named_in_the_one_error_line(tmp_path: Path, modules: Path) -> None:
    config = tmp_path / "vortos.toml"
    config.write_text(
        'lease_driver = "filelok"\n'
        'audit_sinks = ["plugin_explodes:Sink", "jsonl", "plugin_present:Nothing"]\n'
        'metrics = ["vortos_no_such_module.metrics.Backend"]\n'
    )

    result = run_cli(
        "run", db=tmp_path / "new.db", env=env_with(modules, VORTOS_CONFIG=str(config))
    )

    line = assert_clean_error(
        result,
        2,
        "lease_driver = 'filelok'",
        "audit_sinks = 'plugin_explodes:Sink'",
        "RuntimeError: the plug-in exploded on import",
        "audit_sinks = 'plugin_present:Nothing'",
        "metrics = 'vortos_no_such_module.metrics.Backend'",
    )
    assert "'jsonl'" not in line
    assert not (tmp_path / "new.db").exists()


# --- found and imported, but its factory raises ------------------------------------------

BUILD_FAILS = "plugin_present:Exploding"
BUILD_ERROR = "ValueError: cannot reach the lock server"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_lease_driver_whose_factory_raises_is_a_clear_error_and_changes_nothing(
    seeded_db: Path, seed_template: Path, modules: Path, command: str
) -> None:
    before = snapshot(seeded_db)

    result = run_cli(
        *COMMANDS[command], db=seeded_db, env=env_with(modules, VORTOS_LEASE_DRIVER=BUILD_FAILS)
    )

    assert_clean_error(result, 2, f"lease_driver = {BUILD_FAILS!r}", "failed to start", BUILD_ERROR)
    assert_unchanged(seeded_db, before, seed_template)


@pytest.mark.parametrize("setting", [SINKS, "metrics"])
def test_a_sink_or_metrics_backend_whose_factory_raises_stops_run_with_a_clear_error(
    tmp_path: Path, modules: Path, setting: str
) -> None:
    # These are built once the database is open and `vortos run` has begun (and logged) its
    # start, so the error is the last line on stderr rather than the only one.
    result = run_cli(
        "run",
        db=tmp_path / "new.db",
        env=env_with(modules, **{"VORTOS_" + setting.upper(): BUILD_FAILS}),
    )

    no_traceback(result)
    assert result.code == 2, result.stderr
    assert result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {setting} = {BUILD_FAILS!r}: "), last
    assert f"failed to start: {BUILD_ERROR}" in last, last


def test_a_sink_whose_factory_raises_leaves_an_existing_database_unchanged(
    seeded_db: Path, seed_template: Path, modules: Path
) -> None:
    before = snapshot(seeded_db)

    result = run_cli("run", db=seeded_db, env=env_with(modules, VORTOS_AUDIT_SINKS=BUILD_FAILS))

    assert result.code == 2, result.stderr
    assert_unchanged(seeded_db, before, seed_template)

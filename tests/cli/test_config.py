"""Settings: defaults < vortos.toml < VORTOS_* < flags; `vortos config show`; a bad setting is
refused by name, value and what is allowed, with exit 2, before the database is touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import SETTINGS
from tests.conftest import run_cli


def shown(result_stdout: str) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = json.loads(result_stdout)
    assert set(found) == {s.name for s in SETTINGS}
    return found


def test_defaults_are_shown_with_their_source(tmp_path: Path) -> None:
    result = run_cli("config", "show", "--json", db=None, env={"VORTOS_CONFIG": ""})
    assert result.code == 0, result.stderr
    found = shown(result.stdout)
    assert found["lease_ttl"] == {"value": 15_000, "source": "default"}
    assert found["tenant_cap"] == {"value": 200, "source": "default"}
    table = run_cli("config", "show")
    assert "lease_ttl" in table.stdout
    assert "15s" in table.stdout


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "vortos.toml"
    config.write_text(
        '[vortos]\nlease_ttl = "20s"\nconsumers = 8\ndb = "from-file.db"\napp = "myjobs"\n'
    )
    result = run_cli(
        "--config",
        str(config),
        "--db",
        str(tmp_path / "flag.db"),
        "config",
        "show",
        "--json",
        env={"VORTOS_LEASE_TTL": "45s"},
    )
    assert result.code == 0, result.stderr
    found = shown(result.stdout)
    assert found["lease_ttl"] == {"value": 45_000, "source": "VORTOS_LEASE_TTL"}
    assert found["consumers"] == {"value": 8, "source": str(config)}
    assert found["app"] == {"value": "myjobs", "source": str(config)}
    assert found["db"] == {"value": str(tmp_path / "flag.db"), "source": "--db"}
    assert found["log_level"]["source"] == "default"


def test_the_config_file_may_be_named_by_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text("tenant_cap = 0\n")  # top-level keys work too
    result = run_cli("config", "show", "--json", env={"VORTOS_CONFIG": str(config)})
    assert shown(result.stdout)["tenant_cap"] == {"value": 0, "source": str(config)}


BAD: list[tuple[dict[str, str], str | None, list[str]]] = [
    ({"VORTOS_LEASE_TTL": "abc"}, None, ["VORTOS_LEASE_TTL='abc'", "lease_ttl must be a duration"]),
    ({"VORTOS_CONSUMERS": "0"}, None, ["VORTOS_CONSUMERS='0'", "an integer from 1 to 256"]),
    ({"VORTOS_TENANT_CAP": "many"}, None, ["tenant_cap must be an integer"]),
    ({"VORTOS_LOG_LEVEL": "loud"}, None, ["log_level must be one of debug, info"]),
    ({"VORTOS_APPROVAL_TTL": "90d"}, None, ["approval_ttl must be a duration from 1s to 30d"]),
    ({}, 'lease_ttl = 5\nconsumers = "x"\n', ["consumers must be an integer"]),
    ({}, 'leese_ttl = "5s"\n', ["unknown setting 'leese_ttl'", "known: "]),
    ({}, "lease_ttl = [1, 2\n", ["is not valid TOML"]),
    ({"VORTOS_LEASE_TTL": "abc", "VORTOS_GRACE": "-1"}, None, ["lease_ttl", "grace"]),
    # A top-level key beside [vortos] was silently ignored: a setting not in force, or a typo.
    (
        {},
        'sensitive_commands = ["process"]\n[vortos]\nlease_ttl = "20s"\n',
        ["top-level key 'sensitive_commands' beside the [vortos] table", "move it into [vortos]"],
    ),
    (
        {},
        'leese_ttl = "5s"\nx = 1\n[vortos]\nconsumers = "x"\n',
        ["top-level keys 'leese_ttl', 'x' beside the [vortos]", "consumers must be an integer"],
    ),
]


@pytest.mark.parametrize(("env", "file_text", "messages"), BAD)
def test_a_bad_setting_is_refused_by_name_and_value_and_nothing_is_touched(
    tmp_path: Path, env: dict[str, str], file_text: str | None, messages: list[str]
) -> None:
    db = tmp_path / "vortos.db"
    args: list[str] = []
    if file_text is not None:
        config = tmp_path / "vortos.toml"
        config.write_text(file_text)
        args = ["--config", str(config)]
    for command in (["schedule", "list"], ["db", "init"], ["run"]):
        result = run_cli(*args, *command, db=db, env=env, timeout=30)
        assert result.code == 2, (command, result)
        for message in messages:
            assert message in result.stderr, (command, result.stderr)
        assert "Traceback" not in result.stderr
        assert not db.exists(), "a refused setting must not create or open the database"


def test_a_config_file_that_is_not_utf8_is_refused_clearly_and_nothing_is_touched(
    tmp_path: Path,
) -> None:
    db = tmp_path / "vortos.db"
    config = tmp_path / "vortos.toml"
    config.write_bytes(b"\xff\xfel\x00e\x00a\x00s\x00e\x00 = 1\n")  # UTF-16, as Notepad saves
    result = run_cli("--config", str(config), "schedule", "list", db=db)
    assert result.code == 2, result
    assert (
        result.stderr.strip()
        == f"error: config file {config} is not UTF-8 text (byte 0): save it as UTF-8"
    )
    assert not db.exists()


def test_plugin_tables_beside_a_vortos_table_are_not_stray_keys(tmp_path: Path) -> None:
    config = tmp_path / "vortos.toml"
    config.write_text('[vortos]\nlease_ttl = "20s"\n[plugin.filelock]\npath = "/tmp/x"\n')
    result = run_cli("--config", str(config), "config", "show", "--json")
    assert result.code == 0, result.stderr
    assert shown(result.stdout)["lease_ttl"] == {"value": 20_000, "source": str(config)}


def test_a_missing_named_config_file_is_refused(tmp_path: Path) -> None:
    result = run_cli("--config", str(tmp_path / "absent.toml"), "config", "show")
    assert result.code == 2
    assert "does not exist" in result.stderr


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Settings", 1)[1].split("\n## ", 1)[0]
    for setting in SETTINGS:
        assert f"| `{setting.name}` | `{setting.env}` |" in section, setting.name

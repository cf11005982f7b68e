"""The typed settings: engine/settings_values.py is what engine.settings_codegen writes from the
settings table, its fields are exactly the table's settings, and every value the table gives or
parses has its field's type."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
import types
import typing
from pathlib import Path

import pytest

from engine import settings_codegen
from engine.config import SETTINGS, Setting, Settings, load_settings
from engine.settings_values import SettingValues

ROOT = Path(__file__).resolve().parents[2]
HINTS = typing.get_type_hints(SettingValues)


def conforms(value: object, hint: object) -> bool:
    """`value` is of type `hint` (the few forms settings use: classes, unions, tuple[X, ...])."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is tuple:
        item, ellipsis = typing.get_args(hint)
        assert ellipsis is Ellipsis, hint
        return isinstance(value, tuple) and all(conforms(v, item) for v in value)
    assert isinstance(hint, type), hint
    return isinstance(value, hint)


def test_the_module_is_what_the_generator_writes_from_the_table() -> None:
    committed = (ROOT / "engine" / "settings_values.py").read_text(encoding="utf-8")

    assert committed == settings_codegen.render(), (
        "engine/settings_values.py is stale: run python -m engine.settings_codegen"
    )


def test_the_generators_check_mode_agrees() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "engine.settings_codegen", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )

    assert done.returncode == 0, done.stderr


def test_its_fields_are_exactly_the_tables_settings_in_order() -> None:
    names = [f.name for f in dataclasses.fields(SettingValues)]

    assert names == [s.name for s in SETTINGS]


def test_settings_adds_only_private_fields_beside_them() -> None:
    extra = {f.name for f in dataclasses.fields(Settings)} - set(HINTS)

    assert extra
    assert all(name.startswith("_") for name in extra), extra


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_each_default_has_its_fields_type(setting: Setting) -> None:
    assert conforms(setting.default, HINTS[setting.name]), (setting.name, setting.default)


def test_every_parsed_value_has_its_fields_type(tmp_path: Path) -> None:
    config = tmp_path / "vortos.toml"
    # Every setting whose default is None given a value, so each parser's result is seen.
    config.write_text(
        textwrap.dedent(
            """\
            db = "postgresql://vortos@db/vortos"
            app = "mypkg.jobs"
            redis_url = "redis://127.0.0.1:6379/0"
            lease_ttl = "30s"
            control_socket = "/run/vortos.sock"
            control_group = "ops"
            audit_key_file = "/etc/vortos/audit.key"
            metrics_port = 9100
            enqueuer = "mypkg.broker:Broker"
            sensitive_commands = ["wipe"]
            audit_sinks = ["jsonl"]
            """
        ),
        encoding="utf-8",
    )
    settings = load_settings(config=config, env={"VORTOS_PROCESS_ENV_ALLOW": "TZ"})

    for setting in SETTINGS:
        value = getattr(settings, setting.name)
        assert conforms(value, HINTS[setting.name]), (setting.name, value)
    assert settings.source("lease_ttl") == str(config)


def test_the_settings_are_frozen() -> None:
    settings = load_settings(config=None, env={})

    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.lease_ttl = 1  # type: ignore[misc]


def test_the_repr_shows_values_as_config_show_does_never_a_password() -> None:
    settings = load_settings(config=None, env={"VORTOS_DB": "postgresql://ops:hunter2@db/v"})

    shown = repr(settings)

    assert "hunter2" not in shown
    assert "lease_ttl=15s" in shown

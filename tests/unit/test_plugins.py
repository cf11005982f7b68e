"""engine.plugins.registry (finding and building what a setting names) and the settings that name
plug-ins (engine.config): built-in names, installed entry points, dotted paths in both forms,
and every way a name can be wrong, each refused by a PluginError that says what is wrong."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.config import Settings, load_settings
from engine.domain.clock import ManualClock
from engine.domain.errors import InvalidInput
from engine.plugins.registry import (
    PORT_BY_SETTING,
    Plugin,
    PluginContext,
    PluginError,
    available,
    find,
    is_dotted_path,
    select_plugins,
)
from tests.conftest import T0

LEASE = PORT_BY_SETTING["lease_driver"]
SINKS = PORT_BY_SETTING["audit_sinks"]
EXAMPLES = "entry point of vortos-example-plugins"

LEASES_MODULE = """
from engine.domain.errors import InvalidInput
from engine.plugins.registry import PluginError


class Lease:
    def __init__(self, context):
        self.context = context

    def acquire(self, key, token, holder, ttl_ms):
        return None

    def renew(self, key, token, ttl_ms):
        return None

    def release(self, key, token):
        return None

    def current(self, key):
        return None


class Factories:
    @staticmethod
    def lease(context):
        return Lease(context)


NOT_A_FACTORY = 42


class HalfALease:
    def __init__(self, context):
        pass

    def acquire(self, key, token, holder, ttl_ms):
        return None

    def release(self, key, token):
        return None


def raises(context):
    raise ValueError("cannot reach the lock server")


def refuses(context):
    raise InvalidInput("[plugin.locks] needs a directory")


def knows_better(context):
    raise PluginError("lease_driver = 'locks': its own words")
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package of plug-in modules on sys.path, under a name of its own (so no test sees
    another's modules cached): `leases` works, `explodes` raises on import, `needs` imports a
    module that is not installed."""
    name = f"vortos_plugtest_{uuid.uuid4().hex[:12]}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "leases.py").write_text(textwrap.dedent(LEASES_MODULE))
    (folder / "explodes.py").write_text('raise RuntimeError("exploded on import")\n')
    (folder / "needs.py").write_text("import vortos_plugtest_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def context(setting: str = "lease_driver", name: str = "x", **options: str) -> PluginContext:
    return PluginContext(
        setting=setting,
        name=name,
        clock=ManualClock(T0),
        db=Path("vortos.db"),
        node_id="node-a",
        options=options,
    )


def refused(port_setting: str, value: str) -> str:
    with pytest.raises(PluginError) as caught:
        find(PORT_BY_SETTING[port_setting], value)
    return str(caught.value)


# --- names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "name", "target"),
    [
        ("lease_driver", "row", "engine.plugins.builtins:row_driver"),
        ("lease_driver", "advisory", "engine.plugins.builtins:advisory_driver"),
        ("lease_driver", "redis", "engine.plugins.builtins:redis_driver"),
        ("policy", "rbac", "engine.plugins.builtins:role_based_policy"),
        ("identity_provider", "operators", "engine.plugins.builtins:stored_identities"),
    ],
)
def test_a_builtin_name_is_found_and_imported(setting: str, name: str, target: str) -> None:
    plugin = find(PORT_BY_SETTING[setting], name)

    assert (plugin.name, plugin.source, plugin.target) == (name, "built-in", target)
    assert callable(plugin.factory)
    assert plugin.describe() == f"{name} (built-in: {target})"


def test_a_name_is_found_with_spaces_around_it() -> None:
    assert find(LEASE, "  row ").name == "row"


@pytest.mark.parametrize(
    ("port", "name", "target"),
    [
        (LEASE, "filelock", "vortos_example_plugins.file_lease:FileLockLease.from_context"),
        (SINKS, "jsonl", "vortos_example_plugins.jsonl_sink:JsonlAuditSink.from_context"),
    ],
)
def test_an_installed_entry_point_is_found_by_its_name(port: Any, name: str, target: str) -> None:
    plugin = find(port, name)

    assert plugin.source.startswith(EXAMPLES), plugin.source
    assert plugin.target == target
    assert callable(plugin.factory)


def test_the_names_available_are_the_builtins_then_the_installed_entry_points() -> None:
    lease_names = available(LEASE)

    assert lease_names[:3] == ["row", "advisory", "redis"]
    assert "filelock" in lease_names[3:]
    assert "jsonl" in available(SINKS)


def test_a_misspelt_name_is_refused_naming_what_is_known() -> None:
    message = refused("lease_driver", "filelok")

    assert message.startswith("lease_driver = 'filelok': no lease driver of that name")
    assert "known: row, advisory, redis, filelock" in message
    assert "vortos.lease_drivers" in message
    assert "dotted path" in message


def test_a_misspelt_name_of_a_port_with_nothing_built_in_names_what_is_installed() -> None:
    message = refused("audit_sinks", "jsnol")

    assert "audit_sinks = 'jsnol': no audit sink of that name (known: jsonl;" in message


def test_an_empty_name_is_refused() -> None:
    assert "lease_driver is empty" in refused("lease_driver", "  ")


def test_is_dotted_path_tells_a_path_from_a_name() -> None:
    assert is_dotted_path("pkg.mod:Attr")
    assert is_dotted_path("pkg.mod.Attr")
    assert is_dotted_path("mod:Attr")
    assert not is_dotted_path("filelock")


# --- dotted paths ------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["{pkg}.leases:Lease", "{pkg}.leases.Lease"])
def test_a_dotted_path_in_either_form_finds_the_factory(package: str, form: str) -> None:
    value = form.format(pkg=package)

    plugin = find(LEASE, value)

    assert (plugin.name, plugin.source) == (value, "dotted path")
    assert plugin.target == f"{package}.leases:Lease"
    assert plugin.describe() == f"{value} (dotted path: {package}.leases:Lease)"


def test_a_dotted_path_may_name_an_attribute_of_an_attribute(package: str) -> None:
    plugin = find(LEASE, f"{package}.leases:Factories.lease")

    built = plugin.build(context())

    assert type(built).__name__ == "Lease"


def test_the_factory_is_given_the_context(package: str) -> None:
    given = context(name="locks", directory="/var/lib/locks")

    built = find(LEASE, f"{package}.leases:Lease").build(given)

    assert vars(built)["context"] is given
    assert given.options == {"directory": "/var/lib/locks"}


def test_a_path_to_a_missing_module_is_refused(package: str) -> None:
    message = refused("lease_driver", "vortos_plugtest_nowhere.leases:Lease")

    assert message == (
        "lease_driver = 'vortos_plugtest_nowhere.leases:Lease': cannot import "
        "vortos_plugtest_nowhere.leases (no module named 'vortos_plugtest_nowhere'); install "
        "the package that provides it or fix the path"
    )


def test_a_path_to_a_missing_module_in_an_existing_package_is_refused(package: str) -> None:
    message = refused("lease_driver", f"{package}.nowhere:Lease")

    assert f"cannot import {package}.nowhere (no module named '{package}.nowhere')" in message


def test_a_path_to_a_missing_attribute_is_refused(package: str) -> None:
    message = refused("lease_driver", f"{package}.leases:Leese")

    assert message == (
        f"lease_driver = '{package}.leases:Leese': {package}.leases has no 'Leese'; fix the path"
    )


def test_a_module_that_raises_on_import_is_refused_with_its_error(package: str) -> None:
    message = refused("audit_sinks", f"{package}.explodes:Sink")

    assert message == (
        f"audit_sinks = '{package}.explodes:Sink': importing {package}.explodes failed: "
        "RuntimeError: exploded on import"
    )


def test_a_module_missing_a_dependency_is_refused_naming_the_dependency(package: str) -> None:
    message = refused("audit_sinks", f"{package}.needs:Sink")

    assert "ModuleNotFoundError: No module named 'vortos_plugtest_absent_dependency'" in message
    assert "a dependency of the plug-in is missing" in message


def test_a_path_without_an_attribute_is_refused(package: str) -> None:
    assert "is not a dotted path: use module:attribute" in refused("lease_driver", f"{package}:")


def test_a_target_that_is_not_callable_is_refused(package: str) -> None:
    message = refused("lease_driver", f"{package}.leases:NOT_A_FACTORY")

    assert f"{package}.leases:NOT_A_FACTORY is a" in message
    assert "int, not a factory; name a class or a function that takes a PluginContext" in message


# --- building ----------------------------------------------------------------------------


def test_a_built_object_missing_methods_is_refused_naming_them(package: str) -> None:
    plugin = find(LEASE, f"{package}.leases:HalfALease")

    with pytest.raises(PluginError) as caught:
        plugin.build(context())

    message = str(caught.value)
    assert "returned a HalfALease, which is not a lease driver" in message
    assert "(it has no renew, current)" in message


def test_a_factory_that_raises_is_a_plugin_error_naming_the_setting(package: str) -> None:
    plugin = find(LEASE, f"{package}.leases:raises")

    with pytest.raises(PluginError) as caught:
        plugin.build(context())

    assert str(caught.value) == (
        f"lease_driver = '{package}.leases:raises': the lease driver {package}.leases:raises "
        "failed to start: ValueError: cannot reach the lock server"
    )
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_factory_refusing_its_input_is_named_by_its_setting(package: str) -> None:
    plugin = find(LEASE, f"{package}.leases:refuses")

    with pytest.raises(PluginError) as caught:
        plugin.build(context())

    assert str(caught.value) == (
        f"lease_driver = '{package}.leases:refuses': [plugin.locks] needs a directory"
    )


def test_a_plugin_error_from_the_factory_is_passed_on_as_it_is(package: str) -> None:
    plugin = find(LEASE, f"{package}.leases:knows_better")

    with pytest.raises(PluginError, match=r"^lease_driver = 'locks': its own words$"):
        plugin.build(context())


def test_a_plugin_error_is_invalid_input() -> None:
    # So the CLI gives it exit code 2, as any other bad setting.
    assert issubclass(PluginError, InvalidInput)


# --- selecting every plug-in the settings name -------------------------------------------


def settings(**values: object) -> Settings:
    """The default settings with `values` in place, as flags give them: taken as they are."""
    return load_settings(flags=values, config=None, env={})


def test_the_default_settings_select_the_builtins() -> None:
    selection = select_plugins(load_settings(env={}, config=None))

    assert selection.plugged() == []
    assert selection.enqueuer is None
    rows = dict(selection.rows())
    assert rows["lease driver"].startswith("row (built-in")
    assert rows["audit sinks"] == "none"
    assert rows["enqueuer"] == "none: consumers run commands here"


def test_a_selection_lists_the_plugins_it_plugs_in(package: str) -> None:
    selection = select_plugins(
        settings(lease_driver="filelock", audit_sinks=("jsonl", f"{package}.leases:Lease"))
    )

    assert [p.name for p in selection.plugged()] == [
        "filelock",
        "jsonl",
        f"{package}.leases:Lease",
    ]
    assert all(isinstance(p, Plugin) for p in selection.audit_sinks)
    sinks = [served for port, served in selection.rows() if port == "audit sinks"]
    assert len(sinks) == 2
    assert sinks[0].startswith(f"jsonl ({EXAMPLES}")


def test_every_problem_is_reported_at_once(package: str) -> None:
    with pytest.raises(PluginError) as caught:
        select_plugins(
            settings(
                lease_driver="filelok",
                enqueuer=f"{package}.explodes:Broker",
                audit_sinks=("jsonl", "jsnol", f"{package}.leases:Nope"),
                metrics=(f"{package}.needs:Backend",),
            )
        )

    message = str(caught.value)
    expected = [
        "lease_driver = 'filelok': no lease driver of that name",
        f"enqueuer = '{package}.explodes:Broker': importing {package}.explodes failed: "
        "RuntimeError: exploded on import",
        "audit_sinks = 'jsnol': no audit sink of that name",
        f"audit_sinks = '{package}.leases:Nope': {package}.leases has no 'Nope'",
        f"metrics = '{package}.needs:Backend': importing {package}.needs failed: "
        "ModuleNotFoundError",
    ]
    at = [message.find(problem) for problem in expected]
    assert -1 not in at, message
    assert at == sorted(at), message
    assert "'jsonl'" not in message


def test_a_port_that_must_have_an_implementation_cannot_be_unset() -> None:
    with pytest.raises(PluginError, match="must each name an implementation"):
        select_plugins(settings(policy=None))


# --- the settings that name plug-ins ------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    config = tmp_path / "vortos.toml"
    config.write_text(textwrap.dedent(text))
    return config


def test_audit_sinks_are_a_toml_list(tmp_path: Path) -> None:
    config = write(tmp_path, 'audit_sinks = ["jsonl", "mypkg.sinks:Siem"]\n')

    loaded = load_settings(config=config, env={})

    assert loaded.audit_sinks == ("jsonl", "mypkg.sinks:Siem")
    assert loaded.source("audit_sinks") == str(config)


def test_audit_sinks_from_the_environment_are_separated_by_commas() -> None:
    loaded = load_settings(config=None, env={"VORTOS_AUDIT_SINKS": "jsonl, mypkg.sinks:Siem,"})

    assert loaded.audit_sinks == ("jsonl", "mypkg.sinks:Siem")
    assert loaded.source("audit_sinks") == "VORTOS_AUDIT_SINKS"


def test_the_environment_overrides_the_file_for_a_list(tmp_path: Path) -> None:
    config = write(tmp_path, 'metrics = ["statsd"]\n')

    loaded = load_settings(config=config, env={"VORTOS_METRICS": "otlp"})

    assert loaded.metrics == ("otlp",)


def test_list_settings_default_to_empty() -> None:
    loaded = load_settings(config=None, env={})

    assert (loaded.audit_sinks, loaded.metrics, loaded.doctor_checks) == ((), (), ())
    assert loaded.plugin_timeout == 5_000


def test_a_plugin_named_twice_in_the_environment_is_refused() -> None:
    with pytest.raises(InvalidInput) as caught:
        load_settings(config=None, env={"VORTOS_AUDIT_SINKS": "jsonl,jsonl"})

    assert str(caught.value) == (
        "VORTOS_AUDIT_SINKS='jsonl,jsonl' is refused: audit_sinks must be a list of plug-in "
        "names without repeats"
    )


def test_a_plugin_named_twice_in_the_file_is_refused(tmp_path: Path) -> None:
    config = write(tmp_path, 'doctor_checks = ["backup", "backup"]\n')

    with pytest.raises(InvalidInput) as caught:
        load_settings(config=config, env={})

    assert str(config) in str(caught.value)
    assert "doctor_checks must be a list of plug-in names without repeats" in str(caught.value)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"VORTOS_LEASE_DRIVER": "file lock"}, "lease_driver must be a plug-in name"),
        ({"VORTOS_AUDIT_SINKS": "jsonl,my sink"}, "audit_sinks must be a plug-in name"),
    ],
)
def test_a_plugin_name_with_spaces_is_refused(env: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        load_settings(config=None, env=env)


def test_an_empty_variable_leaves_the_default() -> None:
    assert load_settings(config=None, env={"VORTOS_POLICY": ""}).policy == "rbac"


def test_a_list_setting_that_is_not_a_list_is_refused(tmp_path: Path) -> None:
    config = write(tmp_path, "audit_sinks = 5\n")

    with pytest.raises(InvalidInput, match="audit_sinks must be a list of plug-in names"):
        load_settings(config=config, env={})


def test_plugin_timeout_is_a_duration(tmp_path: Path) -> None:
    assert load_settings(config=None, env={"VORTOS_PLUGIN_TIMEOUT": "1s"}).plugin_timeout == 1000
    with pytest.raises(InvalidInput, match="plugin_timeout must be a duration"):
        load_settings(config=None, env={"VORTOS_PLUGIN_TIMEOUT": "0"})


def test_plugin_tables_reach_the_settings(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        """
        lease_driver = "filelock"
        audit_sinks = ["mypkg.sinks:Siem"]

        [plugin.filelock]
        directory = "/var/lib/vortos/leases"

        [plugin."mypkg.sinks:Siem"]
        url = "https://siem.example.com"
        batch = 100
        """,
    )

    loaded = load_settings(config=config, env={})

    assert loaded.plugin_options("filelock") == {"directory": "/var/lib/vortos/leases"}
    assert loaded.plugin_options("mypkg.sinks:Siem") == {
        "url": "https://siem.example.com",
        "batch": 100,
    }
    assert loaded.plugin_options("jsonl") == {}


@pytest.mark.parametrize("header", ["[plugin.filelock]", "[vortos.plugin.filelock]"])
def test_plugin_tables_reach_the_settings_beside_a_vortos_table(
    tmp_path: Path, header: str
) -> None:
    config = write(
        tmp_path,
        f"""
        [vortos]
        lease_driver = "filelock"

        {header}
        directory = "/var/lib/vortos/leases"
        """,
    )

    loaded = load_settings(config=config, env={})

    assert loaded.lease_driver == "filelock"
    assert loaded.plugin_options("filelock") == {"directory": "/var/lib/vortos/leases"}


def test_plugin_tables_both_inside_and_beside_a_vortos_table_are_refused(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        """
        [vortos.plugin.filelock]
        directory = "/a"

        [plugin.jsonl]
        path = "/b"
        """,
    )

    with pytest.raises(InvalidInput, match="keep one"):
        load_settings(config=config, env={})


@pytest.mark.parametrize(
    "text",
    [
        'plugin = "filelock"\n',
        "[plugin]\ndirectory = '/var/lib/vortos/leases'\n",
        "plugin = [1, 2]\n",
    ],
)
def test_a_plugin_section_that_is_not_a_table_of_tables_is_refused(
    tmp_path: Path, text: str
) -> None:
    config = write(tmp_path, text)

    with pytest.raises(InvalidInput, match=r"\[plugin\] must hold one table per plug-in"):
        load_settings(config=config, env={})


def test_a_bad_plugin_section_is_reported_with_the_other_problems(tmp_path: Path) -> None:
    config = write(tmp_path, 'plugin = "filelock"\naudit_sinks = ["a", "a"]\n')

    with pytest.raises(InvalidInput) as caught:
        load_settings(config=config, env={})

    assert "[plugin] must hold one table" in str(caught.value)
    assert "without repeats" in str(caught.value)

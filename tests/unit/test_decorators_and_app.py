"""@schedulable and @scheduled, and loading an app's modules with load_app.

App modules are written to a temporary directory that is the current directory for the test
(load_app imports from there, as `vortos run --app` does); they are removed from sys.modules
afterwards so each test imports its own.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.commands.app import load_app
from engine.commands.context import FireContext
from engine.commands.decorators import (
    SOURCE_KEY,
    StaticSchedule,
    command_of,
    schedulable,
    scheduled,
    schedules_of,
)
from engine.commands.registry import Command, CommandRegistry
from engine.domain.errors import InvalidInput
from engine.domain.retry import RetryPolicy
from engine.domain.schedule import MisfireKind, OverlapPolicy
from engine.domain.triggers import CronTrigger, IntervalTrigger

APP_PREFIX = "vortos_test_app_"


def _command(fn: Any) -> Command:
    command = command_of(fn)
    assert command is not None, f"{fn!r} is not marked as a command"
    return command


def _fresh_job() -> Any:
    """A new function each call: the decorators attach what they declare to the function."""

    def job() -> None:
        pass

    return job


def _only_schedule(fn: Any) -> StaticSchedule:
    declared = schedules_of(fn)
    assert len(declared) == 1
    return declared[0]


# --- @schedulable ----------------------------------------------------------------------------


def test_a_bare_schedulable_names_the_command_after_the_function_with_dashes() -> None:
    @schedulable
    def send_weekly_invoices() -> None:
        pass

    assert _command(send_weekly_invoices).name == "send-weekly-invoices"


def test_schedulable_with_empty_parentheses_uses_the_default_name() -> None:
    @schedulable()
    def rotate_logs() -> None:
        pass

    assert _command(rotate_logs).name == "rotate-logs"


def test_schedulable_with_a_name_uses_that_name() -> None:
    @schedulable("billing.send-invoices")
    def send_invoices() -> None:
        pass

    assert _command(send_invoices).name == "billing.send-invoices"


def test_the_command_knows_its_parameters_and_where_it_is_defined() -> None:
    @schedulable("greet")
    def greet(who: str, loud: bool = False, *, fire: FireContext) -> str:
        del fire
        return who.upper() if loud else who

    command = _command(greet)
    assert [f.name for f in command.schema.fields] == ["who", "loud"]
    assert command.schema.context_parameter == "fire"
    assert command.source == f"{__name__}.{greet.__qualname__}"


def test_the_description_is_the_first_line_of_the_docstring() -> None:
    @schedulable
    def documented() -> None:
        """Sends the report.

        At length.
        """

    assert _command(documented).description == "Sends the report."


def test_an_explicit_description_wins_over_the_docstring() -> None:
    @schedulable("documented", description="what operators read")
    def documented() -> None:
        """Ignored."""

    assert _command(documented).description == "what operators read"


@pytest.mark.parametrize("name", ["Send Invoices", "UPPER", "-leading-dash", "a/b", "x" * 201])
def test_an_invalid_command_name_is_refused_at_decoration(name: str) -> None:
    def job() -> None:
        pass

    with pytest.raises(InvalidInput, match="command name"):
        schedulable(name)(job)


def test_leading_underscores_are_dropped_from_a_default_name() -> None:
    def _private_job() -> None:
        pass

    command = command_of(schedulable(_private_job))
    assert command is not None
    assert command.name == "private-job"


def test_a_function_whose_default_name_is_invalid_is_refused_naming_it() -> None:
    def job() -> None:
        pass

    job.__name__ = "job$"
    with pytest.raises(InvalidInput, match=r"command name 'job\$' is not allowed"):
        schedulable(job)


def test_a_parameter_a_payload_cannot_carry_is_refused_at_decoration() -> None:
    def job(points: set[int]) -> None:
        del points

    with pytest.raises(InvalidInput, match="parameter 'points'"):
        schedulable(job)


def test_a_schedulable_function_remains_directly_callable() -> None:
    @schedulable("double")
    def double(n: int) -> int:
        return 2 * n

    assert double(21) == 42
    assert double.__name__ == "double"


def test_a_function_that_is_not_marked_has_no_command() -> None:
    def plain() -> None:
        pass

    assert command_of(plain) is None
    assert schedules_of(plain) == []


# --- @scheduled ------------------------------------------------------------------------------


def test_a_cron_schedule_declares_its_trigger_zone_and_payload() -> None:
    @scheduled(cron="0 3 * * *", timezone="Europe/Berlin", payload={"region": "eu"})
    @schedulable("billing.send-invoices")
    def send_invoices(region: str, dry_run: bool = False) -> None:
        del region, dry_run

    declared = _only_schedule(send_invoices)
    spec = declared.spec
    assert spec.trigger == CronTrigger("0 3 * * *")
    assert spec.timezone == "Europe/Berlin"
    assert spec.payload == {"region": "eu"}
    assert spec.command == "billing.send-invoices"
    assert spec.name == "billing.send-invoices"
    assert spec.tenant == "default"


def test_an_every_schedule_has_an_interval_trigger_aligned_to_the_epoch() -> None:
    @scheduled(every="5m")
    @schedulable
    def poll() -> None:
        pass

    assert _only_schedule(poll).spec.trigger == IntervalTrigger(300_000, 0)


def test_every_as_a_bare_number_is_seconds() -> None:
    @scheduled(every=90)
    @schedulable
    def poll() -> None:
        pass

    assert _only_schedule(poll).spec.trigger == IntervalTrigger(90_000, 0)


def test_a_cron_with_seconds_is_accepted() -> None:
    @scheduled(cron="*/10 * * * * *")
    @schedulable
    def tick() -> None:
        pass

    assert _only_schedule(tick).spec.trigger == CronTrigger("*/10 * * * * *")


def test_the_schedule_records_where_it_is_declared() -> None:
    @scheduled(every="1m", metadata={"team": "ops"})
    @schedulable("located")
    def located() -> None:
        pass

    declared = _only_schedule(located)
    assert declared.source == _command(located).source
    assert declared.spec.metadata == {"team": "ops", SOURCE_KEY: declared.source}


def test_the_policies_given_to_scheduled_are_in_the_spec() -> None:
    @scheduled(
        every="1h",
        name="nightly",
        tenant="acme",
        misfire="each",
        overlap="cancel-other",
        jitter="30s",
        max_attempts=5,
        retry_backoff="10s",
    )
    @schedulable
    def job() -> None:
        pass

    spec = _only_schedule(job).spec
    assert spec.name == "nightly"
    assert spec.tenant == "acme"
    assert spec.misfire.kind is MisfireKind.EACH
    assert spec.overlap is OverlapPolicy.CANCEL_OTHER
    assert spec.jitter_ms == 30_000
    assert spec.retry == RetryPolicy(
        max_attempts=5, backoff_ms=10_000, backoff_cap_ms=RetryPolicy().backoff_cap_ms
    )


def test_scheduled_without_options_uses_the_default_policies() -> None:
    @scheduled(every="1h")
    @schedulable
    def job() -> None:
        pass

    spec = _only_schedule(job).spec
    assert spec.misfire.kind is MisfireKind.LATEST
    assert spec.overlap is OverlapPolicy.SKIP
    assert spec.jitter_ms == 0
    assert spec.retry == RetryPolicy()


def test_scheduled_alone_marks_the_function_as_a_command_with_its_default_name() -> None:
    @scheduled(every="1m")
    def clean_cache() -> None:
        pass

    assert _command(clean_cache).name == "clean-cache"
    assert _only_schedule(clean_cache).spec.command == "clean-cache"


def test_optional_fields_left_out_of_the_payload_stay_out_of_the_spec() -> None:
    @scheduled(every="1m", payload={"n": 2})
    @schedulable
    def job(n: int, label: str = "x") -> None:
        del n, label

    assert _only_schedule(job).spec.payload == {"n": 2}


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({}, r"missing required field\(s\) n"),
        ({"n": 1, "m": 2}, r"unknown field\(s\) m"),
        ({"n": "1"}, "field 'n' of command 'job' must be an integer"),
    ],
)
def test_a_payload_that_does_not_fit_the_command_is_refused_at_decoration(
    payload: dict[str, Any], expected: str
) -> None:
    def job(n: int) -> None:
        del n

    with pytest.raises(InvalidInput, match=expected):
        scheduled(every="1m", payload=payload)(schedulable(job))


def test_both_cron_and_every_are_refused() -> None:
    with pytest.raises(InvalidInput, match=r"exactly one of cron=\.\.\. or every=\.\.\."):
        scheduled(cron="* * * * *", every="1m")


def test_neither_cron_nor_every_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"exactly one of cron=\.\.\. or every=\.\.\."):
        scheduled()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"every": "soon"}, "every 'soon' is not a duration"),
        ({"every": "500ms"}, "at least 1s"),
        ({"every": "1m", "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"every": "1m", "max_attempts": 0}, "max attempts 0 is out of range"),
        ({"every": "1m", "jitter": "often"}, "jitter 'often' is not a duration"),
    ],
)
def test_an_invalid_option_of_scheduled_is_refused_with_invalid_input(
    options: dict[str, Any], expected: str
) -> None:
    with pytest.raises(InvalidInput, match=expected):
        scheduled(**options)(_fresh_job())


def test_two_static_schedules_of_the_same_name_on_one_command_are_refused() -> None:
    def job() -> None:
        pass

    first = scheduled(every="1m")(schedulable(job))
    with pytest.raises(InvalidInput, match="declares two static schedules named 'job': pass name"):
        scheduled(cron="0 * * * *")(first)


def test_two_static_schedules_of_one_command_with_different_names_are_kept() -> None:
    @scheduled(every="1m", name="job-often")
    @scheduled(cron="0 * * * *", name="job-hourly")
    @schedulable
    def job() -> None:
        pass

    assert [s.spec.name for s in schedules_of(job)] == ["job-hourly", "job-often"]


def test_a_scheduled_function_remains_directly_callable() -> None:
    @scheduled(every="1m", payload={"n": 1})
    @schedulable
    def add_one(n: int) -> int:
        return n + 1

    assert add_one(41) == 42


def test_an_unknown_misfire_policy_is_refused_with_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="misfire"):
        scheduled(every="1m", misfire="sometimes")(_fresh_job())


def test_an_unknown_overlap_policy_is_refused_with_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="overlap"):
        scheduled(every="1m", overlap="queue")(_fresh_job())


def test_a_retry_backoff_longer_than_the_default_cap_is_accepted() -> None:
    @scheduled(every="1h", retry_backoff="10m")
    @schedulable
    def slow_retries() -> None:
        pass

    assert _only_schedule(slow_retries).spec.retry.backoff_ms == 600_000


def test_schedulable_above_scheduled_keeps_the_schedule_on_the_named_command() -> None:
    def job() -> None:
        pass

    try:
        marked = schedulable("renamed")(scheduled(every="1m")(job))
    except InvalidInput:
        return  # refusing the order is fine too
    assert _only_schedule(marked).spec.command == _command(marked).name


@pytest.mark.parametrize(
    "options",
    [
        {"name": "Nightly Report"},
        {"tenant": "Acme Corp"},
        {"jitter": "2h"},
        {"metadata": {"not a key!": "x"}},
    ],
    ids=["name", "tenant", "jitter", "metadata"],
)
def test_an_invalid_schedule_option_is_refused_at_decoration(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        scheduled(every="1m", **options)(_fresh_job())


# --- load_app --------------------------------------------------------------------------------


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The current directory, where app modules are written; sys.path and sys.modules are put
    back afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith(APP_PREFIX)]:
        del sys.modules[name]


def _write(directory: Path, module: str, source: str) -> Path:
    path = directory / f"{module}.py"
    path.write_text(textwrap.dedent(source).lstrip())
    importlib.invalidate_caches()
    return path


JOBS = """
    from engine import FireContext, schedulable, scheduled

    @scheduled(cron="0 3 * * *", timezone="Europe/Berlin", payload={"region": "eu"})
    @schedulable("billing.send-invoices")
    def send_invoices(region: str, *, fire: FireContext) -> None:
        pass

    @schedulable
    def rebuild_index() -> None:
        pass

    @scheduled(every="5m", name="cache-sweep")
    def sweep_cache() -> None:
        pass

    def helper() -> None:
        pass
"""


def test_an_app_module_registers_its_commands_and_collects_its_static_schedules(
    app_dir: Path,
) -> None:
    _write(app_dir, f"{APP_PREFIX}jobs", JOBS)
    app = load_app(f"{APP_PREFIX}jobs")
    assert app.modules == [f"{APP_PREFIX}jobs"]
    assert sorted(c.name for c in app.commands) == [
        "billing.send-invoices",
        "rebuild-index",
        "sweep-cache",
    ]
    assert sorted((s.spec.name, s.spec.command) for s in app.static) == [
        ("billing.send-invoices", "billing.send-invoices"),
        ("cache-sweep", "sweep-cache"),
    ]
    invoices = next(s for s in app.static if s.spec.name == "billing.send-invoices")
    assert invoices.spec.trigger == CronTrigger("0 3 * * *")
    assert invoices.spec.timezone == "Europe/Berlin"
    assert invoices.spec.payload == {"region": "eu"}
    assert invoices.source == f"{APP_PREFIX}jobs.send_invoices"


def test_the_loaded_commands_register_into_a_registry(app_dir: Path) -> None:
    _write(app_dir, f"{APP_PREFIX}jobs", JOBS)
    registry = load_app(f"{APP_PREFIX}jobs").register_into(CommandRegistry())
    assert registry.names() == ["billing.send-invoices", "rebuild-index", "sweep-cache"]
    assert registry.validate("billing.send-invoices", {"region": "us"}) == {"region": "us"}


def test_a_missing_module_is_refused_naming_it_and_saying_how_to_fix_it(app_dir: Path) -> None:
    with pytest.raises(InvalidInput) as refused:
        load_app(f"{APP_PREFIX}nowhere")
    message = str(refused.value)
    assert f"cannot import app module '{APP_PREFIX}nowhere'" in message
    assert "check --app / VORTOS_APP" in message
    assert "run from the directory that holds it (or set PYTHONPATH)" in message


def test_a_missing_dependency_of_an_app_module_is_named_as_such(app_dir: Path) -> None:
    _write(app_dir, f"{APP_PREFIX}needy", "import vortos_test_dependency_not_installed\n")
    with pytest.raises(InvalidInput) as refused:
        load_app(f"{APP_PREFIX}needy")
    message = str(refused.value)
    assert f"importing app module '{APP_PREFIX}needy' failed" in message
    assert "vortos_test_dependency_not_installed" in message


def test_a_module_raising_at_import_is_refused_with_the_exception_and_its_place(
    app_dir: Path,
) -> None:
    path = _write(
        app_dir,
        f"{APP_PREFIX}broken",
        """
        SETTINGS = {}

        TIMEOUT = SETTINGS["timeout"]
        """,
    )
    with pytest.raises(InvalidInput) as refused:
        load_app(f"{APP_PREFIX}broken")
    message = str(refused.value)
    assert f"importing app module '{APP_PREFIX}broken' raised KeyError: 'timeout'" in message
    assert f"({path.resolve()}:3)" in message


def test_a_module_with_a_syntax_error_is_refused_naming_the_file_and_line(app_dir: Path) -> None:
    _write(app_dir, f"{APP_PREFIX}typo", "def job(:\n    pass\n")
    with pytest.raises(InvalidInput) as refused:
        load_app(f"{APP_PREFIX}typo")
    message = str(refused.value)
    assert "has a syntax error" in message
    assert f"{APP_PREFIX}typo.py:1" in message


def test_a_bad_declaration_in_a_module_is_refused_naming_the_module(app_dir: Path) -> None:
    _write(
        app_dir,
        f"{APP_PREFIX}badpayload",
        """
        from engine import schedulable, scheduled

        @scheduled(every="1m", payload={"n": "three"})
        @schedulable
        def job(n: int) -> None:
            pass
        """,
    )
    with pytest.raises(InvalidInput) as refused:
        load_app(f"{APP_PREFIX}badpayload")
    message = str(refused.value)
    assert f"app module '{APP_PREFIX}badpayload'" in message
    assert "field 'n' of command 'job' must be an integer" in message


SAME_NAME = """
    from engine import schedulable

    @schedulable("report")
    def {function}() -> None:
        pass
"""


def test_two_modules_declaring_the_same_command_name_differently_are_refused(
    app_dir: Path,
) -> None:
    _write(app_dir, f"{APP_PREFIX}one", SAME_NAME.format(function="daily"))
    _write(app_dir, f"{APP_PREFIX}two", SAME_NAME.format(function="weekly"))
    with pytest.raises(InvalidInput) as refused:
        load_app(f"{APP_PREFIX}one,{APP_PREFIX}two")
    message = str(refused.value)
    assert "command name 'report' is used twice" in message
    assert f"{APP_PREFIX}one.daily" in message
    assert f"{APP_PREFIX}two.weekly" in message
    assert "give one of them another name" in message


def test_a_command_imported_into_a_second_module_is_not_a_duplicate(app_dir: Path) -> None:
    _write(
        app_dir,
        f"{APP_PREFIX}base",
        """
        from engine import schedulable, scheduled

        @scheduled(every="1m")
        @schedulable
        def shared() -> None:
            pass
        """,
    )
    _write(app_dir, f"{APP_PREFIX}reexport", f"from {APP_PREFIX}base import shared\n")
    app = load_app(f"{APP_PREFIX}base,{APP_PREFIX}reexport")
    assert [c.name for c in app.commands] == ["shared"]
    assert [s.spec.name for s in app.static] == ["shared"]


def test_modules_are_separated_by_commas_and_spaces_around_them_are_ignored(
    app_dir: Path,
) -> None:
    _write(app_dir, f"{APP_PREFIX}first", SAME_NAME.format(function="first"))
    _write(
        app_dir,
        f"{APP_PREFIX}second",
        """
        from engine import scheduled

        @scheduled(every="1m")
        def second() -> None:
            pass
        """,
    )
    app = load_app(f" {APP_PREFIX}first , {APP_PREFIX}second ,")
    assert app.modules == [f"{APP_PREFIX}first", f"{APP_PREFIX}second"]
    assert sorted(c.name for c in app.commands) == ["report", "second"]
    assert [s.spec.name for s in app.static] == ["second"]


def test_static_schedules_of_the_same_name_in_two_modules_are_refused(app_dir: Path) -> None:
    for function in ("alpha", "beta"):
        _write(
            app_dir,
            f"{APP_PREFIX}{function}",
            f"""
            from engine import scheduled

            @scheduled(every="1m", name="nightly")
            def {function}() -> None:
                pass
            """,
        )
    with pytest.raises(InvalidInput) as refused:
        load_app(f"{APP_PREFIX}alpha,{APP_PREFIX}beta")
    message = str(refused.value)
    assert "two static schedules are named 'nightly' in tenant 'default'" in message
    assert "pass name=... to @scheduled" in message


def test_static_schedules_of_the_same_name_in_different_tenants_are_kept(app_dir: Path) -> None:
    _write(
        app_dir,
        f"{APP_PREFIX}tenants",
        """
        from engine import scheduled

        @scheduled(every="1m", name="nightly", tenant="acme")
        def for_acme() -> None:
            pass

        @scheduled(every="1m", name="nightly", tenant="globex")
        def for_globex() -> None:
            pass
        """,
    )
    app = load_app(f"{APP_PREFIX}tenants")
    assert sorted(s.spec.tenant for s in app.static) == ["acme", "globex"]


@pytest.mark.parametrize("spec", ["", " ", " , "])
def test_an_empty_app_spec_is_refused(spec: str) -> None:
    with pytest.raises(InvalidInput, match="is empty: name a module"):
        load_app(spec)


def test_the_current_directory_is_importable_without_being_on_the_path(app_dir: Path) -> None:
    sys.path[:] = [p for p in sys.path if p not in ("", ".", str(app_dir))]
    _write(app_dir, f"{APP_PREFIX}here", SAME_NAME.format(function="here"))
    assert [c.name for c in load_app(f"{APP_PREFIX}here").commands] == ["report"]


def test_a_renamed_command_keeps_whether_its_schedule_named_dst_rules() -> None:
    """@schedulable("name") over @scheduled(cron=...) naming no DST rules: a sync must keep
    a stored schedule's rules, as without the rename (the rename dropped the mark)."""
    from engine.commands.decorators import schedules_of  # noqa: PLC0415

    @schedulable("renamed-report")
    @scheduled(cron="0 3 * * *")
    def unnamed_rules() -> None: ...

    @schedulable("renamed-backup")
    @scheduled(cron="0 4 * * *", dst_missing="skip")
    def named_rules() -> None: ...

    (kept,) = schedules_of(unnamed_rules)
    (named,) = schedules_of(named_rules)
    assert kept.spec.command == "renamed-report"
    assert kept.dst_declared is False
    assert named.dst_declared is True

"""The process command's environment and working-directory checks
(engine.commands.process_env): which names a payload may set, the settings that allow them, the
clean base environment, and cwd resolution inside the owner's directories."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from engine.commands.context import CommandFailed, FireContext
from engine.commands.process import ProcessAllowlist, ProcessRunner
from engine.commands.process_env import (
    DEFAULT_CWD,
    SAFE_PATH,
    base_environment,
    check_allowed_name,
    check_env_name,
    child_environment,
    parse_cwd_allow,
    parse_env_allow,
    working_directory,
)
from engine.config import load_settings
from engine.domain.errors import InvalidInput
from engine.domain.run import RunKind

NEVER = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "ld_preload",
    "Ld_Preload",
    "DYLD_INSERT_LIBRARIES",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "MALLOC_CHECK_",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RES_OPTIONS",
    "LOCALDOMAIN",
    "TMPDIR",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "pythonpath",
    "PERL5LIB",
    "PERL5OPT",
    "PERLLIB",
    "PERLIO",
    "RUBYOPT",
    "RUBYLIB",
    "NODE_OPTIONS",
    "NODE_PATH",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "BASH_ENV",
    "ENV",
    "BASH_FUNC_ls",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "IFS",
    "CDPATH",
    "PATH",
    "path",
    "HOME",
    "GIT_SSH_COMMAND",
    "GIT_CONFIG_PARAMETERS",
    "XDG_CONFIG_HOME",
    "OPENSSL_CONF",
    "LESSOPEN",
    "EDITOR",
    "SHELL",
    "VORTOS_AUDIT_KEY",
    "VORTOS_DB",
]
MALFORMED = [
    "",
    "1ST",
    "A-B",
    "A B",
    "A=B",
    "A.B",
    "Ä",
    "A\x00B",
    "A\nB",
    "X" * 129,
    "BASH_FUNC_f%%",
]


def _context() -> FireContext:
    return FireContext(
        run_id=1,
        tenant="default",
        schedule_id="s",
        schedule_name="s",
        slot_key="s@1",
        slot_at=0,
        kind=RunKind.SCHEDULED,
        attempt=1,
    )


# --- names a payload may set -------------------------------------------------------------------


@pytest.mark.parametrize("name", NEVER)
def test_a_loader_interpreter_or_shell_variable_can_never_be_set(name: str) -> None:
    with pytest.raises(InvalidInput, match=f"process env name {name!r} can never be set") as no:
        check_allowed_name(name, frozenset(NEVER))  # even when the owner's list names it
    assert "remove it from the payload" in str(no.value)


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_variable_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match="is not allowed: a name is letters, digits and '_'"):
        check_env_name(name)


@pytest.mark.parametrize("name", ["BACKUP_TARGET", "LC_ALL", "TZ", "LANG", "AWS_REGION"])
def test_an_ordinary_name_the_owner_allows_may_be_set(name: str) -> None:
    check_allowed_name(name, frozenset({name}))


def test_a_name_not_on_the_owners_list_is_refused_saying_how_to_allow_it() -> None:
    with pytest.raises(InvalidInput) as no:
        check_allowed_name("BACKUP_TARGET", frozenset())
    message = str(no.value)
    assert "'BACKUP_TARGET' is not on the service's process_env_allow list (which is empty)" in (
        message
    )
    assert "VORTOS_PROCESS_ENV_ALLOW" in message


def test_the_owners_list_matches_names_exactly_not_ignoring_case() -> None:
    with pytest.raises(InvalidInput, match="allowed: BACKUP_TARGET"):
        check_allowed_name("backup_target", frozenset({"BACKUP_TARGET"}))


# --- the settings ------------------------------------------------------------------------------


def test_process_env_allow_reads_names_separated_by_commas_or_a_list() -> None:
    assert parse_env_allow(" A , B,,A ") == ("A", "B")
    assert parse_env_allow(["A", "B"]) == ("A", "B")
    assert parse_env_allow("") == ()
    with pytest.raises(TypeError):
        parse_env_allow(["A", 1])


@pytest.mark.parametrize("name", ["LD_PRELOAD", "pythonpath", "PATH", "BASH_ENV", "VORTOS_DB"])
def test_process_env_allow_refuses_at_start_a_name_that_can_never_be_allowed(name: str) -> None:
    with pytest.raises(InvalidInput) as no:
        load_settings(env={"VORTOS_PROCESS_ENV_ALLOW": f"BACKUP_TARGET,{name}"})
    assert f"{name!r} can never be allowed" in str(no.value)
    assert str(no.value).startswith("VORTOS_PROCESS_ENV_ALLOW=")
    assert no.value.exit_code == 2


def test_process_env_allow_refuses_at_start_a_malformed_name() -> None:
    with pytest.raises(InvalidInput, match="'A-B' is not a name"):
        load_settings(env={"VORTOS_PROCESS_ENV_ALLOW": "A-B"})


def test_the_settings_come_from_the_file_as_lists(tmp_path: Path) -> None:
    path = tmp_path / "vortos.toml"
    path.write_text(
        'process_env_allow = ["BACKUP_TARGET"]\nprocess_cwd_allow = ["/srv/jobs/", "/srv/x"]\n'
    )
    settings = load_settings(config=path, env={})
    assert settings.process_env_allow == ("BACKUP_TARGET",)
    assert settings.process_cwd_allow == ("/srv/jobs", "/srv/x")
    assert settings.source("process_env_allow") == str(path)


def test_the_settings_are_empty_by_default() -> None:
    settings = load_settings(env={})
    assert (settings.process_env_allow, settings.process_cwd_allow) == ((), ())


def test_process_cwd_allow_refuses_a_relative_directory() -> None:
    with pytest.raises(ValueError, match="'jobs' is not an absolute path"):
        parse_cwd_allow("/srv:jobs")
    assert parse_cwd_allow(f"/srv/a/..{os.pathsep}/srv/b") == ("/srv", "/srv/b")


def test_a_library_allowlist_refuses_a_name_that_can_never_be_allowed() -> None:
    with pytest.raises(InvalidInput, match="'LD_PRELOAD' can never be set"):
        ProcessAllowlist.of(["/bin/echo"], env=["LD_PRELOAD"])


def test_the_environment_variables_reach_a_library_allowlist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VORTOS_PROCESS_ENV_ALLOW", "BACKUP_TARGET")
    monkeypatch.setenv("VORTOS_PROCESS_CWD_ALLOW", "/srv/jobs")
    found = ProcessAllowlist.from_env()
    assert (found.env_names, found.cwd_dirs) == (frozenset({"BACKUP_TARGET"}), ("/srv/jobs",))
    monkeypatch.setenv("VORTOS_PROCESS_ENV_ALLOW", "LD_PRELOAD")
    with pytest.raises(InvalidInput, match="VORTOS_PROCESS_ENV_ALLOW='LD_PRELOAD' is refused"):
        ProcessAllowlist.from_env()


# --- the base environment ----------------------------------------------------------------------


def test_the_base_environment_is_path_lang_home_and_tz_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VORTOS_AUDIT_KEY", "k" * 64)
    monkeypatch.setenv("PATH", ".:/home/svc/bin")
    monkeypatch.setenv("LANG", "fr_FR.UTF-8")
    monkeypatch.setenv("TZ", "Europe/Paris")
    monkeypatch.setenv("HOME", "/somewhere/else")
    assert base_environment() == {
        "PATH": SAFE_PATH,
        "LANG": "fr_FR.UTF-8",
        "HOME": pwd.getpwuid(os.geteuid()).pw_dir,
        "TZ": "Europe/Paris",
    }


def test_without_a_lang_the_child_gets_c_utf8_and_without_tz_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LANG", raising=False)
    monkeypatch.delenv("TZ", raising=False)
    assert base_environment()["LANG"] == "C.UTF-8"
    assert "TZ" not in base_environment()


def test_the_childs_environment_checks_each_payload_name_again() -> None:
    assert child_environment({"A": "1"}, frozenset({"A"}))["A"] == "1"
    with pytest.raises(InvalidInput, match="not on the service's process_env_allow"):
        child_environment({"A": "1"}, frozenset())  # the owner's list shrank since


# --- the working directory ---------------------------------------------------------------------


def test_without_a_cwd_the_child_runs_in_the_root_directory() -> None:
    assert working_directory(None, ()) == DEFAULT_CWD == "/"


def test_a_cwd_is_refused_when_the_owner_allows_none(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="process_cwd_allow list is empty, so every process"):
        working_directory(str(tmp_path), ())


def test_a_cwd_inside_an_allowed_directory_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "jobs" / "a").mkdir(parents=True)
    root = str(tmp_path / "jobs")
    assert working_directory(f"{root}/./a/", [root]) == os.path.realpath(f"{root}/a")
    assert working_directory(root, [root]) == os.path.realpath(root)


def test_a_cwd_escaping_by_dot_dot_is_refused(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    root = str(tmp_path / "jobs")
    with pytest.raises(InvalidInput, match="is outside the directories the service allows"):
        working_directory(f"{root}/../", [root])


def test_a_sibling_sharing_the_allowed_directorys_prefix_is_outside_it(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs-evil").mkdir()
    with pytest.raises(InvalidInput, match="outside the directories"):
        working_directory(str(tmp_path / "jobs-evil"), [str(tmp_path / "jobs")])


def test_a_symlink_out_of_the_allowed_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "out").symlink_to("/etc")
    with pytest.raises(InvalidInput, match="it resolves to '/etc'"):
        working_directory(str(tmp_path / "jobs" / "out"), [str(tmp_path / "jobs")])


def test_a_symlink_swapped_after_a_check_is_seen_at_the_next(tmp_path: Path) -> None:
    (tmp_path / "jobs" / "real").mkdir(parents=True)
    link = tmp_path / "jobs" / "work"
    link.symlink_to(tmp_path / "jobs" / "real")
    root = str(tmp_path / "jobs")
    assert working_directory(str(link), [root]) == os.path.realpath(tmp_path / "jobs" / "real")
    link.unlink()
    link.symlink_to("/etc")
    with pytest.raises(InvalidInput, match="outside"):
        working_directory(str(link), [root])


def test_an_allowed_directory_that_is_a_symlink_is_followed(tmp_path: Path) -> None:
    (tmp_path / "data" / "jobs").mkdir(parents=True)
    (tmp_path / "srv").symlink_to(tmp_path / "data")
    allowed = str(tmp_path / "srv" / "jobs")
    assert working_directory(allowed, [allowed]) == os.path.realpath(tmp_path / "data" / "jobs")


def test_a_missing_cwd_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="is not an existing directory: create it first"):
        working_directory(str(tmp_path / "nope"), [str(tmp_path)])


# --- a control socket's client -----------------------------------------------------------------


def test_a_control_clients_check_leaves_the_lists_to_the_server() -> None:
    runner = ProcessRunner(ProcessAllowlist.for_control_client())
    payload = {"argv": ["/usr/bin/anything"], "env": {"OWNERS_CHOICE": "x"}, "cwd": "/srv/x"}
    assert runner.check(payload) == payload


@pytest.mark.parametrize(
    ("payload", "refusal"),
    [
        ({"argv": ["/bin/true"], "env": {"LD_PRELOAD": "/tmp/x.so"}}, "can never be set"),
        ({"argv": ["/bin/true"], "env": {"A-B": "x"}}, "is not allowed"),
        ({"argv": ["/bin/true"], "cwd": "relative"}, "must be an absolute path"),
        ({"argv": ["/bin/true", "a\x00b"]}, "NUL"),
    ],
)
def test_a_control_clients_check_still_refuses_what_no_list_allows(
    payload: dict[str, object], refusal: str
) -> None:
    with pytest.raises(InvalidInput, match=refusal):
        ProcessRunner(ProcessAllowlist.for_control_client()).check(payload)


def test_a_control_clients_process_command_runs_nothing() -> None:
    runner = ProcessRunner(ProcessAllowlist.for_control_client())
    with pytest.raises(CommandFailed, match="runs none"):
        runner(["/bin/true"], fire=_context())

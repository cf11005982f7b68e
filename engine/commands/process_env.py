"""What the `process` command's child gets from the service, and nothing more: a clean
environment, the payload variables the service's owner allows, and a working directory inside
the owner's directories.

The child runs as the service's account, which can read the audit key and write the database.
An operator who writes a payload must not be able to reach that account through it: not by a
variable the loader, an interpreter or a shell acts on (LD_PRELOAD, PYTHONPATH, BASH_ENV, ...),
not by inheriting the service's own secrets (VORTOS_AUDIT_KEY, database URLs with passwords),
and not by a working directory outside what the owner chose.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Mapping
from typing import Any

from engine.domain.errors import InvalidInput

ENV_ALLOW_ENV = "VORTOS_PROCESS_ENV_ALLOW"
CWD_ALLOW_ENV = "VORTOS_PROCESS_CWD_ALLOW"

# A fixed PATH, never the service's (which may hold ~/.local/bin, `.` or a directory an operator
# can write). The allowlisted executables' own directories are not added: they may hold other
# programs the owner never allowed, which `env NAME` or a script's bare `NAME` would then find.
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
DEFAULT_LANG = "C.UTF-8"
# Where a child runs when its payload names no cwd: `/` always exists and holds nothing of the
# service (its own working directory may hold the database or a relative key file).
DEFAULT_CWD = "/"
# What the child creates is the service account's alone: a program that must share a file sets
# its mode itself.
CHILD_UMASK = 0o077

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_MAX_NAME = 128

# Names a payload can never set, whatever the owner allows: each makes a program, an
# interpreter, a shell or the loader run code, load a module or read a file from where the
# payload says, or is the service's own. Compared ignoring case (`ld_preload` too): Unix names are
# case-sensitive, but some programs (npm's npm_config_*, Windows ports) are not, and no owner needs
# a lower-case twin of one of these. A trailing `*` is a prefix. The list cannot name every
# variable of every program: the owner's allowlist (empty by default) is the first line, this
# one the floor it cannot go below.
_LOADER = "the dynamic loader or the C library loads libraries, modules or files from it"
_RESOLVER = "the C library's resolver reads hosts, domains or options from it"
_TEMP = "temporary files would be made where the payload says (another account's directory)"
_INTERPRETER = "an interpreter or runtime loads code or options from it"
_SHELL = "a shell runs code from it, or splits or looks up words by it"
_LOOKUP = "programs and their configuration files would be found where the payload says"
_RUNS = "a program runs the command it names, or loads a configuration or module from it"
_SERVICE = "it is the service's own setting (a Vortos run by the child would use it)"
REFUSED: tuple[tuple[str, str], ...] = (
    # The loader and the C library: the LD_PRELOAD attack itself and its relatives.
    ("LD_*", _LOADER),  # LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, LD_DEBUG_OUTPUT, ...
    ("DYLD_*", _LOADER),  # macOS's loader
    ("GCONV_PATH", _LOADER),  # iconv loads .so modules from it
    ("GETCONF_DIR", _LOADER),  # getconf runs helper programs from it
    ("GLIBC_TUNABLES", _LOADER),  # CVE-2023-4911 ("Looney Tunables")
    ("MALLOC_*", _LOADER),
    ("LOCPATH", _LOADER),
    ("NLSPATH", _LOADER),
    ("TZDIR", _LOADER),
    ("HOSTALIASES", _RESOLVER),
    ("RES_OPTIONS", _RESOLVER),
    ("LOCALDOMAIN", _RESOLVER),
    ("RESOLV_*", _RESOLVER),
    # Temporary files: a privileged program writing into an operator's directory (or following
    # an operator's symlink there) hands the operator its data or its files.
    ("TMPDIR", _TEMP),
    ("TMP", _TEMP),
    ("TEMP", _TEMP),
    # Interpreters and runtimes: each has a variable that runs code at start.
    ("PYTHON*", _INTERPRETER),  # PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, PYTHONINSPECT, ...
    ("PERL*", _INTERPRETER),  # PERL5LIB, PERL5OPT, PERLLIB, PERLIO, PERLDB_OPTS, ...
    ("RUBY*", _INTERPRETER),  # RUBYOPT, RUBYLIB
    ("GEM_*", _INTERPRETER),
    ("BUNDLE_*", _INTERPRETER),  # BUNDLE_GEMFILE is Ruby code
    ("NODE_*", _INTERPRETER),  # NODE_OPTIONS (--require), NODE_PATH
    ("NPM_CONFIG_*", _INTERPRETER),
    ("JAVA_*", _INTERPRETER),  # JAVA_TOOL_OPTIONS (-javaagent), JAVA_OPTS of wrapper scripts
    ("_JAVA_*", _INTERPRETER),  # _JAVA_OPTIONS
    ("JDK_*", _INTERPRETER),  # JDK_JAVA_OPTIONS
    ("CLASSPATH", _INTERPRETER),
    ("DOTNET_*", _INTERPRETER),
    ("CORECLR_*", _INTERPRETER),  # CORECLR_PROFILER_PATH loads a library
    ("COMPLUS_*", _INTERPRETER),
    ("LUA_*", _INTERPRETER),  # LUA_INIT runs code
    ("PHP*", _INTERPRETER),  # PHPRC, PHP_INI_SCAN_DIR (auto_prepend_file)
    ("TCL*", _INTERPRETER),
    # Shells: startup files, exported functions, prompts expanded under -x, word splitting.
    ("BASH_*", _SHELL),  # BASH_ENV, BASH_FUNC_name%%, BASH_XTRACEFD, BASH_LOADABLES_PATH
    ("ENV", _SHELL),  # sh, dash, ksh: a file run at start
    ("SHELLOPTS", _SHELL),
    ("BASHOPTS", _SHELL),
    ("PS1", _SHELL),
    ("PS2", _SHELL),
    ("PS3", _SHELL),
    ("PS4", _SHELL),  # expanded (with $(...)) on every traced command
    ("PROMPT_COMMAND", _SHELL),
    ("IFS", _SHELL),
    ("CDPATH", _SHELL),
    ("FPATH", _SHELL),  # ksh and zsh autoload functions from it
    ("ZDOTDIR", _SHELL),  # zsh's startup files
    ("GLOBIGNORE", _SHELL),
    ("HISTFILE", _SHELL),
    ("SHELL", _RUNS),  # programs that start "a shell" start this one
    # Where programs and their configuration are found (the base sets PATH and HOME itself).
    ("PATH", _LOOKUP),
    ("HOME", _LOOKUP),  # ~/.gitconfig, ~/.bashrc, ~/.ssh/config, ...
    ("XDG_*", _LOOKUP),  # $XDG_CONFIG_HOME/git/config, ...
    # Programs that run another program, or load a module or configuration, by a variable.
    ("EDITOR", _RUNS),
    ("VISUAL", _RUNS),
    ("PAGER", _RUNS),
    ("MANPAGER", _RUNS),
    ("BROWSER", _RUNS),
    ("LESS*", _RUNS),  # LESSOPEN and LESSCLOSE run commands
    ("GIT_*", _RUNS),  # GIT_SSH_COMMAND, GIT_EXEC_PATH, GIT_CONFIG_*, GIT_ASKPASS, ...
    ("SSH_*", _RUNS),  # SSH_ASKPASS
    ("OPENSSL_*", _RUNS),  # OPENSSL_CONF loads engines and providers
    ("SSL_CERT_*", _RUNS),  # which certificates are trusted
    ("TERMINFO*", _RUNS),
    ("TERMCAP", _RUNS),
    ("VORTOS_*", _SERVICE),
)


def refused_because(name: str) -> str | None:
    """Why a payload can never set the variable `name`, or None if it may (when allowed)."""
    upper = name.upper()
    for pattern, why in REFUSED:
        if upper == pattern or (pattern.endswith("*") and upper.startswith(pattern[:-1])):
            return why
    return None


def check_env_name(name: str) -> None:
    """Refuses a variable name that is malformed or can never be set (InvalidInput)."""
    if not name or len(name) > _MAX_NAME or not set(name) <= _NAME_CHARS or name[0].isdigit():
        raise InvalidInput(
            f"process env name {name!r} is not allowed: a name is letters, digits and '_' "
            f"(not first), at most {_MAX_NAME} characters; rename or remove it"
        )
    why = refused_because(name)
    if why is not None:
        raise InvalidInput(
            f"process env name {name!r} can never be set: {why}, so it could run code of the "
            "payload's choosing as the service's account; remove it from the payload (pass the "
            "value as an argument, or in a variable of your own the service's owner allows with "
            f"process_env_allow / {ENV_ALLOW_ENV})"
        )


def check_allowed_name(name: str, allowed: frozenset[str]) -> None:
    """Refuses a payload variable that is not well formed, never allowed, or not on the
    owner's list (matched exactly: `Foo` is not `FOO`)."""
    check_env_name(name)
    if name in allowed:
        return
    listed = f"allowed: {', '.join(sorted(allowed))}" if allowed else "which is empty"
    raise InvalidInput(
        f"process env name {name!r} is not on the service's process_env_allow list ({listed}): "
        "remove it from the payload, or ask the service's owner to add it (setting "
        f"process_env_allow, or {ENV_ALLOW_ENV}=NAME,...)"
    )


def _items(value: Any, what: str, separator: str) -> list[str]:
    # A TOML array, or (from the environment) entries separated by `separator`.
    items = value.split(separator) if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise TypeError(what)
    return [item.strip() for item in items if item.strip()]


def parse_env_allow(value: Any) -> tuple[str, ...]:
    """The setting process_env_allow: names separated by commas, or a TOML list. A name that can
    never be set is refused here, at start, not silently dropped (ValueError names it)."""
    what = "a list of variable names a process payload may set (NAME,NAME or a TOML list)"
    names = _items(value, what, ",")
    for name in names:
        try:
            check_env_name(name)
        except InvalidInput:
            why = refused_because(name)
            if why is None:
                raise ValueError(
                    f"{what}; {name!r} is not a name (letters, digits and '_', not first)"
                ) from None
            raise ValueError(f"{what}; {name!r} can never be allowed ({why}): remove it") from None
    return tuple(dict.fromkeys(names))


def parse_cwd_allow(value: Any) -> tuple[str, ...]:
    """The setting process_cwd_allow: absolute directories separated by the OS path separator
    (as VORTOS_PROCESS_ALLOW), or a TOML list."""
    what = f"a list of absolute directories (separated by {os.pathsep!r}, or a TOML list)"
    found = []
    for entry in _items(value, what, os.pathsep):
        if "\x00" in entry or not os.path.isabs(entry):
            raise ValueError(f"{what}; {entry!r} is not an absolute path")
        found.append(os.path.normpath(entry))
    return tuple(dict.fromkeys(found))


def env_allow_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """process_env_allow as VORTOS_PROCESS_ENV_ALLOW gives it (for engines opened without
    settings); InvalidInput names what is wrong."""
    return _from_env(ENV_ALLOW_ENV, parse_env_allow, environ)


def cwd_allow_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    return _from_env(CWD_ALLOW_ENV, parse_cwd_allow, environ)


def _from_env(variable: str, parse: Any, environ: Mapping[str, str] | None) -> tuple[str, ...]:
    raw = (os.environ if environ is None else environ).get(variable, "")
    try:
        parsed: tuple[str, ...] = parse(raw)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{variable}={raw!r} is refused: it must be {exc}") from None
    return parsed


def base_environment() -> dict[str, str]:
    """The child's environment before the payload's variables: PATH, LANG, HOME, TZ, and none
    of the service's own (no VORTOS_*, no database URL, no key)."""
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir or DEFAULT_CWD
    except KeyError:  # a uid without an account (a container's): no home to give
        home = DEFAULT_CWD
    env = {"PATH": SAFE_PATH, "LANG": os.environ.get("LANG") or DEFAULT_LANG, "HOME": home}
    zone = os.environ.get("TZ")
    if zone:
        env["TZ"] = zone
    return env


def child_environment(payload_env: Mapping[str, str], allowed: frozenset[str]) -> dict[str, str]:
    """The child's whole environment: the base, then the payload's variables (each checked
    again: the owner's list may have shrunk since the schedule was added)."""
    for name in payload_env:
        check_allowed_name(name, allowed)
    return {**base_environment(), **payload_env}


def working_directory(cwd: str | None, allowed: Iterable[str]) -> str:
    """The directory the child runs in, resolved (symlinks and `..` followed, as the kernel
    would) and inside one of the owner's directories; DEFAULT_CWD when the payload names none.
    Resolved at each call: a symlink swapped since the schedule was added is seen."""
    if cwd is None:
        return DEFAULT_CWD
    if not os.path.isabs(cwd):
        raise InvalidInput(f"process cwd {cwd!r} must be an absolute path")
    roots = list(allowed)
    if not roots:
        raise InvalidInput(
            f"process cwd {cwd!r} is not allowed: the service's process_cwd_allow list is "
            f"empty, so every process runs in {DEFAULT_CWD}; remove cwd from the payload, or "
            f"ask the service's owner to allow a directory (process_cwd_allow / {CWD_ALLOW_ENV})"
        )
    resolved = os.path.realpath(cwd)
    for root in roots:
        real_root = os.path.realpath(root)
        if os.path.commonpath([resolved, real_root]) == real_root:
            break
    else:
        shown = "" if resolved == cwd else f" (it resolves to {resolved!r})"
        raise InvalidInput(
            f"process cwd {cwd!r} is outside the directories the service allows{shown}; "
            f"allowed: {', '.join(roots)}; use a directory inside one of them, or ask the "
            f"service's owner to allow it (process_cwd_allow / {CWD_ALLOW_ENV})"
        )
    if not os.path.isdir(resolved):
        raise InvalidInput(f"process cwd {cwd!r} is not an existing directory: create it first")
    return resolved

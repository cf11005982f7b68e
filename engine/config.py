"""Settings: typed, with defaults, from `vortos.toml`, `VORTOS_*` environment variables and
command-line flags (each overriding the one before), validated all at once at start.

A bad value is refused by name and value with what is allowed (`VORTOS_LEASE_TTL='abc'`), before
anything opens the database; an unknown key in the file is refused too (a typo must not be a
silently ignored setting). `vortos config show` prints each effective value and where it came
from.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.backends.registry import parse_database
from engine.commands.process_env import parse_cwd_allow, parse_env_allow
from engine.domain.database import Database, unambiguous_url
from engine.domain.database import shown as shown_db
from engine.domain.errors import InvalidInput
from engine.domain.redact import redact_url, remember
from engine.domain.schedule import validate_name
from engine.domain.timeutil import format_duration, parse_duration
from engine.domain.values import JsonValue, TomlValue
from engine.settings_values import SettingValues

CONFIG_ENV = "VORTOS_CONFIG"
DEFAULT_FILE = "vortos.toml"
ENV_PREFIX = "VORTOS_"
PLUGIN_TABLE = "plugin"  # [plugin.<name>]: a plug-in's own options

Parser = Callable[[Any], Any]


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a non-empty text")
    return value


# A Redis key prefix goes verbatim into key names: no spaces, no control characters.
REDIS_PREFIX = re.compile(r"[A-Za-z0-9_.:{}\-]{1,64}")
REDIS_PREFIX_RULE = (
    "1 to 64 letters, digits or _ . : - { } (e.g. vortos:prod:), or unset to derive one from "
    "the database"
)


def _redis_prefix(value: Any) -> str:
    if not isinstance(value, str) or not REDIS_PREFIX.fullmatch(value):
        raise ValueError(REDIS_PREFIX_RULE)
    return value


def _path(value: Any) -> Path:
    return Path(_text(value))


def _database(value: Any) -> Database:
    # The backend registry refuses a URL of no known scheme (mysql://...), by name.
    if isinstance(value, Path | Database):
        return parse_database(value)
    return parse_database(_text(value))


def _redis_url(value: Any) -> str:
    text = _text(value)
    if not text.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("a redis://host:port/db (or rediss://, unix://) URL")
    return unambiguous_url(text)


def _duration(low_ms: int, high_ms: int) -> Parser:
    allowed = (
        f"a duration from {format_duration(low_ms)} to {format_duration(high_ms)} "
        "(such as 90, 30s, 5m, 1h)"
    )

    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise TypeError(allowed)
        try:
            ms = (
                int(value) * 1000
                if isinstance(value, int)
                else parse_duration(str(value), what="duration")
            )
        except InvalidInput:
            raise ValueError(allowed) from None
        if not low_ms <= ms <= high_ms:
            raise ValueError(allowed)
        return ms

    return parse


def _integer(low: int, high: int) -> Parser:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise TypeError(f"an integer from {low} to {high}")
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"an integer from {low} to {high}") from None
        if isinstance(value, float) or not low <= number <= high:
            raise ValueError(f"an integer from {low} to {high}")
        return number

    return parse


def _plugin(value: Any) -> str:
    text = _text(value).strip()
    if any(c.isspace() for c in text):
        raise ValueError("a plug-in name or a dotted path such as mypkg.module:Factory")
    return text


def _plugins(value: Any) -> tuple[str, ...]:
    # A TOML array, or (from the environment) names separated by commas.
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise TypeError("a list of plug-in names or dotted paths")
    names = tuple(_plugin(item) for item in items if not isinstance(item, str) or item.strip())
    if len(set(names)) != len(names):
        raise ValueError("a list of plug-in names without repeats")
    return names


def _command_names(value: Any) -> tuple[str, ...]:
    # A TOML array, or (from the environment) names separated by commas.
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise TypeError("a list of command names")
    names = tuple(item.strip() for item in items if item.strip())
    for name in names:
        try:
            validate_name(name, what="command name")
        except InvalidInput as exc:
            raise ValueError(f"a list of command names ({exc})") from None
    return names


def _listed(value: Any) -> str:
    return ", ".join(value) if value else "-"


def _choice(*allowed: str) -> Parser:
    def parse(value: Any) -> str:
        text = str(value).lower()
        if text not in allowed:
            raise ValueError(f"one of {', '.join(allowed)}")
        return text

    return parse


@dataclass(frozen=True, slots=True)
class Setting:
    name: str  # the key in vortos.toml; the variable is VORTOS_ + its upper case
    default: Any
    parse: Parser
    help: str
    shown: Callable[[Any], str] = str
    # May carry a password (a URL): its value is shown through `shown` everywhere, JSON and
    # refusals too, never as it is.
    secret: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _ms(value: Any) -> str:
    return format_duration(int(value))


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "db",
        # Parsed as every other value is, so settings.db is always a Database.
        Database.file(Path("vortos.db")),
        _database,
        "a SQLite file, or a postgresql:// URL",
        shown_db,
        secret=True,
    ),
    Setting("app", None, _text, "modules with @schedulable commands and @scheduled schedules"),
    Setting(
        "lease_driver",
        "row",
        _plugin,
        "how the leader lease is held: row, advisory (PostgreSQL), redis, or a plug-in",
    ),
    Setting(
        "redis_url",
        None,
        _redis_url,
        "the Redis server of lease_driver = redis",
        redact_url,
        secret=True,
    ),
    Setting(
        "redis_prefix",
        None,
        _redis_prefix,
        "the prefix of this deployment's Redis keys (default: derived from the database's "
        "identity, so deployments sharing one Redis never share a key)",
    ),
    Setting("shards", 1, _integer(1, 64), "lease shards: leaders dispatching disjoint sets"),
    Setting("lease_ttl", 15_000, _duration(1_000, 600_000), "leader lease time to live", _ms),
    # The daemon's DEFAULT_LOOKAHEAD_MS (a test keeps them equal; not imported, so reading the
    # settings does not load the runtime).
    Setting("lookahead", 1_000, _duration(0, 10_000), "dispatch slots this long before due", _ms),
    Setting("tenant_cap", 200, _integer(0, 1_000_000), "one tenant's share of a dispatch batch"),
    Setting("consumers", 4, _integer(1, 256), "consumer threads per process"),
    Setting("claim_ttl", 60_000, _duration(1_000, 86_400_000), "a claim's time to live", _ms),
    Setting("grace", 30_000, _duration(0, 3_600_000), "time to finish at shutdown", _ms),
    Setting(
        "consumer_deaths",
        10,
        _integer(1, 1_000),
        "times a fire's consumer may die under it (killed, crashed, cut off) before the fire is "
        "dead-lettered; counted apart from the command's failures",
    ),
    Setting("approval_ttl", 86_400_000, _duration(1_000, 30 * 86_400_000), "four-eyes TTL", _ms),
    Setting("control_socket", None, _path, "serve (run) or use (CLI) this control socket"),
    Setting("control_group", None, _text, "the group that may use the control socket"),
    Setting(
        "operator_file_access",
        "read",
        _choice("read", "none"),
        "read: the control group may read the database files (0640); none: only the service "
        "account (0600), operators read through the control socket",
    ),
    Setting("audit_key_file", None, _path, "the audit key file"),
    Setting(
        "audit_anchor_every",
        3_600_000,
        _duration(60_000, 86_400_000),
        "append every audit chain's signed head to the anchors file this often",
        _ms,
    ),
    Setting(
        "audit_epoch",
        86_400_000,
        _duration(0, 366 * 86_400_000),
        "seal the audit key's epoch this often (the key evolves one way; 0: never)",
        _ms,
    ),
    Setting(
        "sensitive_commands",
        (),
        _command_names,
        "commands whose every schedule needs four-eyes approval",
        _listed,
    ),
    Setting("log_level", "info", _choice("debug", "info", "warning", "error"), "log level"),
    Setting("metrics_port", None, _integer(1, 65_535), "serve Prometheus metrics on this port"),
    Setting("metrics_host", "127.0.0.1", _text, "the address the metrics port listens on"),
    Setting("breaker_failures", 5, _integer(1, 1_000), "dispatch failures that open the breaker"),
    Setting(
        "breaker_recovery", 30_000, _duration(1_000, 3_600_000), "the open breaker's wait", _ms
    ),
    # The process command's payloads (engine.commands.process_env): with a control socket, the
    # server's values decide, never an operator's.
    Setting(
        "process_env_allow",
        (),
        parse_env_allow,
        "environment variables a process payload may set (never LD_*, PYTHON*, PATH, ...)",
        _listed,
    ),
    Setting(
        "process_cwd_allow",
        (),
        parse_cwd_allow,
        "directories a process payload's cwd may be inside (none: every process runs in /)",
        _listed,
    ),
    # Plug-ins (engine.plugins): a built-in name, an entry point's name, or a dotted path.
    Setting("policy", "rbac", _plugin, "who may do what: rbac (roles per tenant) or a plug-in"),
    Setting(
        "identity_provider", "operators", _plugin, "who an operator is: operators or a plug-in"
    ),
    Setting("enqueuer", None, _plugin, "hand fires to this transport instead of running them"),
    Setting("audit_sinks", (), _plugins, "copies of the audit trail (plug-ins)", _listed),
    Setting("metrics", (), _plugins, "metrics backends beside Prometheus (plug-ins)", _listed),
    Setting("doctor_checks", (), _plugins, "doctor checks of your own (plug-ins)", _listed),
    Setting(
        "plugin_timeout",
        5_000,
        _duration(100, 600_000),
        "a sink's or metrics backend's call longer than this counts as hung",
        _ms,
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True, slots=True)
class Value:
    value: Any
    source: str  # default, the file's path, VORTOS_X, or --flag


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings(SettingValues):
    """The effective settings: `settings.lease_ttl`, one typed field per setting (declared in
    engine/settings_values.py, generated from SETTINGS), and where each came from."""

    _sources: Mapping[str, str]  # per setting: default, the file's path, VORTOS_X, --flag
    _plugin_tables: Mapping[str, Mapping[str, TomlValue]] = field(default_factory=dict)

    def plugin_options(self, name: str) -> Mapping[str, TomlValue]:
        """The `[plugin.<name>]` table of the file (empty without one)."""
        return self._plugin_tables.get(name, {})

    def source(self, name: str) -> str:
        return self._sources[name]

    def rows(self) -> list[tuple[str, str, str]]:
        """(name, shown value, source) in declaration order."""
        found = []
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            shown = "-" if value is None else setting.shown(value)
            found.append((setting.name, shown, self._sources[setting.name]))
        return found

    def to_json(self) -> dict[str, dict[str, JsonValue]]:
        return {
            s.name: {"value": _jsonable(s, getattr(self, s.name)), "source": self._sources[s.name]}
            for s in SETTINGS
        }

    def __repr__(self) -> str:
        # As `vortos config show` shows them: a URL without its password.
        return f"Settings({', '.join(f'{name}={shown}' for name, shown, _ in self.rows())})"


def _settings(
    values: Mapping[str, Value], plugin_tables: Mapping[str, Mapping[str, TomlValue]]
) -> Settings:
    return Settings(
        **{name: entry.value for name, entry in values.items()},
        _sources={name: entry.source for name, entry in values.items()},
        _plugin_tables=plugin_tables,
    )


def _jsonable(setting: Setting, value: Any) -> JsonValue:
    if value is None:
        return None
    if setting.secret:
        return setting.shown(value)  # the table's form: a URL without its password
    if isinstance(value, Path):
        return str(value)
    return list(value) if isinstance(value, tuple) else value


def config_file(explicit: Path | None, env: Mapping[str, str]) -> Path | None:
    """The file to read: --config, else VORTOS_CONFIG, else ./vortos.toml when it exists."""
    if explicit is not None:
        return explicit
    named = env.get(CONFIG_ENV)
    if named:
        return Path(named)
    default = Path(DEFAULT_FILE)
    return default if default.is_file() else None


def load_settings(
    *,
    flags: Mapping[str, Any] | None = None,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Defaults < the file < the environment < `flags` (already typed by the CLI, keyed by
    setting name, only those given on the command line). Every problem is reported at once."""
    environment = os.environ if env is None else env
    values = {s.name: Value(s.default, "default") for s in SETTINGS}
    problems: list[str] = []
    path = config_file(config, environment)
    plugin_options: dict[str, Mapping[str, TomlValue]] = {}
    if path is not None:
        table = _read_file(path, config is not None or CONFIG_ENV in environment, problems)
        plugin_options = _plugin_tables(path, table.pop(PLUGIN_TABLE, {}), problems)
        for name, raw in table.items():
            setting = BY_NAME.get(name)
            if setting is None:
                known = ", ".join(sorted(BY_NAME))
                problems.append(f"{path}: unknown setting {name!r} (known: {known})")
                continue
            _take(setting, raw, str(path), values, problems)
    for setting in SETTINGS:
        raw = environment.get(setting.env)
        if raw is not None and raw != "":
            _take(setting, raw, setting.env, values, problems)
    for name, value in (flags or {}).items():
        if BY_NAME[name].secret and isinstance(value, str):
            # A URL flag (--db) is checked as its variable is: a keyword string or an ambiguous
            # URL would otherwise reach a driver that echoes its password.
            _take(BY_NAME[name], value, _flag(name), values, problems)
        else:
            values[name] = Value(value, _flag(name))
    for setting in SETTINGS:
        if setting.secret and isinstance(values[setting.name].value, str):
            remember(values[setting.name].value)  # scrubbed from any message, whatever prints it
    if problems:
        raise InvalidInput("; ".join(problems))
    return _settings(values, plugin_options)


def defaults(**values: object) -> Settings:
    """The table's defaults with `values` in place (as flags are: already typed, taken as
    they are, source "argument"), nothing read from a file or the environment: the settings
    of code that opens an engine itself (`open_engine(db, redis_url=...)`)."""
    unknown = sorted(set(values) - set(BY_NAME))
    if unknown:
        raise InvalidInput(f"unknown setting(s) {', '.join(unknown)} (known: {', '.join(BY_NAME)})")
    chosen = {s.name: Value(s.default, "default") for s in SETTINGS}
    chosen.update({name: Value(value, "argument") for name, value in values.items()})
    return _settings(chosen, {})


def parse_option(name: str, raw: Any) -> Any:
    """A command's own option for setting `name` (such as run's --redis-url), checked and
    refused as the setting is."""
    values: dict[str, Value] = {}
    problems: list[str] = []
    _take(BY_NAME[name], raw, _flag(name), values, problems)
    if problems:
        raise InvalidInput("; ".join(problems))
    return values[name].value


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _plugin_tables(path: Path, raw: Any, problems: list[str]) -> dict[str, Mapping[str, TomlValue]]:
    """`[plugin.<name>]` tables: each plug-in's own options, passed to it as they are."""
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        problems.append(
            f"{path}: [{PLUGIN_TABLE}] must hold one table per plug-in, such as "
            f"[{PLUGIN_TABLE}.filelock] with that plug-in's options"
        )
        return {}
    return dict(raw)


def _take(
    setting: Setting, raw: Any, source: str, values: dict[str, Value], problems: list[str]
) -> None:
    try:
        values[setting.name] = Value(setting.parse(raw), source)
    except (ValueError, TypeError) as exc:
        given = redact_url(raw) if setting.secret and isinstance(raw, str) else raw
        problems.append(f"{source}={given!r} is refused: {setting.name} must be {exc}")


def _read_file(path: Path, required: bool, problems: list[str]) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise InvalidInput(f"config file {path} does not exist")
        return {}
    try:
        text = path.read_bytes().decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"config file {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise InvalidInput(f"config file {path} cannot be read: {exc}") from None
    # Either top-level keys or a [vortos] table.
    table = data.get("vortos", data)
    if not isinstance(table, dict):
        raise InvalidInput(f"config file {path}: [vortos] must be a table")
    # Beside a [vortos] table a top-level key would be silently ignored (a setting the user
    # believes in, or a typo nobody hears of): refused, with the table's own problems.
    stray = [k for k in data if table is not data and k not in ("vortos", PLUGIN_TABLE)]
    if stray:
        problems.append(
            f"{path}: top-level {'key' if len(stray) == 1 else 'keys'} "
            f"{', '.join(map(repr, stray))} beside the [vortos] table: move "
            f"{'it' if len(stray) == 1 else 'them'} into [vortos] (or drop the [vortos] line "
            "and keep every key at the top)"
        )
    # [plugin.<name>] tables beside a [vortos] table are the plug-ins' options, as they are
    # beside top-level keys: dropping them would silently start plug-ins without them.
    if table is not data and PLUGIN_TABLE in data:
        if PLUGIN_TABLE in table:
            raise InvalidInput(
                f"config file {path}: plug-in options are given both as [{PLUGIN_TABLE}.<name>] "
                f"and as [vortos.{PLUGIN_TABLE}.<name>]; keep one"
            )
        table = {**table, PLUGIN_TABLE: data[PLUGIN_TABLE]}
    return table

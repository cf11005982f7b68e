"""Plug-ins by name: which implementation serves each replaceable port.

A setting names the implementation (`lease_driver = "etcd"`): a built-in name, the name of an
entry point in the port's group (`[project.entry-points."vortos.lease_drivers"] etcd =
"mypkg.leases:EtcdLease"` in the plug-in's pyproject.toml), or a dotted path
(`mypkg.leases:EtcdLease`). What it names is a factory: called with one PluginContext, it
returns the implementation (a class whose `__init__` takes the context will do).

Everything a setting names is imported by `select_plugins` before anything else starts, so a
misspelt name, a path to nothing or a plug-in that fails to import is one clear error at start
(InvalidInput: exit code 2), with nothing opened or written. `Selection.rows()` is what
`vortos doctor` and `vortos plugins` show: the implementation serving each port, and where it
came from.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TypeAlias

from engine.config import Settings
from engine.domain.clock import Clock
from engine.domain.database import PlainDatabase
from engine.domain.errors import InvalidInput, StorageError
from engine.domain.values import TomlValue
from engine.ports.policy import IdentityProvider, Policy
from engine.ports.storage import Storage

# What a factory returns is checked against its port by name (Port.required) when it is built;
# its type is the port's, which the caller that asked for that port knows.
Factory: TypeAlias = Callable[["PluginContext"], object]

# The built-in implementation a plug-in may add to: the role-based policy for `policy`, the
# stored identities for `identity_provider`, None for every other port.
BuiltIn: TypeAlias = Policy | IdentityProvider | None


class PluginError(InvalidInput):
    """A plug-in a setting names cannot be found, imported or started."""


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What a plug-in's factory is given.

    `options` is the plug-in's own table in vortos.toml (`[plugin.<name>]`, empty when there is
    none), as TOML values. `default` is the built-in implementation the port would otherwise
    have (the role-based policy, the stored identities), for a plug-in that adds to it rather
    than replacing it; None where there is none. Both ports are runtime-checkable protocols,
    so `isinstance(context.default, Policy)` tells a policy plug-in what it was given.
    """

    setting: str  # the setting that selected it, e.g. "lease_driver"
    name: str  # the value that named it: a name or a dotted path
    clock: Clock
    db: PlainDatabase  # a SQLite file's Path, or the database URL as text
    node_id: str
    options: Mapping[str, TomlValue] = field(default_factory=dict)
    default: BuiltIn = None
    # The effective settings and the opened store; the built-in drivers use them, most
    # plug-ins never need to. None where the process has none (a context built by a test).
    settings: Settings | None = None
    storage: Storage | None = None


@dataclass(frozen=True, slots=True)
class Port:
    """A replaceable port: the setting that selects it and the entry-point group it looks in."""

    setting: str
    group: str
    what: str  # in words, for messages: "lease driver"
    many: bool  # a list of implementations (audit sinks, metrics, doctor checks)
    # What the built object must have: a missing one is refused at start, by name.
    required: tuple[str, ...]
    # Built-in names and the dotted path of their factory.
    builtins: Mapping[str, str] = field(default_factory=dict)


PORTS: tuple[Port, ...] = (
    Port(
        "lease_driver",
        "vortos.lease_drivers",
        "lease driver",
        many=False,
        required=("acquire", "renew", "release", "current"),
        builtins={
            "row": "engine.plugins.builtins:row_driver",
            "advisory": "engine.plugins.builtins:advisory_driver",
            "redis": "engine.plugins.builtins:redis_driver",
        },
    ),
    Port("enqueuer", "vortos.enqueuers", "enqueuer", many=False, required=("enqueue", "close")),
    Port(
        "policy",
        "vortos.policies",
        "policy",
        many=False,
        required=("decide",),
        builtins={"rbac": "engine.plugins.builtins:role_based_policy"},
    ),
    Port(
        "identity_provider",
        "vortos.identity_providers",
        "identity provider",
        many=False,
        required=("identity",),
        builtins={"operators": "engine.plugins.builtins:stored_identities"},
    ),
    Port(
        "audit_sinks",
        "vortos.audit_sinks",
        "audit sink",
        many=True,
        required=("deliver", "close"),
    ),
    Port("metrics", "vortos.metrics", "metrics backend", many=True, required=("active",)),
    Port(
        "doctor_checks",
        "vortos.doctor_checks",
        "doctor check",
        many=True,
        required=("check_id", "run"),
    ),
)
PORT_BY_SETTING = {p.setting: p for p in PORTS}


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def is_dotted_path(value: str) -> bool:
    """`pkg.module:attr` or `pkg.module.attr`; a plain word is a name."""
    return ":" in value or "." in value


@dataclass(frozen=True, slots=True)
class Plugin:
    """One implementation, found and imported, not yet built."""

    port: Port
    name: str
    source: str  # "built-in", "entry point <dist> <version>" or "dotted path"
    target: str  # module:attr
    factory: Factory

    def describe(self) -> str:
        return f"{self.name} ({self.source}: {self.target})"

    def build(self, context: PluginContext) -> object:
        """The implementation; PluginError naming the setting when the factory raises or what
        it returns lacks part of the port."""
        try:
            built = self.factory(context)
        except PluginError:
            raise
        except StorageError:
            # An outage (a lock server down, a database restarting) is not a setting's fault:
            # it keeps its own message and exit code, and a service may wait for it.
            raise
        except InvalidInput as exc:
            raise PluginError(f"{self.port.setting} = {self.name!r}: {exc}") from None
        except Exception as exc:
            raise PluginError(
                f"{self.port.setting} = {self.name!r}: the {self.port.what} {self.target} "
                f"failed to start: {type(exc).__name__}: {exc}"
            ) from exc
        missing = [attr for attr in self.port.required if not hasattr(built, attr)]
        if missing:
            raise PluginError(
                f"{self.port.setting} = {self.name!r}: {self.target} returned "
                f"{_a(type(built).__name__)}, which is not {_a(self.port.what)} (it has no "
                f"{', '.join(missing)}); see the {self.port.what} port in engine.extend"
            )
        return built


def installed(port: Port) -> list[EntryPoint]:
    """The entry points of the port's group, in name order."""
    return sorted(entry_points(group=port.group), key=lambda ep: ep.name)


def available(port: Port) -> list[str]:
    """Every name the port's setting may take: built-ins first, then installed entry points."""
    names = list(port.builtins)
    names += [ep.name for ep in installed(port) if ep.name not in port.builtins]
    return names


def find(port: Port, value: str) -> Plugin:
    """Find and import what `value` names for `port`; PluginError saying what is wrong."""
    value = value.strip()
    if not value:
        raise PluginError(f"{port.setting} is empty: name {_a(port.what)} or give a dotted path")
    if value in port.builtins:
        target = port.builtins[value]
        return Plugin(port, value, "built-in", target, _import(port, value, target))
    if is_dotted_path(value):
        target = value if ":" in value else ":".join(value.rsplit(".", 1))
        return Plugin(port, value, "dotted path", target, _import(port, value, target))
    matches = [ep for ep in installed(port) if ep.name == value]
    if not matches:
        choices = ", ".join(available(port)) or "none installed"
        raise PluginError(
            f"{port.setting} = {value!r}: no {port.what} of that name (known: {choices}; "
            f"entry-point group {port.group}); install the package that provides it, fix the "
            "name, or give a dotted path such as mypkg.module:Factory"
        )
    if len(matches) > 1:
        dists = ", ".join(_dist(ep) for ep in matches)
        raise PluginError(
            f"{port.setting} = {value!r}: several installed packages provide {_a(port.what)} of "
            f"that name ({dists}); uninstall one, or give its dotted path instead"
        )
    entry = matches[0]
    try:
        factory = entry.load()
    except Exception as exc:
        raise PluginError(
            f"{port.setting} = {value!r}: the {port.what} {entry.value} (from {_dist(entry)}) "
            f"failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    source = f"entry point of {_dist(entry)}"
    return Plugin(port, value, source, entry.value, _factory(port, value, entry.value, factory))


def _import(port: Port, value: str, target: str) -> Factory:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise PluginError(
            f"{port.setting} = {value!r} is not a dotted path: use module:attribute, such as "
            "mypkg.leases:EtcdLease"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise PluginError(
                f"{port.setting} = {value!r}: cannot import {module_name} (no module named "
                f"{missing!r}); install the package that provides it or fix the path"
            ) from None
        raise PluginError(
            f"{port.setting} = {value!r}: importing {module_name} failed: "
            f"ModuleNotFoundError: {exc} (a dependency of the plug-in is missing)"
        ) from exc
    except Exception as exc:
        raise PluginError(
            f"{port.setting} = {value!r}: importing {module_name} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(
                f"{port.setting} = {value!r}: {module_name} has no {attr!r}; fix the path"
            ) from None
    return _factory(port, value, target, obj)


def _factory(port: Port, value: str, target: str, obj: object) -> Factory:
    """`obj`, which must be callable: what it returns is checked when it is built."""
    if not callable(obj):
        raise PluginError(
            f"{port.setting} = {value!r}: {target} is {_a(type(obj).__name__)}, not a factory; "
            "name a class or a function that takes a PluginContext"
        )
    return obj


def _dist(entry: EntryPoint) -> str:
    dist = entry.dist
    return "an unknown distribution" if dist is None else f"{dist.name} {dist.version}"


@dataclass(frozen=True, slots=True)
class Selection:
    """The implementation of each port, as the settings name them, all imported."""

    lease_driver: Plugin
    policy: Plugin
    identity_provider: Plugin
    enqueuer: Plugin | None = None
    audit_sinks: tuple[Plugin, ...] = ()
    metrics: tuple[Plugin, ...] = ()
    doctor_checks: tuple[Plugin, ...] = ()

    def plugged(self) -> list[Plugin]:
        """The selected implementations that are not built in."""
        every = [self.lease_driver, self.policy, self.identity_provider, self.enqueuer]
        every += [*self.audit_sinks, *self.metrics, *self.doctor_checks]
        return [p for p in every if p is not None and p.source != "built-in"]

    def rows(self) -> list[tuple[str, str]]:
        """(port, implementation) for every port, as doctor lists them."""
        found: list[tuple[str, str]] = [
            ("lease driver", self.lease_driver.describe()),
            (
                "enqueuer",
                "none: consumers run commands here"
                if self.enqueuer is None
                else self.enqueuer.describe(),
            ),
            ("policy", self.policy.describe()),
            ("identity provider", self.identity_provider.describe()),
        ]
        found += _many("audit sinks", self.audit_sinks, "none")
        found += _many("metrics", self.metrics, "the built-in Prometheus endpoint only")
        found += _many("doctor checks", self.doctor_checks, "the built-in checks only")
        found += [("clock", "the system clock (the database server's on PostgreSQL)")]
        return found


def _many(what: str, plugins: Sequence[Plugin], none: str) -> list[tuple[str, str]]:
    if not plugins:
        return [(what, none)]
    return [(what, p.describe()) for p in plugins]


def select_plugins(settings: Settings) -> Selection:
    """Find and import every plug-in `settings` name. All problems are reported at once, in one
    PluginError."""
    problems: list[str] = []

    def one(setting: str) -> Plugin | None:
        value = getattr(settings, setting)
        if value is None:
            return None
        try:
            return find(PORT_BY_SETTING[setting], str(value))
        except PluginError as exc:
            problems.append(str(exc))
            return None

    def many(setting: str) -> tuple[Plugin, ...]:
        found = []
        for value in getattr(settings, setting) or ():
            try:
                found.append(find(PORT_BY_SETTING[setting], str(value)))
            except PluginError as exc:
                problems.append(str(exc))
        return tuple(found)

    lease = one("lease_driver")
    policy = one("policy")
    identities = one("identity_provider")
    enqueuer = one("enqueuer")
    sinks, metrics, checks = many("audit_sinks"), many("metrics"), many("doctor_checks")
    if problems or lease is None or policy is None or identities is None:
        raise PluginError(
            "; ".join(problems)
            or "lease_driver, policy and identity_provider must each name an implementation"
        )
    return Selection(lease, policy, identities, enqueuer, sinks, metrics, checks)

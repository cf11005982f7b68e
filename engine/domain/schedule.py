"""Schedules and the rules a schedule's definition must satisfy."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from engine.domain.errors import InvalidInput
from engine.domain.retry import RetryPolicy
from engine.domain.timeutil import DAY_MS, HOUR_MS, MINUTE_MS, SECOND_MS, format_duration
from engine.domain.triggers import Trigger, trigger_from_json, trigger_to_json

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]*")
NAME_MAX = 200
META_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
META_MAX_ENTRIES = 64
META_KEY_MAX = 64
META_VALUE_MAX = 1024
PAYLOAD_MAX_BYTES = 64 * 1024
PAYLOAD_MAX_DEPTH = 64  # levels of objects and arrays, the payload itself the first
NOTE_MAX = 1000
JITTER_MAX_MS = HOUR_MS
CATCH_UP_CAP_MAX = 10_000
CATCH_UP_AGE_MAX_MS = 366 * DAY_MS
DEFAULT_TENANT = "default"


class ScheduleStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    DISABLED = "disabled"


class ScheduleOrigin(StrEnum):
    DYNAMIC = "dynamic"  # created through the service (CLI, console, Python)
    STATIC = "static"  # declared in code with @scheduled; only pause and resume at runtime


class MisfireKind(StrEnum):
    """What to do with slots that were missed (the engine was down or far behind)."""

    SKIP = "skip"  # fire none of the missed slots
    LATEST = "latest"  # fire only the newest missed slot
    EACH = "each"  # fire every missed slot, oldest first, at most `catch_up_cap` of them


class OverlapPolicy(StrEnum):
    """What a fire does when it becomes available while a run of its schedule is running.

    - skip: it is skipped (manual and backfill fires wait instead: they were asked for)
    - buffer-one: the oldest one waits for the running one; any other is skipped
    - buffer-all: every one waits, and they run one after another in slot order
    - allow: it runs at once, beside the running one
    - cancel-other: it runs at once, and the running one is asked to stop (cooperatively);
      older fires still waiting are cancelled unrun
    """

    SKIP = "skip"
    BUFFER_ONE = "buffer-one"
    BUFFER_ALL = "buffer-all"
    ALLOW = "allow"
    CANCEL_OTHER = "cancel-other"


@dataclass(frozen=True, slots=True)
class MisfirePolicy:
    """When a slot counts as missed, and what happens to missed slots.

    A slot is on time while `now - due <= grace_ms`; on-time slots always fire. Slots older than
    `max_age_ms` are dropped whatever the policy. `each` keeps the newest `catch_up_cap` missed
    slots and fires them oldest first.
    """

    kind: MisfireKind = MisfireKind.LATEST
    catch_up_cap: int = 100
    max_age_ms: int = DAY_MS
    grace_ms: int = MINUTE_MS

    def __post_init__(self) -> None:
        if not 1 <= self.catch_up_cap <= CATCH_UP_CAP_MAX:
            raise InvalidInput(
                f"catch-up cap {self.catch_up_cap} is out of range (catch_up_cap=): use 1 to "
                f"{CATCH_UP_CAP_MAX}"
            )
        if not SECOND_MS <= self.max_age_ms <= CATCH_UP_AGE_MAX_MS:
            raise InvalidInput(
                f"maximum catch-up age {_spelled(self.max_age_ms)} is out of range "
                "(max_age_ms=): use 1s to 366d"
            )
        # A slot later than a year is no longer "late": it is a missed one.
        if not 0 <= self.grace_ms <= CATCH_UP_AGE_MAX_MS:
            raise InvalidInput(
                f"misfire grace {_spelled(self.grace_ms)} is out of range (grace_ms=): "
                "use 0 to 366d"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "catch_up_cap": self.catch_up_cap,
            "max_age_ms": self.max_age_ms,
            "grace_ms": self.grace_ms,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> MisfirePolicy:
        return cls(
            MisfireKind(value["kind"]),
            _whole(value["catch_up_cap"]),
            _whole(value["max_age_ms"]),
            _whole(value["grace_ms"]),
        )


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not a whole number")
    return value


def _spelled(ms: int) -> str:
    """A duration for a message, its sign kept (format_duration spells magnitudes)."""
    return ("-" if ms < 0 else "") + format_duration(abs(ms))


def validate_name(name: str, *, what: str = "name") -> str:
    """Names are lower-case words: letters, digits, '.', '_', '-', at most 200 characters."""
    if len(name) > NAME_MAX:
        raise InvalidInput(f"{what} is {len(name)} characters long: at most {NAME_MAX} are allowed")
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidInput(
            f"{what} {name!r} is not allowed: use lower-case letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (e.g. nightly-report)"
        )
    return name


def parse_payload(text: str) -> dict[str, Any]:
    """A payload as typed on the command line: a JSON object of at most 64 KiB, each key given
    once (a repeated key would silently take the last value)."""
    if len(text.encode("utf-8", "surrogatepass")) > PAYLOAD_MAX_BYTES:
        raise InvalidInput(
            f"payload is {len(text.encode('utf-8', 'surrogatepass'))} bytes: at most "
            f"{PAYLOAD_MAX_BYTES} (64 KiB) allowed"
        )
    try:
        value = json.loads(text, object_pairs_hook=_once_each)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"payload is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
            """write a JSON object, e.g. '{"to": "ops@example.com"}'"""
        ) from None
    except RecursionError:
        # json's own guard (about 1000 levels), far past what validate_payload allows.
        raise _too_deep() from None
    return validate_payload(value)


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise InvalidInput(f"payload has the key {_shown_key(key)} twice: give each key once")
        found[key] = value
    return found


def validate_payload(value: Any) -> dict[str, Any]:
    """A payload must be a JSON object (commands take named arguments) of at most 64 KiB,
    nested at most PAYLOAD_MAX_DEPTH levels, whose text is all Unicode (no lone surrogate: it
    cannot be stored or shown)."""
    if not isinstance(value, dict):
        raise InvalidInput(
            f"payload must be a JSON object, not {type(value).__name__}: e.g. '{{\"n\": 1}}'"
        )
    _check_shape(value)
    try:
        encoded = canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"payload cannot be stored as JSON: {exc}") from None
    if len(encoded.encode()) > PAYLOAD_MAX_BYTES:
        raise InvalidInput(
            f"payload is {len(encoded.encode())} bytes: at most {PAYLOAD_MAX_BYTES} (64 KiB)"
        )
    return value


def _check_shape(payload: dict[str, Any]) -> None:
    """Depth and text, walked with a stack of its own: a deep payload must not overflow ours."""
    stack: list[tuple[Any, str, int]] = [(payload, "payload", 1)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, dict | list) and depth > PAYLOAD_MAX_DEPTH:
            raise _too_deep()
        if isinstance(node, dict):
            for key, item in node.items():
                inner = f"{where}[{_shown_key(key)}]"
                if isinstance(key, str) and not _is_unicode(key):
                    raise _lone_surrogate(f"a key of {where}")
                stack.append((item, inner, depth + 1))
        elif isinstance(node, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(node))
        elif isinstance(node, str) and not _is_unicode(node):
            raise _lone_surrogate(where)


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown_key(key: Any) -> str:
    # JSON with ASCII escapes: a lone surrogate in a key is shown as \ud800, never written raw.
    return json.dumps(key) if isinstance(key, str) else repr(key)


def _lone_surrogate(where: str) -> InvalidInput:
    return InvalidInput(
        f"{where} holds a lone surrogate (such as \\ud800), which is no Unicode text and "
        "cannot be stored: write the character itself, or its full surrogate pair"
    )


def _too_deep() -> InvalidInput:
    return InvalidInput(f"payload is nested more than {PAYLOAD_MAX_DEPTH} levels deep: flatten it")


def validate_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    if len(metadata) > META_MAX_ENTRIES:
        raise InvalidInput(f"at most {META_MAX_ENTRIES} metadata entries are allowed")
    for key, value in metadata.items():
        if len(key) > META_KEY_MAX or not META_KEY_PATTERN.fullmatch(key):
            raise InvalidInput(
                f"metadata key {key!r} is not allowed: letters, digits, '.', '_', '-', "
                f"at most {META_KEY_MAX} characters"
            )
        if not isinstance(value, str) or len(value) > META_VALUE_MAX or not _is_unicode(value):
            raise InvalidInput(
                f"metadata value of {key!r} must be UTF-8 text of at most {META_VALUE_MAX} "
                "characters"
            )
    return dict(metadata)


def validate_jitter(jitter_ms: int) -> int:
    if not 0 <= jitter_ms <= JITTER_MAX_MS:
        raise InvalidInput(
            f"jitter {_spelled(jitter_ms)} is out of range (jitter_ms=): use 0 to 1h"
        )
    return jitter_ms


# A command's time limit, on a schedule or a command: at most a week (a run longer than that
# wants a process of its own, not a consumer's thread).
TIMEOUT_MAX_MS = 7 * 24 * 3600 * 1000


def validate_timeout(timeout_ms: int | None, *, what: str = "timeout (timeout_ms=)") -> int | None:
    """A command time limit: None (none), or more than 0 and at most 7d."""
    if timeout_ms is None:
        return None
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
        raise InvalidInput(f"{what} must be a duration such as '30s' or '5m'")
    if not 0 < timeout_ms <= TIMEOUT_MAX_MS:
        raise InvalidInput(
            f"{what} {_spelled(timeout_ms)} is out of range: use more than 0 and at most 7d"
        )
    return timeout_ms


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces: one spelling per value (used for storage and digests)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a user asks for when creating a schedule; validated by `ScheduleService`."""

    name: str
    trigger: Trigger
    command: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    timezone: str = "UTC"
    tenant: str = DEFAULT_TENANT
    misfire: MisfirePolicy = field(default_factory=MisfirePolicy)
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    jitter_ms: int = 0
    sensitive: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # How long one run of the command may take (None: the command's own limit, if any). An
    # explicit schedule timeout overrides the command's @schedulable(timeout=) default.
    timeout_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The one JSON spelling of a definition: the control socket sends it, audit entries
        and four-eyes requests record it, the CLI's --json shows it, and two definitions are
        the same exactly when these are equal."""
        return {
            "name": self.name,
            "tenant": self.tenant,
            "trigger": trigger_to_json(self.trigger),
            "timezone": self.timezone,
            "command": self.command,
            "payload": dict(self.payload),
            "misfire": self.misfire.to_json(),
            "overlap": self.overlap.value,
            "jitter_ms": self.jitter_ms,
            "sensitive": self.sensitive,
            "metadata": dict(self.metadata),
            "retry": self.retry.to_json(),
            # Only when set: a definition without one spells itself as before time limits.
            **({} if self.timeout_ms is None else {"timeout_ms": self.timeout_ms}),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ScheduleSpec:
        """The inverse of `to_json`; anything malformed is InvalidInput naming what (the
        service validates the rest: names, zone, command, payload)."""
        unknown = sorted(set(value) - SPEC_KEYS)
        if unknown:
            raise InvalidInput(
                f"malformed schedule definition: {unknown[0]!r} is not one of its fields "
                f"({', '.join(sorted(SPEC_KEYS))})"
            )
        try:
            return cls(
                name=_text(value["name"]),
                trigger=trigger_from_json(value["trigger"]),
                command=_text(value["command"]),
                payload=_object(value["payload"]),
                timezone=_text(value["timezone"]),
                tenant=_text(value["tenant"]),
                misfire=MisfirePolicy.from_json(value["misfire"]),
                overlap=OverlapPolicy(value["overlap"]),
                jitter_ms=_whole(value["jitter_ms"]),
                sensitive=_flag(value["sensitive"]),
                metadata={str(k): str(v) for k, v in _object(value["metadata"]).items()},
                retry=RetryPolicy.from_json(_object(value["retry"])),
                timeout_ms=(
                    None if value.get("timeout_ms") is None else _whole(value["timeout_ms"])
                ),
            )
        except InvalidInput:
            raise
        except KeyError as exc:
            raise InvalidInput(
                f"malformed schedule definition: it has no {exc.args[0]!r}"
            ) from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidInput(f"malformed schedule definition: {exc}") from None


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not text")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{value!r} is not true or false")
    return value


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{value!r} is not an object")
    return dict(value)


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON, types included: Python's `1 == True == 1.0` is three different payloads."""
    return canonical_json(a) == canonical_json(b)


def changed_fields(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The dotted names of what differs between two `to_json` spellings ("misfire.grace_ms",
    "metadata.team"): what an edit changed, in the order the spelling lists them."""
    found: list[str] = []
    for key in dict.fromkeys([*before, *after]):
        old, new = before.get(key), after.get(key)
        if same_json(old, new):
            continue
        if isinstance(old, Mapping) and isinstance(new, Mapping) and key != "trigger":
            found += [f"{key}.{inner}" for inner in changed_fields(old, new)]
        else:
            found.append(key)
    return found


SPEC_KEYS = frozenset(ScheduleSpec.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class StaticOverride:
    """An operator's pause or resume of a static (code-declared) schedule. It outlives
    deploys: until an operator clears it, the schedule stays so whatever the code declares."""

    state: ScheduleStatus  # PAUSED or ACTIVE
    by: str
    at: int
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "by": self.by, "at": self.at, "note": self.note}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StaticOverride:
        return cls(
            ScheduleStatus(value["state"]), str(value["by"]), int(value["at"]), value.get("note")
        )


@dataclass(frozen=True, slots=True)
class Schedule:
    """A stored schedule.

    `next_slot_at` is the cursor: the first slot not yet resolved. `next_fire_at` is when that
    slot is due (its instant plus its jitter offset); the due scan reads it through an index.
    Both are None once a trigger has no further slot. `version` counts definition changes only
    (the cursor moves without bumping it, so editing never races the daemon).
    """

    id: str
    tenant: str
    name: str
    trigger: Trigger
    timezone: str
    command: str
    payload: Mapping[str, Any]
    misfire: MisfirePolicy
    overlap: OverlapPolicy
    jitter_ms: int
    status: ScheduleStatus
    sensitive: bool
    metadata: Mapping[str, str]
    version: int
    next_slot_at: int | None
    next_fire_at: int | None
    created_at: int
    updated_at: int
    pause_note: str | None = None
    origin: ScheduleOrigin = ScheduleOrigin.DYNAMIC
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Static schedules only: whether the code declares it paused, and an operator's override.
    declared_paused: bool = False
    override: StaticOverride | None = None
    timeout_ms: int | None = None  # see ScheduleSpec.timeout_ms

    @property
    def spec(self) -> ScheduleSpec:
        """Its definition: what an operator may change (the rest is its state)."""
        return ScheduleSpec(
            name=self.name,
            trigger=self.trigger,
            command=self.command,
            payload=self.payload,
            timezone=self.timezone,
            tenant=self.tenant,
            misfire=self.misfire,
            overlap=self.overlap,
            jitter_ms=self.jitter_ms,
            sensitive=self.sensitive,
            metadata=self.metadata,
            retry=self.retry,
            timeout_ms=self.timeout_ms,
        )

    @property
    def declared_status(self) -> ScheduleStatus:
        """What the code alone would make of a static schedule (ignoring any override)."""
        return ScheduleStatus.PAUSED if self.declared_paused else ScheduleStatus.ACTIVE

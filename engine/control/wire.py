"""The control socket's wire format: one JSON object per line each way.

A request is `{"v": 1, "op": NAME, "args": {...}}`; the answer `{"ok": true, "result": {...}}`
or `{"ok": false, "error": {"type": NAME, "message": TEXT, "exit_code": N, ...}}`. A request
never says who sends it: the server asks the kernel (SO_PEERCRED).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.domain.approvals import ApprovalRequired
from engine.domain.errors import VortosError

VERSION = 1
MAX_LINE = 1 << 20  # bytes in one request or answer; a schedule's payload is far smaller


class ProtocolError(VortosError):
    """The other end spoke something that is not this protocol (or broke off)."""

    exit_code = 1


class ControlUnavailable(VortosError):
    """The control socket cannot be reached."""

    exit_code = 1


class ServerBusy(ControlUnavailable):
    """The server refused a connection at once: it holds as many as it serves, or as many as
    one account may hold (so that one account cannot take the socket from the others)."""


def encode(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a message of more than {MAX_LINE} bytes")
    try:
        value = json.loads(line, object_pairs_hook=_once_each)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    except RecursionError:
        # json's own guard: a request nested about 1000 deep (a payload may hold 64 levels).
        raise ProtocolError("a message nested too deep") from None
    if not isinstance(value, dict):
        raise ProtocolError("not a JSON object")
    return value


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A repeated key would silently take its last value: what a reader and the server see
    # must be the same.
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ProtocolError(f"a message with the key {json.dumps(key)} twice")
        found[key] = value
    return found


# -- errors -------------------------------------------------------------------------------------


def error_to_json(exc: VortosError) -> dict[str, Any]:
    found: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc),
        "exit_code": exc.exit_code,
    }
    if isinstance(exc, ApprovalRequired):
        found["approval_id"] = exc.approval.id
    return found


def _error_types() -> dict[str, type[VortosError]]:
    found: dict[str, type[VortosError]] = {}
    todo: list[type[VortosError]] = [VortosError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, cls)
        todo += cls.__subclasses__()
    return found


class RemoteError(VortosError):
    """An error the server reported that this side has no class for; keeps its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def error_from_json(value: Mapping[str, Any]) -> VortosError:
    """The server's error as the same class here (so callers catch it as if local); an
    ApprovalRequired is rebuilt by the caller, who can read the request."""
    name, message = str(value.get("type")), str(value.get("message"))
    cls = _error_types().get(name)
    if cls is None or cls is ApprovalRequired:
        return RemoteError(message, int(value.get("exit_code", 1)))
    try:
        return cls(message)
    except TypeError:  # a class whose constructor wants more than a message
        return RemoteError(message, int(value.get("exit_code", 1)))

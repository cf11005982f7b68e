"""The commands every engine has: noop, echo, process and vortos.prune."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from engine.commands.process import ProcessAllowlist, process_command
from engine.commands.registry import CommandRegistry
from engine.retention.audit_upkeep import anchor_command
from engine.retention.command import sweep_command

log = logging.getLogger("vortos.commands")


def _noop(**_payload: Any) -> None:
    """Does nothing: for schedules that only mark time."""


def _echo(**payload: Any) -> Mapping[str, Any]:
    """Logs its payload and returns it."""
    log.info("echo %s", payload)
    return payload


def builtin_commands(process_allowlist: ProcessAllowlist | None = None) -> CommandRegistry:
    """noop, echo, process (which runs only the executables of `process_allowlist`, a
    ProcessAllowlist; by default the one in VORTOS_PROCESS_ALLOW) and vortos.prune (the
    retention sweeper, see engine.retention)."""
    registry = CommandRegistry()
    registry.register("noop", _noop, "does nothing")
    registry.register("echo", _echo, "logs its payload")
    allowlist = process_allowlist if process_allowlist is not None else ProcessAllowlist.from_env()
    registry.add(process_command(allowlist))
    # The retention sweeper's: each registry has its own, attached to the engine opened with it.
    registry.add(sweep_command())
    registry.add(anchor_command())  # the audit chain's external anchors (audit_upkeep)
    return registry

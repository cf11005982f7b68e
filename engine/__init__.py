"""Vortos engine: exactly-once periodic scheduling. Public API."""

from engine.api import DEFAULT_DB, Engine, open_engine
from engine.commands import CommandRegistry, builtin_commands
from engine.domain.clock import Clock, ManualClock, SystemClock
from engine.domain.errors import (
    Conflict,
    DuplicateName,
    DuplicateSlot,
    InvalidInput,
    LeaseError,
    LeaseExpired,
    LeaseNotOwned,
    NotFound,
    StaleVersion,
    StorageError,
    VortosError,
)
from engine.domain.run import Run, RunKind, RunState
from engine.domain.schedule import (
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    Schedule,
    ScheduleSpec,
    ScheduleStatus,
)
from engine.domain.triggers import (
    CronTrigger,
    IntervalTrigger,
    MissingHour,
    OneShotTrigger,
    RepeatedHour,
    Trigger,
)
from engine.runtime.daemon import DaemonConfig, SchedulerDaemon
from engine.service import PreviewSlot, ScheduleService

__all__ = [
    "DEFAULT_DB",
    "Clock",
    "CommandRegistry",
    "Conflict",
    "CronTrigger",
    "DaemonConfig",
    "DuplicateName",
    "DuplicateSlot",
    "Engine",
    "IntervalTrigger",
    "InvalidInput",
    "LeaseError",
    "LeaseExpired",
    "LeaseNotOwned",
    "ManualClock",
    "MisfireKind",
    "MisfirePolicy",
    "MissingHour",
    "NotFound",
    "OneShotTrigger",
    "OverlapPolicy",
    "PreviewSlot",
    "RepeatedHour",
    "Run",
    "RunKind",
    "RunState",
    "Schedule",
    "ScheduleService",
    "ScheduleSpec",
    "ScheduleStatus",
    "SchedulerDaemon",
    "StaleVersion",
    "StorageError",
    "SystemClock",
    "Trigger",
    "VortosError",
    "builtin_commands",
    "open_engine",
]

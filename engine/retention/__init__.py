"""Retention: run history pruned past its tenant's retention, in short batches, audited.

The built-in sweeper (`retention_schedule`, command `vortos.prune`) runs daily; `vortos prune`
runs it now; `vortos retention set|remove|show` manage per-tenant overrides (0 days: a legal
hold). See the README's Retention section for what goes when.
"""

from engine.retention.command import (
    SWEEP_ACTOR,
    SWEEP_COMMAND,
    SWEEP_SCHEDULE,
    SWEEP_TENANT,
    SweepCommand,
    attach_sweeper,
    retention_schedule,
    sweep_command,
)
from engine.retention.plan import RetentionPlan, TenantRule
from engine.retention.report import PruneReport, TenantPrune
from engine.retention.settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BUDGET_S,
    DEFAULT_DAYS,
    DEFAULT_DEAD_LETTER_DAYS,
    MAX_DAYS,
    RetentionSettings,
    validate_days,
)
from engine.retention.sweeper import RetentionSweeper

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_BUDGET_S",
    "DEFAULT_DAYS",
    "DEFAULT_DEAD_LETTER_DAYS",
    "MAX_DAYS",
    "SWEEP_ACTOR",
    "SWEEP_COMMAND",
    "SWEEP_SCHEDULE",
    "SWEEP_TENANT",
    "PruneReport",
    "RetentionPlan",
    "RetentionSettings",
    "RetentionSweeper",
    "SweepCommand",
    "TenantPrune",
    "TenantRule",
    "attach_sweeper",
    "retention_schedule",
    "sweep_command",
    "validate_days",
]

"""Which runs a sweep may prune, tenant by tenant, at one instant (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine.domain.timeutil import DAY_MS
from engine.ports.retention import RetentionOverride, RunAge, RunStanding
from engine.retention.settings import RetentionSettings


@dataclass(frozen=True, slots=True)
class TenantRule:
    """How long one tenant's history is kept; None: forever."""

    days: int | None
    dead_letter_days: int | None
    legal_hold: bool = False
    overridden: bool = False

    def cutoff(self, now_ms: int, standing: RunStanding) -> int | None:
        """Runs of this standing aged from before the cutoff may go (None: none may)."""
        if standing is RunStanding.OPEN:
            return None
        days = self.dead_letter_days if standing is RunStanding.DEAD_LETTER else self.days
        return None if days is None else now_ms - days * DAY_MS


def _forever(days: int) -> int | None:
    return None if days == 0 else days


def _dead_letter_days(run_days: int | None, dead_letter_days: int | None) -> int | None:
    # A dead letter is history too: never gone before the tenant's own retention.
    if run_days is None or dead_letter_days is None:
        return None
    return max(run_days, dead_letter_days)


def rule_for(settings: RetentionSettings, override: RetentionOverride | None) -> TenantRule:
    dead_letters = _forever(settings.dead_letter_days)
    if override is None:
        days = _forever(settings.days)
        return TenantRule(days, _dead_letter_days(days, dead_letters))
    if override.legal_hold:
        return TenantRule(None, None, legal_hold=True, overridden=True)
    return TenantRule(
        override.days, _dead_letter_days(override.days, dead_letters), overridden=True
    )


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """The rules of every tenant at `now_ms`: the default, and each override."""

    now_ms: int
    default: TenantRule
    overrides: Mapping[str, TenantRule]

    @classmethod
    def at(
        cls, now_ms: int, settings: RetentionSettings, overrides: Iterable[RetentionOverride]
    ) -> RetentionPlan:
        return cls(
            now_ms,
            rule_for(settings, None),
            {o.tenant: rule_for(settings, o) for o in overrides},
        )

    def rule(self, tenant: str) -> TenantRule:
        return self.overrides.get(tenant, self.default)

    def prunes(self, run: RunAge) -> bool:
        cutoff = self.rule(run.tenant).cutoff(self.now_ms, run.standing)
        return cutoff is not None and run.aged_from < cutoff

    def select(self, runs: Iterable[RunAge]) -> list[RunAge]:
        return [run for run in runs if self.prunes(run)]

    @property
    def horizon(self) -> int | None:
        """No run dispatched at or after this instant can go (its age counts from its dispatch
        or later); None when nothing can go at all."""
        cutoffs = [
            cutoff
            for rule in (self.default, *self.overrides.values())
            for standing in (RunStanding.SETTLED, RunStanding.DEAD_LETTER)
            if (cutoff := rule.cutoff(self.now_ms, standing)) is not None
        ]
        return max(cutoffs) if cutoffs else None

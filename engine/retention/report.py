"""What a sweep pruned (or, dry, would prune): per tenant, and how the sweep went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.domain.timeutil import iso_utc, parse_instant
from engine.ports.retention import RunAge, RunStanding
from engine.retention.settings import RetentionSettings


@dataclass(slots=True)
class TenantPrune:
    runs: int = 0
    fires: int = 0  # fire-queue rows gone with their runs
    dead_letters: int = 0  # of those fires, the dead letters

    def add(self, run: RunAge) -> None:
        self.runs += 1
        if run.has_fire:
            self.fires += 1
        if run.standing is RunStanding.DEAD_LETTER:
            self.dead_letters += 1

    def to_json(self) -> dict[str, int]:
        return {"runs": self.runs, "fires": self.fires, "dead_letters": self.dead_letters}


@dataclass(slots=True)
class PruneReport:
    """One sweep. `truncated`: it stopped before the end (`stopped_by` says why: its time
    budget ran out, or it was asked to stop); the next sweep goes on from where it is."""

    sweep_id: str
    trigger: str  # "scheduled" (the built-in sweeper schedule) or "manual" (`vortos prune`)
    dry_run: bool
    started_at: int  # ms since the epoch, UTC: the instant the retention is counted from
    settings: RetentionSettings
    tenants: dict[str, TenantPrune] = field(default_factory=dict)
    duration_s: float = 0.0
    truncated: bool = False
    stopped_by: str | None = None  # "budget" or "cancelled"
    batches: int = 0  # write transactions that deleted something
    examined: int = 0  # runs looked at

    def count(self, runs: list[RunAge]) -> None:
        for run in runs:
            self.tenants.setdefault(run.tenant, TenantPrune()).add(run)

    def stop(self, why: str) -> None:
        self.truncated = True
        self.stopped_by = why

    @property
    def runs(self) -> int:
        return sum(t.runs for t in self.tenants.values())

    @property
    def fires(self) -> int:
        return sum(t.fires for t in self.tenants.values())

    @property
    def dead_letters(self) -> int:
        return sum(t.dead_letters for t in self.tenants.values())

    def only(self, tenants: set[str] | frozenset[str] | None) -> PruneReport:
        """The same report narrowed to these tenants (None: all)."""
        if tenants is None:
            return self
        kept = {t: c for t, c in self.tenants.items() if t in tenants}
        narrowed = PruneReport(
            self.sweep_id, self.trigger, self.dry_run, self.started_at, self.settings, kept
        )
        narrowed.duration_s, narrowed.truncated, narrowed.stopped_by = (
            self.duration_s,
            self.truncated,
            self.stopped_by,
        )
        narrowed.batches, narrowed.examined = self.batches, self.examined
        return narrowed

    def to_json(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep_id,
            "trigger": self.trigger,
            "dry_run": self.dry_run,
            "started_at": iso_utc(self.started_at),
            "duration_s": round(self.duration_s, 3),
            "truncated": self.truncated,
            "stopped_by": self.stopped_by,
            "batches": self.batches,
            "examined": self.examined,
            "runs": self.runs,
            "fires": self.fires,
            "dead_letters": self.dead_letters,
            "settings": self.settings.to_payload(),
            "tenants": [
                {"tenant": tenant, **counts.to_json()}
                for tenant, counts in sorted(self.tenants.items())
            ],
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> PruneReport:
        """A report as `to_json` wrote it (a control socket's prune)."""
        report = cls(
            sweep_id=str(value["sweep"]),
            trigger=str(value["trigger"]),
            dry_run=bool(value["dry_run"]),
            started_at=parse_instant(str(value["started_at"])),
            settings=RetentionSettings.from_payload(value["settings"]),
            tenants={
                str(t["tenant"]): TenantPrune(
                    int(t["runs"]), int(t["fires"]), int(t["dead_letters"])
                )
                for t in value["tenants"]
            },
        )
        report.duration_s = float(value["duration_s"])
        report.truncated = bool(value["truncated"])
        report.stopped_by = value.get("stopped_by")
        report.batches = int(value["batches"])
        report.examined = int(value["examined"])
        return report

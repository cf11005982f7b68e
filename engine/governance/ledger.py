"""Checking the run ledger against the audit chain's batch entries.

A dispatch transaction's entry commits to its runs (ids, schedule, slot key, slot and due
instants: the columns nothing may change later) with a digest, so a run row deleted, edited,
reordered or added is caught by the walk that reaches the entry. Runs a retention sweep
pruned are excused by that sweep's own entry (`runs.pruned`, later in the same chain); the
remaining runs of a batch partly pruned cannot be checked against its digest and are
counted, not claimed checked.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.domain.audit import FIRE_BATCHES, AuditEntry, ChainProblem, fires_digest

PRUNED = "runs.pruned"

# Runs by id range: (id, tenant, schedule id, slot key, slot at, due at) in id order.
RunsIn = Callable[[int, int], Sequence[Sequence[Any]]]


@dataclass(slots=True)
class LedgerCheck:
    """One chain's batch entries against the ledger, fed in chain order."""

    runs_in: RunsIn
    batches: int = 0  # batch entries whose runs were all found and matched
    partly_pruned: int = 0  # batch entries with runs retention pruned: not matched
    withdrawn: int = 0  # batch entries whose runs an edit withdrew before they were due
    # Batch seq -> run ids not in the ledger, until a later prune entry excuses them.
    missing: dict[int, set[int]] = field(default_factory=dict)
    # Every id range a batch committed to, [first, last] sorted by first (for the full scan).
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def feed(self, entry: AuditEntry) -> ChainProblem | None:
        if entry.event == PRUNED:
            self._pruned(entry.data)
            return None
        if "withdrawn" in entry.data:
            self._withdrawn(entry.data["withdrawn"])
            return None
        if entry.event not in FIRE_BATCHES:
            return None
        data = entry.data
        try:
            count = int(data["count"])
            ranges = [(int(first), int(first) + int(n) - 1) for first, n in data["runs"]]
            digest = str(data["digest"])
        except (KeyError, TypeError, ValueError):
            return ChainProblem(entry.seq, "a batch entry without its runs (forged)")
        rows: list[Sequence[Any]] = []
        for first, last in ranges:
            rows += self.runs_in(first, last)
            bisect.insort(self.ranges, (first, last))
        foreign = [r for r in rows if r[1] != entry.tenant]
        if foreign:
            return ChainProblem(
                entry.seq,
                f"run {foreign[0][0]} of this batch now belongs to tenant {foreign[0][1]!r} "
                "(the run row was edited)",
            )
        if len(rows) == count:
            fired = [(int(r[0]), str(r[2]), str(r[3]), int(r[4]), int(r[5])) for r in rows]
            if fires_digest(fired) != digest:
                return ChainProblem(
                    entry.seq,
                    "the run rows of this dispatch batch were edited, reordered or replaced "
                    f"(runs {ranges[0][0]}..{ranges[-1][1]}: their digest differs)",
                )
            self.batches += 1
            return None
        expected = {i for first, last in ranges for i in range(first, last + 1)}
        self.missing[entry.seq] = expected - {int(r[0]) for r in rows}
        return None

    def _pruned(self, data: Mapping[str, Any]) -> None:
        if "removed" in data:  # exactly the runs the sweep deleted
            try:
                ids = {int(first) + i for first, n in data["removed"] for i in range(int(n))}
            except (TypeError, ValueError):
                return
            self._excuse(ids.__contains__, "pruned")
            return
        try:  # a sweep from before exact ranges: its span (which may hold runs it kept)
            low, high = sorted((int(data["first_run"]), int(data["last_run"])))
        except (KeyError, TypeError, ValueError):
            return
        self._excuse(lambda i: low <= i <= high, "pruned")

    def _excuse(self, gone: Callable[[int], bool], why: str) -> None:
        for seq in list(self.missing):
            self.missing[seq] = {i for i in self.missing[seq] if not gone(i)}
            if not self.missing[seq]:
                del self.missing[seq]
                if why == "pruned":
                    self.partly_pruned += 1
                else:
                    self.withdrawn += 1

    def _withdrawn(self, ranges: Any) -> None:
        """An edit withdrew fires written ahead, unrun (engine.service.core.update)."""
        try:
            ids = {int(first) + i for first, n in ranges for i in range(int(n))}
        except (TypeError, ValueError):
            return
        self._excuse(ids.__contains__, "withdrawn")

    def finish(self) -> ChainProblem | None:
        """Runs missing from the ledger that no retention sweep pruned."""
        if not self.missing:
            return None
        seq = min(self.missing)
        ids = sorted(self.missing[seq])
        shown = ", ".join(map(str, ids[:5])) + (", ..." if len(ids) > 5 else "")
        return ChainProblem(
            seq,
            f"{len(ids)} run row(s) of this dispatch batch are missing from the ledger "
            f"(run {shown}), and no retention sweep pruned them: deleted",
        )

    def covers(self, run_id: int) -> bool:
        at = bisect.bisect_right(self.ranges, (run_id, float("inf"))) - 1
        return at >= 0 and self.ranges[at][0] <= run_id <= self.ranges[at][1]

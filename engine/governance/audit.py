"""Verifying audit chains: incrementally from the last verification, or in full, or offline
from an export; and exporting them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from engine.domain.audit import (
    START,
    AuditEntry,
    ChainPoint,
    ChainProblem,
    ChainWalk,
    Checkpoint,
    KeyRing,
    checkpoint_message,
    parse_point,
)
from engine.ports.audit import AuditLog

PAGE = 10_000


@dataclass(slots=True)
class ChainReport:
    chain: str
    head: ChainPoint
    resumed_from: int  # the sequence verification started after (0: the chain's start)
    checked: int = 0  # entries whose hash and signature were checked now
    problem: ChainProblem | None = None

    @property
    def intact(self) -> bool:
        return self.problem is None

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "intact": self.intact,
            "head": self.head.spelled(),
            "head_seq": self.head.seq,
            "resumed_from": self.resumed_from,
            "checked": self.checked,
            "first_bad_seq": None if self.problem is None else self.problem.seq,
            "problem": None if self.problem is None else self.problem.reason,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ChainReport:
        """A report as `to_json` wrote it (a control socket's verification)."""
        bad = value.get("first_bad_seq")
        return cls(
            chain=str(value["chain"]),
            head=parse_point(str(value["head"])),
            resumed_from=int(value["resumed_from"]),
            checked=int(value["checked"]),
            problem=None if bad is None else ChainProblem(int(bad), str(value["problem"])),
        )


@dataclass(slots=True)
class Verification:
    chains: list[ChainReport] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return all(report.intact for report in self.chains)


def _walk(
    walk: ChainWalk, entries: Iterable[AuditEntry], checkpoints: Mapping[int, Checkpoint]
) -> None:
    for entry in entries:
        if not walk.feed(entry):
            return
        checkpoint = checkpoints.get(entry.seq)
        if checkpoint is not None:
            if checkpoint.hash != entry.hash:
                walk.problem = ChainProblem(
                    entry.seq, "the entry differs from the checkpoint signed at this sequence"
                )
                return
            if not walk.check_point(checkpoint):
                return


def verify_chain(
    log: AuditLog,
    keys: KeyRing,
    chain: str,
    *,
    full: bool = False,
    expect: ChainPoint | None = None,
) -> ChainReport:
    """Check one chain: from the last signed verification mark (or the start, with `full`) to
    its head. With `expect`, also that the entry at that earlier head is still there, unchanged
    (a truncated or rewritten tail)."""
    head = log.head(chain)
    start = START
    report = ChainReport(chain, head, 0)
    mark = None if full else log.verified(chain)
    if mark is not None:
        valid = keys.valid(
            checkpoint_message(chain, mark.seq, mark.hash), mark.key_id, mark.signature
        )
        if valid and mark.seq > head.seq:
            report.problem = ChainProblem(
                head.seq + 1,
                f"entries {head.seq + 1}..{mark.seq} were verified before and are gone "
                "(the chain was truncated)",
            )
            return report
        if valid:
            found = log.entries(chain, after_seq=mark.seq - 1, limit=1)
            if not found or found[0].seq != mark.seq or found[0].hash != mark.hash:
                report.problem = ChainProblem(
                    mark.seq, "the entry verified last time has changed since (rewritten)"
                )
                return report
            start = ChainPoint(mark.seq, mark.hash)
        # An unsigned or forged mark is ignored: verification starts from the beginning.
    report.resumed_from = start.seq
    walk = ChainWalk(chain, keys, start)
    checkpoints = {cp.seq: cp for cp in log.checkpoints(chain, after_seq=start.seq)}
    after = start.seq
    while True:
        page = log.entries(chain, after_seq=after, limit=PAGE)
        if not page:
            break
        _walk(walk, page, checkpoints)
        if walk.problem is not None:
            break
        after = page[-1].seq
    report.checked = walk.checked
    report.problem = walk.problem
    if report.problem is None and walk.at != head:
        report.problem = ChainProblem(walk.at.seq + 1, "the chain ends before its head")
    if report.problem is None and expect is not None:
        report.problem = _against_expected(log, chain, head, expect)
    return report


def _against_expected(
    log: AuditLog, chain: str, head: ChainPoint, expect: ChainPoint
) -> ChainProblem | None:
    if expect.seq > head.seq:
        return ChainProblem(
            head.seq + 1,
            f"the head recorded earlier is {expect.seq}, the chain now ends at {head.seq} "
            "(truncated)",
        )
    if expect.seq == 0:
        return None
    found = log.entries(chain, after_seq=expect.seq - 1, limit=1)
    if not found or found[0].hash != expect.hash:
        return ChainProblem(expect.seq, "the entry at the head recorded earlier has changed")
    return None


def verify(
    log: AuditLog,
    keys: KeyRing,
    *,
    chains: Iterable[str] | None = None,
    full: bool = False,
    expect: Mapping[str, ChainPoint] | None = None,
    record: bool = True,
) -> Verification:
    """Verify chains (all by default); with `record`, remember how far each intact one was
    verified, so the next run resumes there."""
    wanted = list(chains) if chains is not None else log.chains()
    result = Verification()
    for chain in wanted:
        report = verify_chain(
            log, keys, chain, full=full, expect=None if expect is None else expect.get(chain)
        )
        result.chains.append(report)
        if record and report.intact and report.head.seq > 0:
            log.mark_verified(chain, report.head)
    return result


# -- export and offline verification ---------------------------------------------------------


def export(log: AuditLog, out: TextIO, *, chains: Iterable[str] | None = None) -> int:
    """Write every entry as one JSON line, chain by chain in sequence order; return how many."""
    count = 0
    for chain in list(chains) if chains is not None else log.chains():
        after = 0
        while True:
            page = log.entries(chain, after_seq=after, limit=PAGE)
            if not page:
                break
            for entry in page:
                out.write(json.dumps(entry.to_json(), sort_keys=True, ensure_ascii=False))
                out.write("\n")
            count += len(page)
            after = page[-1].seq
    return count


def read_export(lines: Iterable[str]) -> Iterator[AuditEntry]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield AuditEntry.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"line {number} is not an audit entry ({exc})") from None


def verify_export(entries: Iterable[AuditEntry], keys: KeyRing) -> Verification:
    """Walk an export offline, each chain from its start."""
    walks: dict[str, ChainWalk] = {}
    for entry in entries:
        walk = walks.setdefault(entry.chain, ChainWalk(entry.chain, keys))
        walk.feed(entry)
    result = Verification()
    for chain, walk in sorted(walks.items()):
        result.chains.append(ChainReport(chain, walk.at, 0, walk.checked, walk.problem))
    return result

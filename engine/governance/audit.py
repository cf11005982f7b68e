"""Verifying audit chains: incrementally from the last verification, or in full, or offline
from an export; and exporting them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TextIO

from engine.domain.audit import (
    CHECKPOINT_EVERY,
    GENESIS,
    START,
    AuditEntry,
    ChainPoint,
    ChainProblem,
    ChainWalk,
    Checkpoint,
    KeyRing,
    VerificationMark,
    checkpoint_message,
    entry_message,
    parse_point,
)
from engine.domain.errors import VortosError
from engine.domain.timeutil import iso_utc
from engine.ports.audit import AuditLog

PAGE = 10_000


class VerifyMode(StrEnum):
    INCREMENTAL = "incremental"  # from the signed verification mark: earlier entries trusted
    FULL = "full"  # every entry, every checkpoint and the mark
    EXPORT = "export"  # an export, offline: every entry it holds, from the chain's start


class VerificationCancelled(VortosError):
    """The verifier asked to stop: chains not finished were not verified, nor recorded."""


# Entries checked so far and the total to check, over every chain of one verification.
Progress = Callable[[int, int], None]


@dataclass(slots=True)
class ChainReport:
    chain: str
    head: ChainPoint
    resumed_from: int  # the sequence verification started after (0: the chain's start)
    checked: int = 0  # entries whose hash and signature were checked now
    problem: ChainProblem | None = None
    mode: VerifyMode = VerifyMode.INCREMENTAL
    # When the signed mark trusted for entries 1..resumed_from was made (None: none trusted).
    mark_at: int | None = None
    checkpoints_checked: int = 0  # signed checkpoints compared with their entries now
    # The walk found an entry broken: the last entry it verified before it (not reported).
    verified_to: ChainPoint | None = None

    @property
    def intact(self) -> bool:
        return self.problem is None

    @property
    def trusted_through(self) -> int:
        """Entries up to this sequence were not checked now: trusted from the mark."""
        return self.resumed_from

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
            "mode": self.mode.value,
            "trusted_through": self.trusted_through,
            "mark_at": self.mark_at,
            "checkpoints_checked": self.checkpoints_checked,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ChainReport:
        """A report as `to_json` wrote it (a control socket's verification)."""
        bad = value.get("first_bad_seq")
        mark_at = value.get("mark_at")
        return cls(
            chain=str(value["chain"]),
            head=parse_point(str(value["head"])),
            resumed_from=int(value["resumed_from"]),
            checked=int(value["checked"]),
            problem=None if bad is None else ChainProblem(int(bad), str(value["problem"])),
            # A server from before these keys verified incrementally and said nothing more.
            mode=VerifyMode(str(value.get("mode", VerifyMode.INCREMENTAL.value))),
            mark_at=None if mark_at is None else int(mark_at),
            checkpoints_checked=int(value.get("checkpoints_checked", 0)),
        )


@dataclass(slots=True)
class Verification:
    chains: list[ChainReport] = field(default_factory=list)
    # Chains that exist and were not checked because the verifier may not read them.
    unreadable: int = 0

    @property
    def intact(self) -> bool:
        return all(report.intact for report in self.chains)

    @property
    def checked(self) -> int:
        return sum(report.checked for report in self.chains)

    @property
    def trusted(self) -> list[ChainReport]:
        """The chains whose earlier entries were trusted from a mark, not checked now."""
        return [r for r in self.chains if r.trusted_through > 0]


def judge_mark(
    log: AuditLog, keys: KeyRing, head: ChainPoint, mark: VerificationMark
) -> ChainProblem | None:
    """What is wrong with a chain's verification mark, given the chain's head: a mark only the
    key can sign, naming an entry that must still be there, unchanged."""
    valid = keys.valid(
        checkpoint_message(mark.chain, mark.seq, mark.hash), mark.key_id, mark.signature
    )
    if valid is None:
        return ChainProblem(
            mark.seq,
            f"the verification mark is signed with key {mark.key_id}, which is not in the key ring",
        )
    if not valid:
        return ChainProblem(
            mark.seq, "the verification mark's signature is not valid (forged, or the wrong key)"
        )
    if mark.seq > head.seq:
        return ChainProblem(
            head.seq + 1,
            f"entries {head.seq + 1}..{mark.seq} were verified before and are gone "
            "(the chain was truncated)",
        )
    if mark.seq == 0:
        return None if mark.hash == GENESIS else ChainProblem(1, "the verification mark is bad")
    if not _still_there(log, keys, mark.chain, mark.point):
        return ChainProblem(mark.seq, "the entry verified last time has changed since (rewritten)")
    return None


def _signed(keys: KeyRing, mark: VerificationMark) -> bool:
    message = checkpoint_message(mark.chain, mark.seq, mark.hash)
    return bool(keys.valid(message, mark.key_id, mark.signature))


def _still_there(log: AuditLog, keys: KeyRing, chain: str, point: ChainPoint) -> bool:
    """The entry at `point` is there and is itself: its stored hash is `point`'s, and its
    content still hashes to it under a valid signature (an edit that kept the hash column is
    an edit)."""
    found = log.entries(chain, after_seq=point.seq - 1, limit=1)
    if not found or found[0].seq != point.seq or found[0].hash != point.hash:
        return False
    entry = found[0]
    digest = entry.computed_hash()
    return digest == entry.hash and bool(
        keys.valid(entry_message(chain, entry.seq, digest), entry.key_id, entry.signature)
    )


@dataclass(slots=True)
class _Plan:
    """One chain's verification before it walks: where it starts and what it trusts."""

    report: ChainReport
    mark: VerificationMark | None
    start: ChainPoint = START

    @property
    def to_check(self) -> int:
        return 0 if self.report.problem is not None else self.report.head.seq - self.start.seq


def _plan(log: AuditLog, keys: KeyRing, chain: str, mode: VerifyMode) -> _Plan:
    head = log.head(chain)
    mark = log.verified(chain)
    plan = _Plan(ChainReport(chain, head, 0, mode=mode), mark)
    if mode is VerifyMode.INCREMENTAL and mark is not None:
        # Resume only from a mark that holds; a bad one is a finding, never a silent restart.
        plan.report.problem = judge_mark(log, keys, head, mark)
        if plan.report.problem is None:
            plan.start = mark.point
            plan.report.resumed_from = mark.seq
            plan.report.mark_at = mark.at if mark.seq > 0 else None
    return plan


def _never() -> bool:
    return False


class _Counter:
    """Entries checked across the chains of one verification, told to `progress`."""

    def __init__(
        self, total: int, progress: Progress | None, cancelled: Callable[[], bool]
    ) -> None:
        self.done = 0
        self.total = total
        self._progress = progress
        self._cancelled = cancelled

    def add(self, entries: int) -> None:
        self.done += entries
        if self._progress is not None:
            self._progress(self.done, self.total)
        if self._cancelled():
            raise VerificationCancelled(
                f"verification cancelled after {self.done} of {self.total} entries"
            )


def _walk_plan(
    log: AuditLog,
    keys: KeyRing,
    plan: _Plan,
    expect: ChainPoint | None,
    counter: _Counter,
    page: int,
) -> ChainReport:
    report = plan.report
    if report.problem is not None:
        return report
    chain, head = report.chain, report.head
    walk = ChainWalk(chain, keys, plan.start)
    checkpoints = {cp.seq: cp for cp in log.checkpoints(chain, after_seq=plan.start.seq)}
    after = plan.start.seq
    while walk.problem is None:
        entries = log.entries(chain, after_seq=after, limit=page)
        if not entries:
            break
        report.checkpoints_checked += _walk(walk, entries, checkpoints)
        counter.add(len(entries))
        after = entries[-1].seq
    report.checked = walk.checked
    report.problem = walk.problem
    if walk.problem is not None:
        report.verified_to = walk.at
    if report.problem is None and walk.at != head:
        report.problem = ChainProblem(walk.at.seq + 1, "the chain ends before its head")
    if report.problem is None:
        report.problem = _beyond_head(
            walk, [cp for cp in checkpoints.values() if cp.seq > head.seq]
        )
    if report.problem is None and plan.mark is not None and report.mode is VerifyMode.FULL:
        report.problem = judge_mark(log, keys, head, plan.mark)
    if report.problem is None and expect is not None:
        report.problem = _against_expected(log, keys, chain, head, expect)
    return report


def _walk(
    walk: ChainWalk, entries: Iterable[AuditEntry], checkpoints: Mapping[int, Checkpoint]
) -> int:
    """Feed `entries` to the walk, comparing each with the checkpoint signed at its sequence;
    how many checkpoints were compared."""
    compared = 0
    for entry in entries:
        if not walk.feed(entry):
            break
        checkpoint = checkpoints.get(entry.seq)
        if checkpoint is None:
            if entry.seq % CHECKPOINT_EVERY == 0:
                # Every append that completes a thousand signs one: none here is a deletion.
                walk.problem = ChainProblem(
                    entry.seq, "the checkpoint signed at this sequence is missing (deleted)"
                )
                break
            continue
        compared += 1
        if checkpoint.hash != entry.hash:
            walk.problem = ChainProblem(
                entry.seq, "the entry differs from the checkpoint signed at this sequence"
            )
            break
        if not walk.check_point(checkpoint):
            break
    return compared


def _beyond_head(walk: ChainWalk, checkpoints: Iterable[Checkpoint]) -> ChainProblem | None:
    """A checkpoint past the head: signed, the entries it sealed are gone; else it is forged."""
    for checkpoint in sorted(checkpoints, key=lambda cp: cp.seq):
        if not walk.check_point(checkpoint):
            return walk.problem
        return ChainProblem(
            walk.at.seq + 1,
            f"a checkpoint was signed at entry {checkpoint.seq} and the chain now ends at "
            f"{walk.at.seq} (truncated)",
        )
    return None


def verify_chain(
    log: AuditLog,
    keys: KeyRing,
    chain: str,
    *,
    full: bool = False,
    expect: ChainPoint | None = None,
) -> ChainReport:
    """Check one chain: from the last signed verification mark (or the start, with `full`) to
    its head, with the checkpoints on the way and past the head; with `full`, the mark too.
    With `expect`, also that the entry at that earlier head is still there, unchanged (a
    truncated or rewritten tail)."""
    mode = VerifyMode.FULL if full else VerifyMode.INCREMENTAL
    plan = _plan(log, keys, chain, mode)
    return _walk_plan(log, keys, plan, expect, _Counter(plan.to_check, None, _never), PAGE)


def _against_expected(
    log: AuditLog, keys: KeyRing, chain: str, head: ChainPoint, expect: ChainPoint
) -> ChainProblem | None:
    if expect.seq > head.seq:
        return ChainProblem(
            head.seq + 1,
            f"the head recorded earlier is {expect.seq}, the chain now ends at {head.seq} "
            "(truncated)",
        )
    if expect.seq == 0:
        return None
    if not _still_there(log, keys, chain, expect):
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
    progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
    page: int = PAGE,
) -> Verification:
    """Verify chains (all by default); with `record`, remember how far each intact one was
    verified, so the next run resumes there. `progress` hears the entries checked so far and
    the total after each page; when `cancelled()` turns true it stops (VerificationCancelled)."""
    wanted = list(chains) if chains is not None else log.chains()
    mode = VerifyMode.FULL if full else VerifyMode.INCREMENTAL
    plans = [_plan(log, keys, chain, mode) for chain in wanted]
    counter = _Counter(sum(p.to_check for p in plans), progress, cancelled or _never)
    if progress is not None:
        progress(0, counter.total)
    result = Verification()
    for plan in plans:
        chain = plan.report.chain
        report = _walk_plan(
            log, keys, plan, None if expect is None else expect.get(chain), counter, page
        )
        result.chains.append(report)
        if record and report.intact and report.head.seq > 0:
            log.mark_verified(chain, report.head)
        elif (
            record
            and report.verified_to is not None
            and plan.mark is not None
            and report.verified_to.seq < plan.mark.seq
            and _signed(keys, plan.mark)
        ):
            # A break found below a genuine mark: the mark no longer vouches for the entries
            # it covered. Move it back to the last entry verified now, so that an incremental
            # verify after this one finds the break again instead of trusting it. (A forged
            # mark stays, and stays reported.)
            log.mark_verified(chain, report.verified_to)
    return result


def what_was_checked(result: Verification, check_all: str) -> list[str]:
    """What an intact verification checked, exactly, in sentences: how many entries and
    checkpoints now, which entries were trusted from a signed mark instead (and since when),
    how many chains were not looked at. `check_all` says how to check the trusted ones too."""
    modes = {r.mode for r in result.chains}
    checkpoints = sum(r.checkpoints_checked for r in result.chains)
    said = [
        f"{result.checked} entr{'y' if result.checked == 1 else 'ies'} checked now in "
        f"{len(result.chains)} chain(s), with {checkpoints} signed checkpoint(s): "
        "no tampering found in them"
    ]
    if VerifyMode.EXPORT in modes:
        said.append("the export was checked from each chain's start (it holds no checkpoints)")
    elif VerifyMode.FULL in modes:
        said.append(
            "every chain was checked from its start, with its checkpoints and its signed "
            "verification mark"
        )
    trusted = result.trusted
    if trusted:
        said.append(
            "not checked now, trusted from the signed mark of an earlier verification: "
            + "; ".join(
                f"{r.chain} entries 1..{r.trusted_through}"
                + ("" if r.mark_at is None else f" (mark of {iso_utc(r.mark_at)})")
                for r in trusted
            )
            + f": {check_all}"
        )
    if result.unreadable:
        said.append(f"{result.unreadable} other chain(s) not checked: you may not read them")
    return said


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


def verify_export(
    entries: Iterable[AuditEntry],
    keys: KeyRing,
    *,
    expect: Mapping[str, ChainPoint] | None = None,
) -> Verification:
    """Walk an export offline, each chain from its start. With `expect`, each chain named must
    be in the export, reach at least that sequence, and hold that entry unchanged (an export
    cut short, or rewritten from there, since the head was noted)."""
    expect = expect or {}
    walks: dict[str, ChainWalk] = {}
    seen: dict[str, str] = {}  # chain -> the hash the export holds at the expected sequence
    for entry in entries:
        walk = walks.setdefault(entry.chain, ChainWalk(entry.chain, keys))
        if walk.feed(entry):
            wanted = expect.get(entry.chain)
            if wanted is not None and wanted.seq == entry.seq:
                seen[entry.chain] = entry.hash
    result = Verification()
    for chain in sorted(walks.keys() | expect.keys()):
        walk = walks.get(chain) or ChainWalk(chain, keys)
        report = ChainReport(chain, walk.at, 0, walk.checked, walk.problem, mode=VerifyMode.EXPORT)
        wanted = expect.get(chain)
        if report.problem is None and wanted is not None:
            report.problem = _export_against_expected(walk.at, wanted, seen.get(chain))
        result.chains.append(report)
    return result


def _export_against_expected(
    end: ChainPoint, expect: ChainPoint, found: str | None
) -> ChainProblem | None:
    if expect.seq > end.seq:
        return ChainProblem(
            end.seq + 1,
            f"the head recorded earlier is {expect.seq}, the export ends at {end.seq} (truncated)",
        )
    if expect.seq > 0 and found != expect.hash:
        return ChainProblem(expect.seq, "the entry at the head recorded earlier has changed")
    return None

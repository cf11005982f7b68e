"""Every `schedule edit` option changes exactly its field, through the CLI, the control socket
and Python alike, and the audit entry shows that field before and after.

Issue 18 found `--misfire-grace` and `--catch-up-cap` answering "already is so: nothing
changed": the change test compared a spelling of the definition that left them out. One
spelling now (ScheduleSpec.to_json) serves storage, the wire, the CLI's JSON, audit entries
and change detection; this test walks every option through each front end.
"""

from __future__ import annotations

import json
import os
import pwd
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine import ManualClock, MisfireKind, MisfirePolicy, OverlapPolicy, ScheduleSpec, open_engine
from engine.domain.access import Grant, Role
from engine.domain.patch import SchedulePatch
from engine.domain.retry import RetryPolicy
from engine.domain.triggers import CronTrigger, MissingHour, RepeatedHour
from engine.service.core import definition
from tests.conftest import T0, run_cli

ME = pwd.getpwuid(os.getuid()).pw_name
FUTURE = "2099-01-01T00:00:00Z"
FUTURE_MS = 4_070_908_800_000


@dataclass(frozen=True)
class Option:
    """One edit option: its flags, the same change as a SchedulePatch, and the fields of the
    definition's JSON (dotted) it changes."""

    flags: tuple[str, ...]
    patch: SchedulePatch
    changed: tuple[str, ...]


OPTIONS = {
    "command": Option(("--command", "echo"), SchedulePatch(command="echo"), ("command",)),
    "cron": Option(("--cron", "15 4 * * *"), SchedulePatch(cron="15 4 * * *"), ("trigger",)),
    "every": Option(("--every", "5m"), SchedulePatch(every_ms=300_000), ("trigger",)),
    "every+start": Option(
        ("--every", "5m", "--start", FUTURE),
        SchedulePatch(every_ms=300_000, start_ms=FUTURE_MS),
        ("trigger",),
    ),
    "at": Option(("--at", FUTURE), SchedulePatch(at_ms=FUTURE_MS), ("trigger",)),
    "payload": Option(("--payload", '{"n": 1}'), SchedulePatch(payload={"n": 1}), ("payload.n",)),
    "tz": Option(("--tz", "Europe/Berlin"), SchedulePatch(timezone="Europe/Berlin"), ("timezone",)),
    "misfire": Option(
        ("--misfire", "skip"), SchedulePatch(misfire=MisfireKind.SKIP), ("misfire.kind",)
    ),
    "catch-up-cap": Option(
        ("--catch-up-cap", "7"), SchedulePatch(catch_up_cap=7), ("misfire.catch_up_cap",)
    ),
    "max-catch-up-age": Option(
        ("--max-catch-up-age", "2h"), SchedulePatch(max_age_ms=7_200_000), ("misfire.max_age_ms",)
    ),
    "misfire-grace": Option(
        ("--misfire-grace", "5m"), SchedulePatch(grace_ms=300_000), ("misfire.grace_ms",)
    ),
    "dst-repeated": Option(
        ("--dst-repeated", "last"), SchedulePatch(dst_repeated=RepeatedHour.LAST), ("trigger",)
    ),
    "dst-missing": Option(
        ("--dst-missing", "transition"),
        SchedulePatch(dst_missing=MissingHour.TRANSITION),
        ("trigger",),
    ),
    "overlap": Option(
        ("--overlap", "allow"), SchedulePatch(overlap=OverlapPolicy.ALLOW), ("overlap",)
    ),
    "jitter": Option(("--jitter", "30s"), SchedulePatch(jitter_ms=30_000), ("jitter_ms",)),
    "not-sensitive": Option(("--sensitive",), SchedulePatch(sensitive=True), ("sensitive",)),
    "meta-set": Option(
        ("--meta", "tier=gold"), SchedulePatch(metadata={"tier": "gold"}), ("metadata.tier",)
    ),
    "meta-remove": Option(
        ("--meta", "owner="), SchedulePatch(metadata={"owner": None}), ("metadata.owner",)
    ),
    "max-attempts": Option(
        ("--max-attempts", "9"), SchedulePatch(max_attempts=9), ("retry.max_attempts",)
    ),
    "retry-backoff": Option(
        ("--retry-backoff", "3s"), SchedulePatch(backoff_ms=3_000), ("retry.backoff_ms",)
    ),
    "retry-backoff-cap": Option(
        ("--retry-backoff-cap", "10m"),
        SchedulePatch(backoff_cap_ms=600_000),
        ("retry.backoff_cap_ms",),
    ),
    "timeout": Option(("--timeout", "45s"), SchedulePatch(timeout_ms=45_000), ("timeout_ms",)),
}

BASE = ScheduleSpec(
    "report",
    CronTrigger("0 3 * * *"),
    "noop",
    tenant="acme",
    misfire=MisfirePolicy(MisfireKind.EACH, 5, 3_600_000, 60_000),
    metadata={"owner": "ops"},
    retry=RetryPolicy(3, 2_000, 300_000),
)


def test_the_table_covers_every_edit_option() -> None:
    """A new `edit` option (or SchedulePatch field) must join the table above."""
    help_text = run_cli("schedule", "edit", "--help", env={"COLUMNS": "200"}).stdout
    flags = {word for word in help_text.split() if word.startswith("--")}
    flags -= {"--help", "--json", "--tenant", "--expect-version", "--not-sensitive"}
    covered = {flag for option in OPTIONS.values() for flag in option.flags if flag[:2] == "--"}
    assert flags <= covered | {"--sensitive"}, flags - covered
    patched = {field for option in OPTIONS.values() for field in option.patch.given()}
    assert patched == set(SchedulePatch().__dataclass_fields__)


def _seed(db: Path) -> None:
    with open_engine(db, clock=ManualClock(T0)) as engine:
        engine.service.create(BASE, actor="setup")
        engine.storage.operators.grant(Grant(ME, Role.OPERATOR, "acme"), by="setup", at=T0)
        engine.storage.operators.grant(Grant("boss", Role.ADMIN), by="setup", at=T0)


def _definition_of(db: Path) -> dict[str, Any]:
    with open_engine(db, create=False) as engine:
        return definition(engine.service.get("report", tenant="acme"))


def _last_update(db: Path) -> dict[str, Any]:
    with open_engine(db, create=False) as engine:
        entries = engine.storage.audit.entries("tenant:acme", after_seq=0, limit=1000)
    (update,) = [e for e in entries if e.event == "schedule.updated"]
    return dict(update.data)


def _assert_exactly(before: dict[str, Any], after: dict[str, Any], fields: tuple[str, ...]) -> None:
    top = {f.split(".")[0] for f in fields}
    for key, value in before.items():
        if key in top:
            assert value != after[key], key
        else:
            assert value == after[key], key


@pytest.mark.parametrize("option", list(OPTIONS.values()), ids=list(OPTIONS))
def test_the_cli_changes_exactly_that_field_and_audits_it(tmp_path: Path, option: Option) -> None:
    db = tmp_path / "v.db"
    _seed(db)
    before = _definition_of(db)
    done = run_cli("schedule", "edit", "report", "--tenant", "acme", *option.flags, db=db)
    if option.patch.sensitive:  # making a schedule sensitive waits for a second operator
        assert done.code == 6, done
        assert "approval" in done.stderr
        return
    assert done.code == 0, done
    assert "nothing changed" not in done.stderr
    after = _definition_of(db)
    _assert_exactly(before, after, option.changed)
    entry = _last_update(db)
    assert entry["before"] == before
    assert entry["definition"] == after
    # The entry names what changed: these fields, and for a new trigger its parts.
    assert {c.split(".")[0] for c in entry["changed"]} == {c.split(".")[0] for c in option.changed}
    assert set(option.changed) <= set(entry["changed"]) or option.changed == ("trigger",)
    again = run_cli("schedule", "edit", "report", "--tenant", "acme", *option.flags, db=db)
    if option.flags[0] not in ("--every", "--at"):  # a new interval re-anchors
        assert "nothing changed" in again.stderr, again


@pytest.mark.parametrize("option", list(OPTIONS.values()), ids=list(OPTIONS))
def test_python_changes_exactly_that_field(tmp_path: Path, option: Option) -> None:
    db = tmp_path / "v.db"
    _seed(db)
    with open_engine(db, clock=ManualClock(T0)) as engine:
        before = engine.service.get("report", tenant="acme")
        after = engine.service.patch("report", option.patch, actor="op", tenant="acme")
        assert after.version == before.version + 1
        _assert_exactly(definition(before), definition(after), option.changed)
        same = engine.service.patch("report", SchedulePatch(), actor="op", tenant="acme")
        assert same.version == after.version  # nothing given: nothing changed


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    db = tmp_path / "v.db"
    _seed(db)
    with (
        tempfile.TemporaryDirectory(prefix="vt-") as where,
        open_engine(db, clock=ManualClock(T0), enforce=True) as server,
        server.serve_control(Path(where) / "c.sock") as control,
    ):
        yield db, control.path


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS.values() if not o.patch.sensitive], ids=lambda o: o.flags[0]
)
def test_the_socket_changes_exactly_that_field(served: tuple[Path, Path], option: Option) -> None:
    db, path = served
    before = _definition_of(db)
    with open_engine(db, control_socket=path) as remote:
        after = remote.service.patch("report", option.patch, actor="ignored", tenant="acme")
    _assert_exactly(before, definition(after), option.changed)
    assert _definition_of(db) == definition(after)
    assert _last_update(db)["changed"]


def test_the_socket_and_the_cli_json_spell_the_definition_as_the_audit_does(
    tmp_path: Path,
) -> None:
    db = tmp_path / "v.db"
    _seed(db)
    shown = json.loads(
        run_cli("schedule", "show", "report", "--tenant", "acme", "--json", db=db).stdout
    )
    spelled = BASE.to_json()
    for key, value in spelled.items():
        if key == "trigger":
            assert {k: v for k, v in shown[key].items() if k != "description"} == value
        else:
            assert shown[key] == value, key
    assert ScheduleSpec.from_json(spelled) == BASE


def test_the_catch_up_age_limit_is_the_domains(tmp_path: Path) -> None:
    """366 days, refused by the domain: Python, the socket and the CLI get the same answer."""
    from engine.domain.errors import InvalidInput  # noqa: PLC0415

    with pytest.raises(InvalidInput, match="1s to 366d"):
        MisfirePolicy(MisfireKind.EACH, 5, 400 * 86_400_000, 0)
    db = tmp_path / "v.db"
    _seed(db)
    refused = run_cli(
        "schedule", "edit", "report", "--tenant", "acme", "--max-catch-up-age", "400d", db=db
    )
    assert refused.code == 2, refused
    assert "400d is out of range (--max-catch-up-age)" in refused.stderr

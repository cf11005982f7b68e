"""What issue 18's second attacker found in the builder, the database parser and the patch API,
each a test: a mistake of the caller's is an InvalidInput (exit 2) naming the parameter, and
nothing is created or changed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from engine import InvalidInput, ManualClock, open_engine
from engine.control.wire import encode
from engine.domain.patch import SchedulePatch
from tests.conftest import T0, run_cli
from tests.integration.test_control_socket import raw
from tests.integration.test_edit_each_option import _definition_of, _seed, served  # noqa: F401


@pytest.mark.parametrize(
    "db", [5, None, b"x.db", "x\x00y.db", "", "   ", ":memory:", "sqlite::memory:", "a" * 300]
)
def test_a_database_that_is_no_path_or_url_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInput, match=r"database .* is refused"):
        open_engine(db)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("db", ["sqlite:a%00b.db", ":memory:", "b" * 300 + ".db"])
def test_the_cli_refuses_them_too(db: str) -> None:
    result = run_cli("--db", db, "schedule", "add", "x", "--every", "1h", "--command", "noop")
    assert result.code == 2, result
    assert "this is a bug" not in result.stderr


def test_storage_must_be_a_store(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"storage= must be an opened Storage"):
        open_engine(storage="x.db")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"grace_ms": "5m"}, "grace_ms= must be a whole number"),
        ({"max_attempts": True}, "max_attempts= must be a whole number"),
        ({"grace_ms": 2.5}, "grace_ms= must be a whole number"),
        ({"sensitive": "yes"}, "sensitive= must be True or False"),
        ({"misfire": "often"}, "misfire= is 'often'"),
        ({"metadata": {"team": 5}}, "metadata= must map text keys to text"),
    ],
)
def test_a_patch_of_the_wrong_types_is_refused_by_name(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        SchedulePatch(**fields)


def test_an_enum_given_as_its_text_is_taken() -> None:
    assert SchedulePatch(misfire="each").misfire == "each"  # type: ignore[arg-type]


def test_patch_wants_a_patch_and_an_actor(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    _seed(db)
    before = _definition_of(db)
    with open_engine(db, clock=ManualClock(T0)) as engine:
        with pytest.raises(InvalidInput, match="changes= must be a SchedulePatch"):
            engine.service.patch("report", None, actor="op", tenant="acme")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="actor= must name who"):
            engine.service.patch("report", SchedulePatch(jitter_ms=1), actor="", tenant="acme")
    assert _definition_of(db) == before


def test_a_request_naming_an_actor_is_refused(served: tuple[Path, Path]) -> None:  # noqa: F811
    db, path = served
    before = _definition_of(db)
    forged = {
        "v": 1,
        "op": "patch",
        "args": {"name": "report", "tenant": "acme", "changes": {"jitter_ms": 5000}},
        "actor": "alice",
    }
    (answer,) = raw(path, encode(forged))
    assert answer["ok"] is False
    assert "'actor'" in str(answer["error"])
    assert _definition_of(db) == before

"""What issue 18's attacker found in edits and the control socket, each a test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.control.wire import encode
from tests.conftest import run_cli
from tests.integration.test_control_socket import raw
from tests.integration.test_edit_each_option import _definition_of, _seed, served  # noqa: F401


def _edit(db: Path, *flags: str) -> tuple[int, str]:
    done = run_cli("schedule", "edit", "report", "--tenant", "acme", *flags, db=db)
    return done.code, done.stderr


@pytest.mark.parametrize(
    ("first", "then"),
    [('{"x": 1}', '{"x": true}'), ('{"x": 0}', '{"x": false}'), ('{"x": [1]}', '{"x": [1.0]}')],
)
def test_a_payload_of_another_json_type_is_a_change(tmp_path: Path, first: str, then: str) -> None:
    """Python's 1 == True == 1.0 made these 'nothing changed' and kept the old payload."""
    db = tmp_path / "v.db"
    _seed(db)
    assert _edit(db, "--payload", first)[0] == 0
    code, said = _edit(db, "--payload", then)
    assert code == 0, said
    assert "nothing changed" not in said
    assert json.dumps(_definition_of(db)["payload"]) == json.dumps(json.loads(then))


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--cron", "* * * * *", "--every", "30s"), ("--cron", "--every")),
        (("--max-catch-up-age", "400d"), ("--max-catch-up-age", "366d")),
        (("--misfire-grace", "400d"), ("--misfire-grace", "366d")),
        (("--retry-backoff", "10m"), ("--retry-backoff", "--retry-backoff-cap")),
        (("--jitter", "2h"), ("2h is out of range (--jitter)", "0 to 1h")),
        (("--expect-version", "-1", "--jitter", "1s"), ("--expect-version", "from 1")),
    ],
)
def test_a_refusal_names_the_flags_and_changes_nothing(
    tmp_path: Path, flags: tuple[str, ...], words: tuple[str, ...]
) -> None:
    db = tmp_path / "v.db"
    _seed(db)
    before = _definition_of(db)
    code, said = _edit(db, *flags)
    assert code == 2, said
    for word in words:
        assert word in said, said
    assert "_ms=" not in said
    assert "every_ms" not in said
    assert _definition_of(db) == before


def test_an_invalid_tenant_or_name_is_a_mistake_not_an_absence(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    _seed(db)
    bad_tenant = run_cli("schedule", "edit", "report", "--tenant", "BAD", "--jitter", "1s", db=db)
    assert bad_tenant.code == 2, bad_tenant
    assert "tenant" in bad_tenant.stderr
    bad_name = run_cli("schedule", "show", "Report!", "--tenant", "acme", db=db)
    assert bad_name.code == 2, bad_name


def test_the_socket_refuses_unknown_fields_and_an_odd_version(served: tuple[Path, Path]) -> None:  # noqa: F811
    db, path = served
    before = _definition_of(db)
    asks = [
        {
            "v": 1,
            "op": "patch",
            "args": {"name": "report", "tenant": "acme", "changes": {"jitter": "5s"}},
        },
        {
            "v": 1,
            "op": "patch",
            "args": {"name": "report", "tenant": "acme", "changes": {"bogus": 1}},
        },
        {"v": True, "op": "hello"},
        {"v": 1.0, "op": "hello"},
    ]
    for ask in asks:
        (answer,) = raw(path, encode(ask))
        assert answer["ok"] is False, ask
    spec = {**_spec_json(), "colour": "red"}
    (answer,) = raw(path, encode({"v": 1, "op": "create", "args": {"spec": spec}}))
    assert answer["ok"] is False
    error = answer["error"]
    assert isinstance(error, dict)
    assert "'colour'" in str(error["message"])
    interval = {
        **_spec_json(),
        "name": "odd",
        "trigger": {"kind": "interval", "every_ms": 60_000, "anchor_ms": 0, "dst_repeated": "both"},
    }
    (answer,) = raw(path, encode({"v": 1, "op": "create", "args": {"spec": interval}}))
    assert answer["ok"] is False
    assert "dst_repeated" in str(answer["error"])
    assert _definition_of(db) == before


def _spec_json() -> dict[str, object]:
    from tests.integration.test_edit_each_option import BASE  # noqa: PLC0415

    return {**BASE.to_json(), "name": "other"}

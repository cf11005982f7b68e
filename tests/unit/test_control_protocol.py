"""The control protocol's table keeps step with the service: every change verb of
ScheduleService is declared once (engine.control.protocol.VERBS), every read is served by the
client, and anything else is local only and raises through the socket instead of running in
the operator's process."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from engine import ManualClock, builtin_commands
from engine.control.client import ControlClient, RemoteService
from engine.control.protocol import LOCAL_ONLY, VERBS, NotRemote, request_args
from engine.control.server import OPERATIONS
from engine.domain.errors import InvalidInput
from engine.service import ScheduleService
from tests.conftest import T0


def _public(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


def test_every_service_method_is_a_verb_a_served_read_or_local_only() -> None:
    served = {name for name in vars(RemoteService) if not name.startswith("_")}
    unclassified = _public(ScheduleService) - set(VERBS) - served - set(LOCAL_ONLY)
    assert not unclassified, f"declare these in engine.control.protocol: {sorted(unclassified)}"


def test_every_verb_is_a_service_method_and_a_server_operation() -> None:
    for name, verb in VERBS.items():
        assert name in _public(ScheduleService), name
        assert name in OPERATIONS, name
        assert verb.result() is not None or name == "revoke_role"
        for param in verb.params():
            assert param.name != "actor"  # the server says who asks, never the request


def test_nothing_is_both_a_verb_and_local_only() -> None:
    assert not set(VERBS) & set(LOCAL_ONLY)
    assert not set(vars(RemoteService)) & set(LOCAL_ONLY)


@pytest.mark.parametrize("name", sorted(LOCAL_ONLY))
def test_a_local_only_call_through_the_socket_raises_and_sends_nothing(
    tmp_path: Path, name: str
) -> None:
    nowhere = ControlClient(tmp_path / "no-server.sock")
    remote = RemoteService(nowhere, ManualClock(T0), builtin_commands())
    with pytest.raises(NotRemote, match="not available through the control socket"):
        getattr(remote, name)


def test_an_unknown_attribute_is_an_attribute_error_not_a_call(tmp_path: Path) -> None:
    remote = RemoteService(ControlClient(tmp_path / "x.sock"), ManualClock(T0), builtin_commands())
    with pytest.raises(AttributeError):
        remote.no_such_thing  # noqa: B018


def test_a_request_is_checked_against_the_verbs_own_parameters() -> None:
    with pytest.raises(InvalidInput, match="'colour' is not an argument of pause"):
        request_args(VERBS["pause"], {"name": "x", "colour": "red"})
    with pytest.raises(InvalidInput, match="needs 'name'"):
        request_args(VERBS["pause"], {})
    with pytest.raises(InvalidInput, match="'note' must be text"):
        request_args(VERBS["pause"], {"name": "x", "note": 3})
    assert request_args(VERBS["pause"], {"name": "x", "tenant": "acme"}) == {
        "name": "x",
        "tenant": "acme",
    }

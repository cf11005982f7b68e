"""A command's payload schema: read from its type hints, checked against each payload.

Every refusal must name the field (or parameter) and say what is expected, because it is read
by whoever typed the payload, not by whoever wrote the command.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import Any, Literal

import pytest

from engine.commands.context import FireContext
from engine.commands.payload import PayloadSchema, schema_of
from engine.commands.registry import command_from
from engine.domain.errors import InvalidInput


def _taking(annotation: Any) -> Callable[..., None]:
    """A command with one required parameter `value` of type `annotation`."""

    def command(value: Any) -> None:
        del value

    command.__annotations__ = {"value": annotation, "return": None}
    return command


def _schema(annotation: Any) -> PayloadSchema:
    return schema_of(_taking(annotation))


def _report(
    title: str,
    pages: int,
    draft: bool = False,
    recipients: list[str] | None = None,
    *,
    fire: FireContext,
) -> None:
    del title, pages, draft, recipients, fire


def _flexible(region: str, **rest: Any) -> None:
    del region, rest


@dataclasses.dataclass
class _Point:
    x: int
    y: int


# --- reading the schema ----------------------------------------------------------------------


def test_parameters_without_a_default_are_required_and_the_others_optional() -> None:
    schema = schema_of(_report)
    assert [(f.name, f.required) for f in schema.fields] == [
        ("title", True),
        ("pages", True),
        ("draft", False),
        ("recipients", False),
    ]


def test_the_fire_context_parameter_is_injected_and_not_part_of_the_schema() -> None:
    schema = schema_of(_report)
    assert schema.context_parameter == "fire"
    assert "fire" not in [f.name for f in schema.fields]


def test_a_payload_cannot_set_the_fire_context_parameter() -> None:
    with pytest.raises(InvalidInput, match=r"unknown field\(s\) fire"):
        schema_of(_report).validate("report", {"title": "t", "pages": 1, "fire": {}})


def test_a_command_without_a_fire_context_parameter_gets_none() -> None:
    assert schema_of(_flexible).context_parameter is None


def test_keyword_arguments_allow_extra_keys() -> None:
    schema = schema_of(_flexible)
    assert schema.extra_allowed
    assert [f.name for f in schema.fields] == ["region"]


def test_the_description_lists_each_field_its_type_and_whether_it_is_optional() -> None:
    assert schema_of(_report).describe() == (
        "title: a string, pages: an integer, draft: true or false (optional), "
        "recipients: a list (each item a string) or null (optional)"
    )


def test_a_command_without_parameters_takes_no_fields() -> None:
    def nothing() -> None:
        pass

    assert schema_of(nothing).describe() == "no fields"


def test_an_unannotated_parameter_takes_any_json_value() -> None:
    def untyped(value) -> None:  # type: ignore[no-untyped-def]
        del value

    schema = schema_of(untyped)
    for value in (None, 1, "x", [1, "a"], {"k": [None]}):
        assert schema.validate("untyped", {"value": value}) == {"value": value}


# --- validating payloads ---------------------------------------------------------------------


def test_a_payload_with_every_required_field_is_accepted_as_it_is() -> None:
    payload = {"title": "weekly", "pages": 3}
    assert schema_of(_report).validate("report", payload) == payload


def test_optional_fields_may_be_given() -> None:
    payload = {"title": "weekly", "pages": 3, "draft": True, "recipients": ["ops"]}
    assert schema_of(_report).validate("report", payload) == payload


def test_an_unknown_key_is_refused_naming_it_and_what_the_command_takes() -> None:
    with pytest.raises(InvalidInput) as refused:
        schema_of(_report).validate("report", {"title": "t", "pages": 1, "colour": "red"})
    message = str(refused.value)
    assert "'report'" in message
    assert "unknown field(s) colour" in message
    assert "it takes title: a string, pages: an integer" in message


def test_every_unknown_key_is_named() -> None:
    with pytest.raises(InvalidInput, match=r"unknown field\(s\) a, b:"):
        schema_of(_report).validate("report", {"title": "t", "pages": 1, "b": 1, "a": 2})


def test_a_missing_required_key_is_refused_naming_it_and_what_the_command_takes() -> None:
    with pytest.raises(InvalidInput) as refused:
        schema_of(_report).validate("report", {"title": "t"})
    message = str(refused.value)
    assert "missing required field(s) pages" in message
    assert "it takes title: a string, pages: an integer" in message


def test_every_missing_key_is_named() -> None:
    with pytest.raises(InvalidInput, match=r"missing required field\(s\) title, pages:"):
        schema_of(_report).validate("report", {})


def test_extra_keys_are_accepted_when_the_command_takes_keyword_arguments() -> None:
    payload = {"region": "eu", "anything": [1, 2], "more": None}
    assert schema_of(_flexible).validate("flexible", payload) == payload


def test_named_fields_are_still_checked_when_extra_keys_are_allowed() -> None:
    with pytest.raises(InvalidInput, match="'region' of command 'flexible' must be a string"):
        schema_of(_flexible).validate("flexible", {"region": 1, "extra": 2})


def test_a_required_field_is_still_required_when_extra_keys_are_allowed() -> None:
    with pytest.raises(InvalidInput, match=r"missing required field\(s\) region"):
        schema_of(_flexible).validate("flexible", {"extra": 2})


ACCEPTED: list[tuple[Any, Any]] = [
    (str, ""),
    (str, "text"),
    (int, 0),
    (int, -12),
    (bool, True),
    (bool, False),
    (float, 1.5),
    (float, 2),  # an integer is a number
    (list[str], []),
    (list[str], ["a", "b"]),
    (list, [1, "a", None]),
    (dict[str, int], {}),
    (dict[str, int], {"a": 1, "b": -2}),
    (dict, {"a": [1]}),
    (list[dict[str, int]], [{"a": 1}, {}]),
    (Literal["fast", "slow"], "slow"),
    (Literal[1, 2], 2),
    (Literal[True], True),
    (int | None, None),
    (int | None, 3),
    (str | int, "x"),
    (str | int, 4),
    (Any, None),
    (Any, {"nested": [1, "two", None]}),
    (None, None),
]


@pytest.mark.parametrize(("annotation", "value"), ACCEPTED, ids=repr)
def test_a_value_of_the_annotated_type_is_accepted(annotation: Any, value: Any) -> None:
    assert _schema(annotation).validate("c", {"value": value}) == {"value": value}


REFUSED: list[tuple[Any, Any, str]] = [
    (int, True, "an integer"),
    (int, 1.5, "an integer"),
    (int, "3", "an integer"),
    (int, None, "an integer"),
    (bool, 1, "true or false"),
    (bool, "true", "true or false"),
    (float, True, "a number"),
    (float, "1.5", "a number"),
    (str, 1, "a string"),
    (str, None, "a string"),
    (list[str], "a", r"a list \(each item a string\)"),
    (list[str], ["a", 1], r"a list \(each item a string\)"),
    (list, {"a": 1}, "a list"),
    (dict[str, int], [], r"an object \(each value an integer\)"),
    (dict[str, int], {"a": "1"}, r"an object \(each value an integer\)"),
    (dict[str, int], {"a": True}, r"an object \(each value an integer\)"),
    (dict, [1], "an object"),
    (Literal["fast", "slow"], "medium", "one of 'fast', 'slow'"),
    (Literal[1, 2], True, "one of 1, 2"),
    (Literal[1, 2], 1.0, "one of 1, 2"),
    (int | None, "3", "an integer or null"),
    (str | int, 1.5, "a string or an integer"),
    (None, 0, "null"),
]


@pytest.mark.parametrize(("annotation", "value", "expected"), REFUSED, ids=repr)
def test_a_value_of_another_type_is_refused_naming_the_field_and_the_expected_type(
    annotation: Any, value: Any, expected: str
) -> None:
    with pytest.raises(
        InvalidInput, match=rf"field 'value' of command 'c' must be {expected}, not"
    ):
        _schema(annotation).validate("c", {"value": value})


def test_the_refusal_says_what_the_value_was() -> None:
    with pytest.raises(InvalidInput, match=r"must be an integer, not true/false \(True\)"):
        _schema(int).validate("c", {"value": True})


# --- annotations a JSON payload cannot carry -------------------------------------------------


@pytest.mark.parametrize(
    "annotation",
    [
        _Point,
        set[int],
        tuple[int, int],
        tuple,
        bytes,
        datetime.datetime,
        list[set[int]],
        Literal[1.5],
    ],
    ids=repr,
)
def test_an_annotation_a_payload_cannot_carry_is_refused_naming_the_parameter(
    annotation: Any,
) -> None:
    with pytest.raises(InvalidInput) as refused:
        _schema(annotation)
    message = str(refused.value)
    assert "parameter 'value'" in message
    assert "which a JSON payload cannot carry" in message
    assert "use str, int, float, bool, None, list[...], dict[str, ...], Literal[...]" in message


def test_the_refusal_names_the_function() -> None:
    with pytest.raises(InvalidInput, match=r"_taking\.<locals>\.command: parameter 'value'"):
        _schema(set[int])


def test_a_dict_with_keys_that_are_not_strings_is_refused() -> None:
    with pytest.raises(InvalidInput, match="parameter 'value': JSON object keys are always str"):
        _schema(dict[int, str])


def test_a_union_with_an_unsupported_member_is_refused() -> None:
    with pytest.raises(InvalidInput, match="parameter 'value' has type"):
        _schema(int | bytes)


def test_a_positional_only_parameter_is_refused_naming_it() -> None:
    def positional(count: int, /) -> None:
        del count

    with pytest.raises(InvalidInput, match="parameter 'count' cannot be given by name"):
        schema_of(positional)


def test_variadic_positional_arguments_are_refused_naming_them() -> None:
    def variadic(*counts: int) -> None:
        del counts

    with pytest.raises(InvalidInput, match="parameter 'counts' cannot be given by name"):
        schema_of(variadic)


def test_type_hints_that_cannot_be_resolved_are_refused_naming_the_function() -> None:
    def unresolvable(value: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
        del value

    with pytest.raises(InvalidInput, match=r"cannot read the type hints of .*unresolvable"):
        schema_of(unresolvable)


def test_an_unsupported_annotation_is_refused_when_the_command_is_made() -> None:
    def takes_a_set(values: set[int]) -> None:
        del values

    with pytest.raises(InvalidInput, match="parameter 'values' has type"):
        command_from("takes-a-set", takes_a_set)

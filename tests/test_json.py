from __future__ import annotations

from typing import Any

import pytest

from rollcap._json import as_count, as_dict, as_str, json_type_name, load_json_object


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (7, 7), (-1, None), (True, None), (2.0, None), ("3", None), (None, None)],
)
def test_as_count_takes_only_non_negative_integers(value: object, expected: int | None) -> None:
    assert as_count(value) == expected


def test_as_count_takes_an_int_subclass_that_is_not_a_bool() -> None:
    class Count(int):
        pass

    assert as_count(Count(5)) == 5


def test_as_dict_never_lets_a_lookup_raise() -> None:
    obj = {"a": 1}
    assert as_dict(obj) is obj
    values: tuple[object, ...] = (None, [], "x", 3)
    for value in values:
        assert as_dict(value) == {}


def test_as_str() -> None:
    assert as_str("x") == "x"
    assert as_str(1) is None


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, "null"),
        (True, "a boolean"),
        (1, "a number"),
        (1.5, "a number"),
        ("s", "a string"),
        ([], "an array"),
        ({}, "an object"),
        (object(), "object"),
    ],
)
def test_json_type_name(value: Any, name: str) -> None:
    assert json_type_name(value) == name


def test_load_json_object_is_none_unless_an_object() -> None:
    assert load_json_object('{"a": 1}') == {"a": 1}
    assert load_json_object(b'{"a": 1}') == {"a": 1}
    assert load_json_object("[1]") is None
    assert load_json_object("{not json") is None

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollcap._json import (
    as_count,
    as_dict,
    as_str,
    encode_in_slices,
    json_type_name,
    load_json_object,
    text_in_slices,
    text_slices,
)


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


# --- JSON in slices ---------------------------------------------------------------------------

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6)
    ),
    max_leaves=40,
)


@given(_json_values, st.integers(min_value=1, max_value=50))
def test_encode_in_slices_gives_what_one_dumps_gives(value: Any, slice_chars: int) -> None:
    encoded = orjson.dumps(encode_in_slices(value, slice_chars=slice_chars))
    assert encoded == orjson.dumps(value)


def test_encode_in_slices_cuts_a_long_string_into_slice_sized_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = orjson.dumps

    def spy(value: Any, *args: Any) -> bytes:
        out = real(value, *args)
        calls.append(len(out))
        return out

    text = 'é"\n' * 10_000
    value = {"choices": [{"message": {"content": text, "role": "assistant"}}], "n": 1}
    monkeypatch.setattr(orjson, "dumps", spy)
    fragment = encode_in_slices(value, slice_chars=1000)
    monkeypatch.setattr(orjson, "dumps", real)
    assert orjson.loads(orjson.dumps(fragment)) == value
    assert max(calls) < 2 * 1000 * 2 + 2  # a slice's worth (escaped), never the whole text


def test_encode_in_slices_refuses_what_orjson_refuses() -> None:
    with pytest.raises(TypeError):
        encode_in_slices({1: "a", "b": ["x" * 10]}, slice_chars=2)
    with pytest.raises(TypeError):
        encode_in_slices({"a": object()})


@given(st.binary(max_size=60), st.integers(min_value=1, max_value=9))
def test_text_in_slices_decodes_as_a_whole_decode_does(raw: bytes, slice_bytes: int) -> None:
    expected = orjson.dumps(raw.decode("utf-8", errors="replace"))
    assert orjson.dumps(text_in_slices(raw, slice_bytes=slice_bytes)) == expected
    assert b"".join(text_slices(bytearray(raw), slice_bytes=slice_bytes)) == expected


def test_text_in_slices_never_cuts_a_character() -> None:
    raw = "a€😀".encode() * 1000
    for slice_bytes in (4, 5, 6, 7):
        assert orjson.loads(orjson.dumps(text_in_slices(raw, slice_bytes=slice_bytes))) == (
            "a€😀" * 1000
        )

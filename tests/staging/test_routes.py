"""The nrlre1 routed-experts envelope, the legacy nested list, and route span classification."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from rollcap.staging._routes import (
    MISSING_ROUTE_SENTINEL,
    ROUTE_DTYPES,
    ROUTES_ENVELOPE,
    classify_route_span,
    decode_routed_experts,
    encode_routed_experts,
    route_shape,
)

ROWS = [[[3, 1]], [[2, 5]]]
INT16 = "nrlre1:int16:2x1x2:AwABAAIABQA="
INT8 = "nrlre1:int8:2x1x2:AwECBQ=="


def test_constants() -> None:
    assert ROUTES_ENVELOPE == "nrlre1"
    assert MISSING_ROUTE_SENTINEL == -1
    assert ROUTE_DTYPES == ("int8", "int16", "int32")


def test_spec_vectors() -> None:
    assert encode_routed_experts(ROWS) == INT16
    assert encode_routed_experts(ROWS, "int16") == INT16
    assert encode_routed_experts(ROWS, dtype="int8") == INT8
    assert decode_routed_experts(INT16) == ROWS
    assert decode_routed_experts(INT8) == ROWS
    assert route_shape(INT16) == (2, 1, 2)


def test_int32_layout_is_little_endian_token_layer_k() -> None:
    rows = [[[1, -2], [3, 4]], [[5, 6], [7, -1]], [[0, 2**31 - 1], [-(2**31), 9]]]
    value = encode_routed_experts(rows, "int32")
    prefix, dtype, shape, payload = value.split(":")
    assert (prefix, dtype, shape) == ("nrlre1", "int32", "3x2x2")
    flat = [x for token in rows for layer in token for x in layer]
    assert base64.b64decode(payload) == struct.pack("<12i", *flat)
    assert decode_routed_experts(value) == rows
    assert route_shape(value) == (3, 2, 2)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32"])
def test_round_trip_at_the_dtype_bounds(dtype: str) -> None:
    bits = {"int8": 8, "int16": 16, "int32": 32}[dtype]
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    rows = [[[low, high, MISSING_ROUTE_SENTINEL]], [[0, 1, 2]]]
    assert decode_routed_experts(encode_routed_experts(rows, dtype)) == rows
    with pytest.raises(ValueError, match=rf"rows\[0\]\[0\]\[0\] = {high + 1} is outside {dtype}"):
        encode_routed_experts([[[high + 1]]], dtype)
    with pytest.raises(ValueError, match="outside"):
        encode_routed_experts([[[low - 1]]], dtype)


@pytest.mark.parametrize(
    ("rows", "dtype", "error", "match"),
    [
        (ROWS, "int64", ValueError, "dtype must be one of int8, int16, int32"),
        (ROWS, "uint8", ValueError, "dtype"),
        ([], "int16", ValueError, "at least one token"),
        ([[]], "int16", ValueError, "at least one layer"),
        ([[[]]], "int16", ValueError, "at least one expert"),
        ([[[1, 2]], [[1, 2], [3, 4]]], "int16", ValueError, r"rows\[1\] has 2 layers"),
        ([[[1, 2]], [[1]]], "int16", ValueError, r"rows\[1\]\[0\] has 1 experts"),
        ([[[1, True]]], "int16", TypeError, r"rows\[0\]\[0\]\[1\] must be an int, not bool"),
        ([[[1.0]]], "int16", TypeError, "must be an int, not float"),
        ([[["1"]]], "int16", TypeError, "must be an int, not str"),
        (["ab"], "int16", TypeError, r"rows\[0\] must be a sequence, not str"),
        ([[7]], "int16", TypeError, r"rows\[0\]\[0\] must be a sequence, not int"),
    ],
)
def test_encode_refuses(rows: Any, dtype: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        encode_routed_experts(rows, dtype)


def test_encode_takes_any_sequences() -> None:
    assert encode_routed_experts((((3, 1),), ((2, 5),))) == INT16


def test_legacy_nested_list() -> None:
    assert decode_routed_experts([[[1, 2]], [[3, 4]]]) == [[[1, 2]], [[3, 4]]]
    assert route_shape([[[1, 2, 3], [4, 5, 6]]]) == (1, 2, 3)
    # Zero tokens: a list can say it, the envelope cannot.
    assert decode_routed_experts([]) == []
    assert route_shape([]) == (0, 0, 0)


def test_legacy_decode_is_a_copy() -> None:
    rows = [[[1, 2]]]
    decoded = decode_routed_experts(rows)
    decoded[0][0][0] = 9
    assert rows == [[[1, 2]]]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ([[[1, 2]], [[1, 2], [3, 4]]], r"routed experts\[1\] has 2 layers"),
        ([[[1, 2]], [[3]]], r"routed experts\[1\]\[0\] has 1 experts"),
        ([[]], "has no layers"),
        ([[[]]], "has no experts"),
        ([[[1, None]]], r"routed experts\[0\]\[0\]\[1\] must be an int, not NoneType"),
        ([[[True]]], "must be an int, not bool"),
        ([[[1.5]]], "must be an int, not float"),
        ([[(1, 2)]], r"routed experts\[0\]\[0\] must be a list, not tuple"),
        ([1], r"routed experts\[0\] must be a list, not int"),
    ],
)
def test_legacy_refuses(value: list[Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_routed_experts(value)
    with pytest.raises(ValueError, match=match):
        route_shape(value)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("nrlre2:int16:2x1x2:AwABAAIABQA=", "not a nrlre1 envelope"),
        ("int16:2x1x2:AwABAAIABQA=", "not a nrlre1 envelope"),
        ("nrlre1:int16:2x1x2:AwAB:AAIABQA=", "not a nrlre1 envelope"),
        ("", "not a nrlre1 envelope"),
        ("nrlre1:int64:2x1x2:AwABAAIABQA=", "dtype must be one of"),
        ("nrlre1:INT16:2x1x2:AwABAAIABQA=", "dtype must be one of"),
        ("nrlre1:int16:2x1:AwABAAIABQA=", r"shape '2x1' is not <T>x<L>x<K>"),
        ("nrlre1:int16:2x1x2x1:AwABAAIABQA=", "is not <T>x<L>x<K>"),
        ("nrlre1:int16:2x+1x2:AwABAAIABQA=", "is not <T>x<L>x<K>"),
        ("nrlre1:int16:2x-1x2:AwABAAIABQA=", "is not <T>x<L>x<K>"),
        ("nrlre1:int16:2X1X2:AwABAAIABQA=", "is not <T>x<L>x<K>"),
        ("nrlre1:int16:0x1x2:", "non-positive dimension"),
        ("nrlre1:int16:2x0x2:", "non-positive dimension"),
        ("nrlre1:int16:2x1x0:", "non-positive dimension"),
        ("nrlre1:int16:2x1x2:AwABAAIABQA", "not valid base64"),
        ("nrlre1:int16:2x1x2:AwAB AAIABQA=", "not valid base64"),
        ("nrlre1:int16:2x1x2:AwABAAIABQA-", "not valid base64"),
        ("nrlre1:int16:2x1x2:AwABAAIA", "payload has 6 bytes; 2x1x2 of int16 needs 8"),
        ("nrlre1:int16:2x1x1:AwABAAIABQA=", "payload has 8 bytes; 2x1x1 of int16 needs 4"),
        ("nrlre1:int8:2x1x2:AwABAAIABQA=", "payload has 8 bytes; 2x1x2 of int8 needs 4"),
    ],
)
def test_envelope_refuses(value: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_routed_experts(value)
    with pytest.raises(ValueError, match=match):
        route_shape(value)


@pytest.mark.parametrize("value", [None, 7, {"rows": []}, (((1,),),), b"nrlre1"])
def test_other_types_are_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="must be an nrlre1 string or a nested list"):
        decode_routed_experts(value)
    with pytest.raises(ValueError, match="must be an nrlre1 string or a nested list"):
        route_shape(value)


def test_decoded_values_are_signed() -> None:
    assert decode_routed_experts(encode_routed_experts([[[-1, -128]]], "int8")) == [[[-1, -128]]]
    assert decode_routed_experts("nrlre1:int8:1x1x2://8=") == [[[-1, -1]]]


# The observed table of the contract, plus the boundaries between its branches.
@pytest.mark.parametrize(
    ("carry", "generation", "staged", "span"),
    [
        (3, 2, 5, "full"),
        (3, 2, 2, "tail"),
        (3, 2, 4, "tail"),
        (3, 2, 1, "sentinel"),
        (3, 0, 3, "full"),
        (0, 0, 0, "sentinel"),
        (0, 2, 2, "full"),
        (3, 2, 6, "tail"),
        (3, 0, 2, "sentinel"),
        (3, 0, 4, "sentinel"),
        (3, 2, 0, "sentinel"),
    ],
)
def test_classify_route_span(carry: int, generation: int, staged: int, span: str) -> None:
    assert classify_route_span(carry, generation, staged) == span


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((-1, 3, 2), ValueError, "carry_len must be >= 0, not -1"),
        ((1, -1, 0), ValueError, "generation_len must be >= 0"),
        ((1, 1, -2), ValueError, "staged_route_len must be >= 0"),
        ((True, 1, 2), TypeError, "carry_len must be an int, not bool"),
        ((1, 1.0, 2), TypeError, "generation_len must be an int, not float"),
        ((1, 1, "2"), TypeError, "staged_route_len must be an int, not str"),
    ],
)
def test_classify_route_span_refuses(
    args: tuple[Any, Any, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        classify_route_span(*args)

"""Routed-expert rows: the ``nrlre1`` envelope and how a call's route span lines up with its ids.

A mixture-of-experts engine can report, for every token it processed, which experts each layer
routed it to: ``K`` expert ids per layer, ``L`` layers, ``T`` tokens. A staged record keeps that
report verbatim under ``extras["routed_experts"]`` (the extras digest covers the stored string,
never a decoding of it), either as the compact envelope

    ``nrlre1:<dtype>:<T>x<L>x<K>:<base64>``

(``dtype`` ``int8`` | ``int16`` | ``int32``; positive dimensions; the standard base64 of the
``T·L·K`` little-endian signed values in ``[token][layer][k]`` order), or as the legacy nested
list ``[[[int]]]`` with the same layer count and ``k`` on every token.

This module is pure: the standard library only, no other ``rollcap.staging`` module.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Sequence
from typing import Any, Final, Literal

__all__ = [
    "MISSING_ROUTE_SENTINEL",
    "ROUTES_ENVELOPE",
    "ROUTE_DTYPES",
    "RouteSpan",
    "classify_route_span",
    "decode_routed_experts",
    "encode_routed_experts",
    "route_shape",
]

ROUTES_ENVELOPE: Final = "nrlre1"
# The expert id a trainer writes for a token whose route was not staged (see classify_route_span).
MISSING_ROUTE_SENTINEL: Final = -1

# dtype name -> (struct format letter, bytes per value); always packed little-endian ("<").
_DTYPES: Final[dict[str, tuple[str, int]]] = {
    "int8": ("b", 1),
    "int16": ("h", 2),
    "int32": ("i", 4),
}
ROUTE_DTYPES: Final = tuple(_DTYPES)

RouteSpan = Literal["full", "tail", "sentinel"]

# Only plain ASCII decimal digits: int() alone would also take "+3", " 3", "3_0" and other
# scripts' digits, none of which the envelope's writer produces.
_DIM = re.compile(r"[0-9]+")


def _dtype_range(dtype: str) -> tuple[int, int]:
    bits = 8 * _DTYPES[dtype][1]
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _check_dtype(dtype: object) -> str:
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise ValueError(f"routed experts dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}")
    return dtype


def encode_routed_experts(rows: Sequence[Sequence[Sequence[int]]], dtype: str = "int16") -> str:
    """The ``nrlre1`` envelope of ``rows`` (``rows[token][layer][k]``).

    ``rows`` must hold at least one token, every token the same positive number of layers and
    every layer the same positive number of expert ids (the envelope has no way to spell an
    empty or ragged report). Each value must be an ``int`` (not a ``bool``): ``TypeError``
    otherwise; a value outside ``dtype``'s signed range, an unknown ``dtype``, or a ragged or
    empty shape raises ``ValueError``.

    >>> encode_routed_experts([[[3, 1]], [[2, 5]]])
    'nrlre1:int16:2x1x2:AwABAAIABQA='
    """
    _check_dtype(dtype)
    low, high = _dtype_range(dtype)
    tokens = _sequence(rows, "rows")
    if not tokens:
        raise ValueError("routed experts need at least one token (the envelope's T must be > 0)")
    layers = width = -1
    flat: list[int] = []
    for t, token in enumerate(tokens):
        token_layers = _sequence(token, f"rows[{t}]")
        if layers == -1:
            layers = len(token_layers)
            if layers == 0:
                raise ValueError("routed experts need at least one layer (L must be > 0)")
        elif len(token_layers) != layers:
            raise ValueError(f"rows[{t}] has {len(token_layers)} layers, rows[0] has {layers}")
        for layer_index, layer in enumerate(token_layers):
            experts = _sequence(layer, f"rows[{t}][{layer_index}]")
            if width == -1:
                width = len(experts)
                if width == 0:
                    raise ValueError("routed experts need at least one expert per layer (K > 0)")
            elif len(experts) != width:
                raise ValueError(
                    f"rows[{t}][{layer_index}] has {len(experts)} experts, rows[0][0] has {width}"
                )
            for k, value in enumerate(experts):
                if not isinstance(value, int) or isinstance(value, bool):
                    raise TypeError(
                        f"rows[{t}][{layer_index}][{k}] must be an int, not {type(value).__name__}"
                    )
                if not low <= value <= high:
                    raise ValueError(
                        f"rows[{t}][{layer_index}][{k}] = {value} is outside {dtype}'s range "
                        f"[{low}, {high}]"
                    )
                flat.append(value)
    letter, _ = _DTYPES[dtype]
    payload = struct.pack(f"<{len(flat)}{letter}", *flat)
    encoded = base64.b64encode(payload).decode("ascii")
    return f"{ROUTES_ENVELOPE}:{dtype}:{len(tokens)}x{layers}x{width}:{encoded}"


def _sequence(value: object, where: str) -> Sequence[object]:
    # A str is a Sequence too; accepting it would read each character as a layer or an expert.
    if not isinstance(value, Sequence) or isinstance(value, str | bytes | bytearray):
        raise TypeError(f"{where} must be a sequence, not {type(value).__name__}")
    return value


def _parse_envelope(value: str) -> tuple[str, int, int, int, bytes]:
    parts = value.split(":")
    if len(parts) != 4 or parts[0] != ROUTES_ENVELOPE:
        raise ValueError(
            f"routed experts string is not a {ROUTES_ENVELOPE} envelope "
            f"('{ROUTES_ENVELOPE}:<dtype>:<T>x<L>x<K>:<base64>'): {_preview(value)}"
        )
    _, dtype, shape, encoded = parts
    try:
        _check_dtype(dtype)
    except ValueError as exc:
        raise ValueError(f"routed experts envelope: {exc}") from None
    dims = shape.split("x")
    if len(dims) != 3 or not all(_DIM.fullmatch(d) for d in dims):
        raise ValueError(f"routed experts envelope shape {shape!r} is not <T>x<L>x<K>")
    t, layers, width = (int(d) for d in dims)
    if min(t, layers, width) <= 0:
        raise ValueError(f"routed experts envelope shape {shape!r} has a non-positive dimension")
    try:
        payload = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("routed experts envelope payload is not valid base64") from None
    size = _DTYPES[dtype][1]
    expected = t * layers * width * size
    if len(payload) != expected:
        raise ValueError(
            f"routed experts envelope payload has {len(payload)} bytes; {shape} of {dtype} "
            f"needs {expected}"
        )
    return dtype, t, layers, width, payload


def _preview(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "...")


def _legacy_rows(value: list[object]) -> tuple[list[list[list[int]]], tuple[int, int, int]]:
    """Check a legacy nested list; a copy of its rows and its shape (``(0, 0, 0)`` if empty)."""
    rows: list[list[list[int]]] = []
    layers = width = -1
    for t, token in enumerate(value):
        if not isinstance(token, list):
            raise ValueError(f"routed experts[{t}] must be a list, not {type(token).__name__}")
        if layers == -1:
            layers = len(token)
            if layers == 0:
                raise ValueError("routed experts[0] has no layers")
        elif len(token) != layers:
            raise ValueError(f"routed experts[{t}] has {len(token)} layers, [0] has {layers}")
        token_rows: list[list[int]] = []
        for layer_index, layer in enumerate(token):
            where = f"routed experts[{t}][{layer_index}]"
            if not isinstance(layer, list):
                raise ValueError(f"{where} must be a list, not {type(layer).__name__}")
            if width == -1:
                width = len(layer)
                if width == 0:
                    raise ValueError("routed experts[0][0] has no experts")
            elif len(layer) != width:
                raise ValueError(f"{where} has {len(layer)} experts, [0][0] has {width}")
            experts: list[int] = []
            for k, expert in enumerate(layer):
                if not isinstance(expert, int) or isinstance(expert, bool):
                    raise ValueError(f"{where}[{k}] must be an int, not {type(expert).__name__}")
                experts.append(expert)
            token_rows.append(experts)
        rows.append(token_rows)
    if not rows:
        return rows, (0, 0, 0)
    return rows, (len(rows), layers, width)


def decode_routed_experts(value: str | list[Any]) -> list[list[list[int]]]:
    """The rows ``value[token][layer][k]`` of an ``nrlre1`` envelope or a legacy nested list.

    Any malformed value raises ``ValueError`` saying what is wrong: a string that is not the
    envelope, an unknown dtype, a shape that is not three positive decimal dimensions, a payload
    that is not strict base64 or not exactly ``T·L·K`` values of the dtype; a list that is not
    ``[[[int]]]`` with one layer count and one ``k`` throughout; any other type. (Wire data gets
    one exception type, whatever part is wrong.) A legacy ``[]`` decodes to ``[]``: a list can
    spell a report of zero tokens where the envelope cannot. The result is a new list.
    """
    if isinstance(value, str):
        dtype, t, layers, width, payload = _parse_envelope(value)
        letter, _ = _DTYPES[dtype]
        flat = struct.unpack(f"<{t * layers * width}{letter}", payload)
        per_token = layers * width
        return [
            [
                list(flat[i * per_token + j * width : i * per_token + (j + 1) * width])
                for j in range(layers)
            ]
            for i in range(t)
        ]
    if isinstance(value, list):
        return _legacy_rows(value)[0]
    raise ValueError(
        f"routed experts must be an {ROUTES_ENVELOPE} string or a nested list, "
        f"not {type(value).__name__}"
    )


def route_shape(value: str | list[Any]) -> tuple[int, int, int]:
    """``(T, L, K)`` of an envelope or legacy nested list, validated as ``decode_routed_experts``
    would (``ValueError`` on the same inputs), without unpacking the values."""
    if isinstance(value, str):
        _, t, layers, width, _ = _parse_envelope(value)
        return t, layers, width
    if isinstance(value, list):
        return _legacy_rows(value)[1]
    raise ValueError(
        f"routed experts must be an {ROUTES_ENVELOPE} string or a nested list, "
        f"not {type(value).__name__}"
    )


def _length(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, not {value}")
    return value


def classify_route_span(carry_len: int, generation_len: int, staged_route_len: int) -> RouteSpan:
    """How a call's staged route rows line up with its ``carry_len + generation_len`` ids.

    - ``"full"``: one row per id of the call (``staged_route_len > 0`` and equal to
      ``carry_len + generation_len``);
    - ``"tail"``: else, when ``staged_route_len > 0`` and ``0 < generation_len <=
      staged_route_len``: the last ``generation_len`` rows are the generated ids' routes;
    - ``"sentinel"``: otherwise no row can be attributed; fill with ``MISSING_ROUTE_SENTINEL``.

    Each argument must be an int >= 0 (``TypeError`` / ``ValueError``): a negative length can
    only come from a caller's arithmetic error, and would otherwise classify by accident.
    """
    carry = _length(carry_len, "carry_len")
    generation = _length(generation_len, "generation_len")
    staged = _length(staged_route_len, "staged_route_len")
    if staged > 0 and staged == carry + generation:
        return "full"
    if staged > 0 and 0 < generation <= staged:
        return "tail"
    return "sentinel"

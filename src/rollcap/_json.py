"""Reading parsed JSON that may be any shape, and writing big JSON in slices (pure).

Provider answers, client requests and files written by other tools are read leniently: a value of
the wrong type reads as "absent" instead of raising, so one odd field never loses the rest.

``encode_in_slices`` and ``text_in_slices`` write a value or a text of any size as JSON in calls
that each cover a bounded slice of it. orjson holds the interpreter lock for the whole of one
call, so one call on a record of hundreds of megabytes would stop every other thread, the event
loop's included, until it is done; between two slices another thread can run. Their result is an
``orjson.Fragment``, which a later ``orjson.dumps`` copies in as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

__all__ = [
    "SLICE_CHARS",
    "as_count",
    "as_dict",
    "as_str",
    "encode_in_slices",
    "json_type_name",
    "load_json_object",
    "text_in_slices",
    "text_slices",
]

# One slice: about a millisecond of encoding or decoding.
SLICE_CHARS = 1 << 20
# Containers nested deeper than this are encoded in one call: deep values are small in practice,
# and walking them would only risk the recursion limit.
_MAX_DEPTH = 32
# Strings up to this long count as small values (encoded with their neighbours in one call).
_SMALL_STR = 4096
_SCALARS = (int, float, bool, type(None))


def as_count(value: object) -> int | None:
    """A provider-reported count: an int >= 0 (a bool or float is not a count), else ``None``."""
    if type(value) is int:  # what parsed JSON holds: one check, not two (a hot path)
        return value if value >= 0 else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def as_dict(value: object) -> Mapping[str, Any]:
    """``value`` when it is a JSON object, else an empty mapping (so lookups never raise)."""
    if type(value) is dict:  # what parsed JSON holds; a Mapping check costs ten times more
        return value
    return value if isinstance(value, Mapping) else {}


def as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def json_type_name(value: object) -> str:
    """The JSON name of a parsed value's type, for error messages a client can act on."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def load_json_object(text: str | bytes) -> dict[str, Any] | None:
    """Parse a JSON text; ``None`` unless it is a JSON object."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def encode_in_slices(value: Any, *, slice_chars: int = SLICE_CHARS) -> orjson.Fragment:
    """``value`` (parsed JSON: dicts with string keys, lists, strings, numbers, bools, None) as
    the JSON ``orjson.dumps`` gives, in calls that each cover one long string's slice, one
    container of small values, or one run of small list items (``TypeError`` as orjson's)."""
    out: list[bytes] = []
    _encode(value, out, slice_chars, 0)
    return orjson.Fragment(b"".join(out))


def _is_small(value: object) -> bool:
    return isinstance(value, _SCALARS) or (isinstance(value, str) and len(value) <= _SMALL_STR)


def _encode(value: Any, out: list[bytes], slice_chars: int, depth: int) -> None:
    dumps = orjson.dumps
    if isinstance(value, str):
        if len(value) <= slice_chars:
            out.append(dumps(value))
            return
        out.append(b'"')
        for start in range(0, len(value), slice_chars):
            out.append(dumps(value[start : start + slice_chars])[1:-1])
        out.append(b'"')
        return
    if depth >= _MAX_DEPTH or not isinstance(value, dict | list):
        out.append(dumps(value))
        return
    if isinstance(value, dict):
        if all(_is_small(item) for item in value.values()):
            out.append(dumps(value))
            return
        out.append(b"{")
        for n, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise TypeError(f"Dict key must be str, not {type(key).__name__}")
            if n:
                out.append(b",")
            out.append(dumps(key))
            out.append(b":")
            _encode(item, out, slice_chars, depth + 1)
        out.append(b"}")
        return
    out.append(b"[")
    n = 0
    size = len(value)
    while n < size:
        # A run of small items goes in one call (at most a slice's worth of them).
        end = n
        while end < size and end - n < slice_chars // 64 and _is_small(value[end]):
            end += 1
        if end > n:
            out.append(dumps(value[n:end])[1:-1])
        else:
            _encode(value[n], out, slice_chars, depth + 1)
            end = n + 1
        if end < size:
            out.append(b",")
        n = end
    out.append(b"]")


def text_in_slices(raw: bytes | bytearray, *, slice_bytes: int = SLICE_CHARS) -> orjson.Fragment:
    """``raw`` decoded as UTF-8 (invalid bytes replaced, as ``decode(errors="replace")`` does)
    and encoded as one JSON string, a slice at a time (see ``text_slices``)."""
    return orjson.Fragment(b"".join(text_slices(raw, slice_bytes=slice_bytes)))


def text_slices(raw: bytes | bytearray, *, slice_bytes: int = SLICE_CHARS) -> Iterator[bytes]:
    """The pieces of ``text_in_slices``'s JSON string, quotes included, one slice at a time.

    A slice ends before a character's first byte, never inside a character, so the text is the
    one decoding ``raw`` whole gives.
    """
    view = memoryview(raw)
    step = max(slice_bytes, 4)  # longer than a character: a slice is never empty
    yield b'"'
    pos, size = 0, len(raw)
    while pos < size:
        end = min(pos + step, size)
        if end < size:
            back = 0
            while back < 3 and raw[end - back] & 0xC0 == 0x80:  # a continuation byte
                back += 1
            if raw[end - back] & 0xC0 != 0x80:
                end -= back  # else a run of stray continuation bytes, each replaced on its own
        yield orjson.dumps(str(view[pos:end], "utf-8", "replace"))[1:-1]
        pos = end
    view.release()
    yield b'"'

"""Reading parsed JSON that may be any shape (pure).

Provider answers, client requests and files written by other tools are read leniently: a value of
the wrong type reads as "absent" instead of raising, so one odd field never loses the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["as_count", "as_dict", "as_str", "json_type_name", "load_json_object"]


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

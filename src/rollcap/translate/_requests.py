"""Request validation helpers and the fields both request translators treat alike (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollcap._json import json_type_name
from rollcap.translate._common import fail

__all__ = [
    "VLLM_PASSTHROUGH",
    "apply_stream",
    "copy_passthrough",
    "opt_bool",
    "opt_count",
    "opt_number",
    "opt_str",
    "req_list",
    "req_mapping",
    "req_str",
]

# vLLM sampling and template fields that neither client API defines but a vLLM client may send
# anyway (an RL harness setting ``top_k`` or ``chat_template_kwargs`` on a Responses call). They are
# copied verbatim, for the upstream to validate; every other unknown field is ignored.
VLLM_PASSTHROUGH = (
    "chat_template_kwargs",
    "frequency_penalty",
    "min_p",
    "presence_penalty",
    "repetition_penalty",
    "seed",
    "top_k",
)


def req_mapping(value: object, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        fail(name, f"expected an object, got {json_type_name(value)}")
    return value


def req_list(value: object, name: str) -> list[Any]:
    if not isinstance(value, list):
        fail(name, f"expected an array, got {json_type_name(value)}")
    return value


def req_str(value: object, name: str) -> str:
    if not isinstance(value, str):
        fail(name, f"expected a string, got {json_type_name(value)}")
    return value


def opt_str(request: Mapping[str, Any], key: str, name: str | None = None) -> str | None:
    value = request.get(key)
    return None if value is None else req_str(value, name or key)


def opt_bool(request: Mapping[str, Any], key: str, name: str | None = None) -> bool | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        fail(name or key, f"expected a boolean, got {json_type_name(value)}")
    return value


def opt_number(request: Mapping[str, Any], key: str) -> float | int | None:
    value = request.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        fail(key, f"expected a number, got {json_type_name(value)}")
    return value


def opt_count(request: Mapping[str, Any], key: str, *, minimum: int = 0) -> int | None:
    value = request.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(key, f"expected an integer >= {minimum}, got {value!r}")
    return value


def apply_stream(request: Mapping[str, Any], chat: dict[str, Any]) -> None:
    if opt_bool(request, "stream"):
        chat["stream"] = True
        # Without it vLLM reports no usage on a stream, and the translation would have none.
        chat["stream_options"] = {"include_usage": True}


def copy_passthrough(request: Mapping[str, Any], chat: dict[str, Any]) -> None:
    for key in VLLM_PASSTHROUGH:
        if request.get(key) is not None:
            chat[key] = request[key]

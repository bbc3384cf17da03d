"""SSE event builders for the three dialects, and the output items both directions share (pure).

The streamed translators, the renderer and the non-streamed translators all build items here, so
an item streamed piece by piece ends as the very dict the non-streamed translation holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollcap._json import as_count, as_str
from rollcap.sse import SSEEvent
from rollcap.translate._common import dumps

__all__ = [
    "ANTHROPIC_ERROR_TYPES",
    "THINKING_SIGNATURE",
    "ResponsesEvents",
    "chat_event",
    "function_call_item",
    "message_item",
    "messages_error",
    "messages_event",
    "output_text_part",
    "reasoning_item",
    "refusal_part",
    "responses_error_fields",
]

# What a translated thinking block carries as its signature. vLLM signs nothing; the value only
# marks the block as made by this translator. It is ignored when the block comes back in a request.
THINKING_SIGNATURE = "rollcap-translated-unsigned"


# --- Responses items -----------------------------------------------------------------------------


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def refusal_part(text: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": text}


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


def message_item(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "content": parts,
        "role": "assistant",
    }


def function_call_item(
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    status: str,
    namespace: str | None = None,
) -> dict[str, Any]:
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }
    if namespace is not None:
        # Left out, not null, for a plain function, so its item stays what it was before
        # namespaces existed (the captured and the rendered items alike).
        item["namespace"] = namespace
    return item


# --- event builders ------------------------------------------------------------------------------


class ResponsesEvents:
    """Builds Responses stream events, numbering them with a running ``sequence_number``."""

    __slots__ = ("_sequence",)

    def __init__(self) -> None:
        self._sequence = 0

    def __call__(self, kind: str, **fields: Any) -> SSEEvent:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return SSEEvent(data=dumps(payload), event=kind)


def responses_error_fields(error: Mapping[str, Any]) -> dict[str, Any]:
    """A chat error object as the fields of a Responses ``error`` event (code is a string there)."""
    code = error.get("code")
    if not isinstance(code, str):
        code = as_str(error.get("type")) or "server_error"
    message = as_str(error.get("message")) or "upstream error"
    return {"code": code, "message": message, "param": as_str(error.get("param"))}


def messages_event(kind: str, **fields: Any) -> SSEEvent:
    return SSEEvent(data=dumps({"type": kind, **fields}), event=kind)


# Anthropic's error type for an HTTP-like status, wherever an error is handed to a Messages client.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def messages_error(error: Mapping[str, Any]) -> SSEEvent:
    """A chat error object as an Anthropic ``error`` event; the HTTP-like code picks the type."""
    code: object = error.get("code")
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    kind = ANTHROPIC_ERROR_TYPES.get(as_count(code) or 0, "api_error")
    message = as_str(error.get("message")) or "upstream error"
    return messages_event("error", error={"type": kind, "message": message})


def chat_event(payload: Mapping[str, Any] | str) -> SSEEvent:
    return SSEEvent(data=payload if isinstance(payload, str) else dumps(payload))

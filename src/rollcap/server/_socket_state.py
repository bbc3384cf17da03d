"""What a Responses WebSocket remembers when the model server answers it itself (pure).

A translated model server (``vllm_model``, ``local_model``) has an upstream that speaks Chat
Completions only, and no socket: it holds each socket's state as the provider would. A turn
that names ``previous_response_id`` sends only its new input items; ``SocketState.expand``
makes it the whole request, the stored input and output of that response, then the new input,
so that one complete Chat Completions call answers it. ``instructions`` and ``tools`` are the
turn's own: the API carries neither forward. ``remember`` keeps a finished response for later
turns, at most ``max_responses`` of them (the oldest is let go; a turn naming it then gets
``previous_response_not_found``, as from the provider).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PreviousResponseNotFound", "SocketState", "prepared_response"]


class PreviousResponseNotFound(LookupError):
    """A turn continues a response this socket does not hold (never, or no longer)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Previous response with id '{response_id}' not found.")
        self.response_id = response_id


def _items(value: object) -> list[Any]:
    """A create body's ``input`` as items: a string is one user message."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return list(value)
    raise ValueError("'input' must be a string or a list of items")


class SocketState:
    """One socket's finished responses, by id, oldest first."""

    def __init__(self, max_responses: int) -> None:
        if max_responses < 1:
            raise ValueError(f"max_responses must be at least 1, not {max_responses}")
        self.max_responses = max_responses
        self._responses: OrderedDict[str, tuple[list[Any], list[Any]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    def expand(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The whole request a turn stands for: without ``previous_response_id``, its input
        after the named response's input and output. ``PreviousResponseNotFound`` for an id
        this socket does not hold; ``ValueError`` for an input or id of the wrong type."""
        full = dict(body)
        previous = full.pop("previous_response_id", None)
        if previous is None:
            return full
        if not isinstance(previous, str):
            raise ValueError("'previous_response_id' must be a string")
        stored = self._responses.get(previous)
        if stored is None:
            raise PreviousResponseNotFound(previous)
        before, output = stored
        full["input"] = [*before, *output, *_items(full.get("input"))]
        return full

    def remember(self, response_id: str, request: Mapping[str, Any], output: Sequence[Any]) -> None:
        """Keep a finished response: ``request`` is the whole request it answered (``expand``'s),
        ``output`` its output items."""
        self._responses.pop(response_id, None)
        self._responses[response_id] = (_items(request.get("input")), list(output))
        while len(self._responses) > self.max_responses:
            self._responses.popitem(last=False)


def prepared_response(
    response_id: str, request: Mapping[str, Any], created_at: float
) -> dict[str, Any]:
    """The response a ``generate: false`` turn is answered with: completed, with no output and
    no tokens, its request's model and settings echoed as an answer's are."""
    echoed = ("instructions", "tools", "tool_choice", "metadata", "store", "temperature", "top_p")
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(created_at),
        "status": "completed",
        "model": request.get("model"),
        "output": [],
        **{key: request[key] for key in echoed if key in request},
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }

"""The three model APIs rollcap speaks, one module each, behind one small registry (pure).

``get_dialect(name)`` gives a ``Dialect``: the module's ``normalize`` and ``usage``, its
terminal-event test, a factory for its stream reassembler and its error body.
``reassemble(name, chunks)`` runs raw SSE bytes through the decoder and the reassembler in one go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rollcap.dialects import chat, messages, responses
from rollcap.dialects._base import (
    Normalized,
    Reassembly,
    StreamOutcome,
    StreamReassembler,
    ToolCall,
    Usage,
    context_length_exceeded,
    error_message,
    openai_error,
)
from rollcap.sse import SSEDecoder, SSEEvent

__all__ = [
    "DIALECT_NAMES",
    "Dialect",
    "Normalized",
    "Reassembly",
    "StreamOutcome",
    "StreamReassembler",
    "ToolCall",
    "Usage",
    "context_length_exceeded",
    "error_message",
    "get_dialect",
    "openai_error",
    "reassemble",
]


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    normalize: Callable[[Mapping[str, Any]], Normalized]
    usage: Callable[[Mapping[str, Any]], Usage]
    is_terminal_event: Callable[[SSEEvent], bool]
    new_reassembler: Callable[[], StreamReassembler]
    error_body: Callable[[str, str], dict[str, Any]]


_DIALECTS = {
    module.NAME: Dialect(
        name=module.NAME,
        normalize=module.normalize,
        usage=module.usage,
        is_terminal_event=module.is_terminal_event,
        new_reassembler=module.StreamReassembler,
        error_body=module.error_body,
    )
    for module in (responses, chat, messages)
}
DIALECT_NAMES = tuple(_DIALECTS)


def get_dialect(name: str) -> Dialect:
    try:
        return _DIALECTS[name]
    except KeyError:
        raise ValueError(
            f"unknown dialect {name!r}: expected one of {', '.join(DIALECT_NAMES)}"
        ) from None


def reassemble(name: str, chunks: Iterable[bytes]) -> Reassembly:
    """Decode raw SSE bytes, chunked any way, and reassemble them as ``name`` streams.

    An event cut off by the end of the stream (no blank line after it) is still fed: a capture
    keeps what arrived.
    """
    decoder = SSEDecoder()
    reassembler = get_dialect(name).new_reassembler()
    for chunk in chunks:
        for event in decoder.feed(chunk):
            reassembler.feed(event)
    for event in decoder.flush(dispatch_unterminated=True):
        reassembler.feed(event)
    return reassembler.finish()

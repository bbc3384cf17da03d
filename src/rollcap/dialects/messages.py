"""Anthropic Messages: normalize a message, reassemble a ``/v1/messages`` stream (pure).

The rebuilt message is what the official ``anthropic`` SDK's stream accumulation
(``beta.messages.stream(...).get_final_message()``, the richer of its two) builds from the same
events, key for key, except where the SDK loses something the stream sent; there this keeps it
(each such place is marked *kept*). The rules, where the wire format leaves room:

- The first ``message_start`` whose ``message`` is an object gives the skeleton, every key of it;
  later ones are ignored. A ``content_block_start`` for an index already started is ignored too
  (first wins).
- A delta for an index never started is dropped: without the start its block type is unknown.
- ``text_delta`` and ``thinking_delta`` append to the block's field; ``signature_delta`` sets the
  signature, and ``compaction_delta`` the block's ``content`` and ``encrypted_content``, as the SDK
  does. ``citations_delta`` appends its citation.
- ``input_json_delta`` fragments are joined and parsed when the response is built. When no
  fragment carried text the block keeps its start ``input``. When the joined text is not JSON (a
  cut stream) ``input`` holds that text as a string (*kept*: the SDK parses what it can and drops
  the cut piece), so ``normalize`` reports it as ``{"_raw": text}``, as for the other dialects'
  argument strings.
- A delta of a type not named above appends its string fields to the block and sets the others
  (*kept*: the SDK ignores it); a named delta's keys besides its own field are set on the block
  (*kept*). Neither touches a key the block's start carried, which the SDK leaves as it is.
- ``message_delta``: ``stop_reason``, ``stop_sequence`` and ``stop_details`` are set from
  ``delta`` as sent, every other key of it (``container``, unknown ones) when not null (*kept*
  for unknown ones); its ``usage`` keys overwrite the ``message_start`` ones, except ``null``
  values, which mean "not reported" (*kept* for keys the SDK does not name).
- An event's keys besides its envelope (``type``, ``message``, ``index``, ``content_block``,
  ``delta``, ``usage``) go on what the event is about: a ``message_*`` event's on the message
  (``context_management`` and ``input_transformations`` of ``message_delta``, as the SDK copies
  them; the rest *kept*), a ``content_block_*`` event's on its block (*kept*). Null values are
  not set.
- A ``fallback`` content block's ``to.model`` becomes the message's ``model``, as the SDK relabels
  it.
- The first ``message_stop`` or ``error`` event ends the stream; events after it are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from rollcap._json import as_count, as_dict, as_str, load_json_object
from rollcap.dialects._base import (
    PIECE_OVERHEAD,
    Normalized,
    Reassembly,
    StreamOutcome,
    ToolCall,
    Usage,
    cached_count,
    parse_arguments,
    total_tokens,
)
from rollcap.sse import SSEEvent

__all__ = ["NAME", "StreamReassembler", "error_body", "is_terminal_event", "normalize", "usage"]

NAME = "messages"

_TERMINAL = ("error", "message_stop")
_TERMINAL_WORDS = (*_TERMINAL, "\\u")
_TOOL_BLOCK_TYPES = frozenset({"tool_use", "server_tool_use"})
# Delta type -> the block field its string fragments are appended to.
_TEXT_DELTAS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
}


def usage(response: Mapping[str, Any]) -> Usage:
    """Only the token counts of ``normalize``: what aggregation needs, without the rest."""
    return _usage(as_dict(as_dict(response).get("usage")))


def normalize(response: Mapping[str, Any]) -> Normalized:
    """Read a Messages API message (non-streamed or reassembled)."""
    message = as_dict(response)
    return Normalized(
        response_id=as_str(message.get("id")),
        model=as_str(message.get("model")),
        response_status=None,
        finish_reason=as_str(message.get("stop_reason")),
        usage=usage(message),
        tool_calls=_tool_calls(message.get("content")),
        reasoning_content=_reasoning(message.get("content")),
    )


def _usage(usage: Mapping[str, Any]) -> Usage:
    input_tokens = as_count(usage.get("input_tokens"))
    cache_read = as_count(usage.get("cache_read_input_tokens"))
    cache_creation = as_count(usage.get("cache_creation_input_tokens"))
    output_tokens = as_count(usage.get("output_tokens"))
    # Anthropic's input_tokens excludes cached input; the contract's tokens_in includes it. With
    # input_tokens unknown the sum would understate, so it stays unknown.
    tokens_in = None
    if input_tokens is not None:
        tokens_in = input_tokens + (cache_read or 0) + (cache_creation or 0)
    tokens_total = total_tokens(usage.get("total_tokens"), tokens_in, output_tokens)
    return Usage(
        tokens_in=tokens_in,
        tokens_out=output_tokens,
        # The contract's rule for this dialect, even where a proxy adds OpenAI-style counts.
        tokens_reasoning=None,
        tokens_total=tokens_total,
        # cache_read_input_tokens, unless the usage also carries another naming that NeMo Gym
        # reads first (a proxy's); a top-level cached_input_tokens when it has neither.
        cached_tokens=cached_count(usage),
        cache_creation_tokens=cache_creation,
    )


def _blocks(content: object) -> list[Mapping[str, Any]]:
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, Mapping)]


def _tool_calls(content: object) -> tuple[ToolCall, ...]:
    return tuple(
        ToolCall(
            call_id=as_str(block.get("id")),
            name=as_str(block.get("name")),
            arguments=parse_arguments(block.get("input")),
        )
        for block in _blocks(content)
        if block.get("type") in _TOOL_BLOCK_TYPES
    )


def _reasoning(content: object) -> str | None:
    # Empty thinking texts (e.g. omitted thinking) carry nothing and would only add blank lines.
    texts = [
        text
        for block in _blocks(content)
        if block.get("type") == "thinking" and (text := as_str(block.get("thinking")))
    ]
    return "\n".join(texts) if texts else None


def _event_kind(event: SSEEvent, data: Mapping[str, Any] | None) -> str | None:
    """The event's type; ``error`` or ``message_stop`` when either the SSE name or ``type`` says so.

    The SDKs treat an ``event: error`` frame as an error whatever its data, so the name counts.
    """
    name = as_str(getattr(event, "event", None))
    data_type = as_str(data.get("type")) if data is not None else None
    for terminal in _TERMINAL:
        if terminal in (name, data_type):
            return terminal
    return data_type if data_type is not None else name


def _length(event: SSEEvent) -> int:
    data = getattr(event, "data", None)
    return len(data) if isinstance(data, str) else 0


def _load(event: SSEEvent) -> dict[str, Any] | None:
    data = getattr(event, "data", None)
    return load_json_object(data) if isinstance(data, str) else None


def error_body(kind: str, message: str) -> dict[str, Any]:
    """An error answer as the Anthropic API sends one; ``kind`` is e.g. ``overloaded_error``."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_terminal_event(event: SSEEvent) -> bool:
    """True for ``message_stop`` and for ``error``, by SSE event name or data ``type``."""
    if as_str(getattr(event, "event", None)) in _TERMINAL:
        return True
    data = getattr(event, "data", None)
    if isinstance(data, str) and not any(word in data for word in _TERMINAL_WORDS):
        # Nearly every event: its data cannot carry a terminal ``type``, so it is not parsed
        # (a type can only be spelled without these words through \u escapes).
        return False
    return _event_kind(event, _load(event)) in _TERMINAL


# The keys of each event that are its envelope; any other key is about the message or block.
_ENVELOPES = {
    "message_start": frozenset({"type", "message"}),
    "message_delta": frozenset({"type", "delta", "usage"}),
    "message_stop": frozenset({"type"}),
    "content_block_start": frozenset({"type", "index", "content_block"}),
    "content_block_delta": frozenset({"type", "index", "delta"}),
    "content_block_stop": frozenset({"type", "index"}),
}
# message_delta.delta keys the SDK sets whatever their value; the others only when not null.
_STOP_KEYS = ("stop_reason", "stop_sequence", "stop_details")


def _beyond(payload: Mapping[str, Any], envelope: frozenset[str]) -> dict[str, Any]:
    """The event's non-null keys that are not its envelope."""
    return {k: v for k, v in payload.items() if k not in envelope and v is not None}


class _Block:
    """One content block being streamed: its start object plus the fragments since."""

    __slots__ = ("citations", "fragments", "partial_json", "set", "start")

    def __init__(self, start: Mapping[str, Any]) -> None:
        self.start = dict(start)
        self.fragments: dict[str, list[str]] = {}
        self.partial_json: list[str] = []
        self.citations: list[Any] = []
        # Keys set outright (signature, compaction content, unknown ones): the latest wins.
        self.set: dict[str, Any] = {}

    def apply(self, delta: Mapping[str, Any]) -> int | None:
        """Fold a delta in; the length of the text it kept, or ``None`` for anything else
        (which the caller counts whole)."""
        delta_type = delta.get("type")
        own: str | None = None
        kept: int | None = 0
        if delta_type == "input_json_delta":
            own = "partial_json"
            fragment = as_str(delta.get("partial_json"))
            if fragment:
                self.partial_json.append(fragment)
                kept = len(fragment)
        elif delta_type == "citations_delta":
            own = "citation"
            if "citation" in delta:
                self.citations.append(delta["citation"])
            kept = None
        elif delta_type == "signature_delta":
            own = "signature"
            if isinstance(delta.get("signature"), str):
                self.fragments.pop("signature", None)
                self.set["signature"] = delta["signature"]
            kept = None
        elif delta_type == "compaction_delta":
            for key in ("content", "encrypted_content"):
                self.set[key] = delta.get(key)
            return None
        elif isinstance(delta_type, str) and delta_type in _TEXT_DELTAS:
            own = _TEXT_DELTAS[delta_type]
            fragment = as_str(delta.get(own))
            if fragment is not None:
                self.fragments.setdefault(own, []).append(fragment)
                kept = len(fragment)
        else:
            # A delta type not known: carried onto the block, but never into a key the block
            # started with, which the SDK (and so the client) leaves as it is.
            for key, value in delta.items():
                if key == "type" or key in self.start:
                    continue
                if isinstance(value, str):
                    self.set.pop(key, None)
                    self.fragments.setdefault(key, []).append(value)
                else:
                    self.set[key] = value
            return None
        if len(delta) > 2:
            for key, value in delta.items():
                if key not in ("type", own) and key not in self.start and value is not None:
                    self.set[key] = value
            return None
        return kept

    def build(self) -> dict[str, Any]:
        block = dict(self.start)
        for key, parts in self.fragments.items():
            block[key] = (as_str(block.get(key)) or "") + "".join(parts)
        block.update(self.set)
        if self.citations:
            existing = block.get("citations")
            block["citations"] = [
                *(existing if isinstance(existing, list) else ()),
                *self.citations,
            ]
        if self.partial_json:
            text = "".join(self.partial_json)
            try:
                block["input"] = orjson.loads(text)
            except orjson.JSONDecodeError:
                block["input"] = text
        return block


class StreamReassembler:
    """Rebuilds the message a non-streaming call would have returned from its SSE events.

    ``size``: a text or JSON fragment counts its text, any other event its data (see
    ``dialects._base.StreamReassembler``).
    """

    __slots__ = (
        "_blocks",
        "_delta",
        "_delta_usage",
        "_error",
        "_message_extra",
        "_outcome",
        "_seen",
        "_skeleton",
        "size",
    )

    def __init__(self) -> None:
        self.size = 0
        self._skeleton: dict[str, Any] | None = None
        self._blocks: dict[int, _Block] = {}
        self._delta: dict[str, Any] = {}
        self._delta_usage: dict[str, Any] = {}
        # Keys of message_* events beyond their envelope, for the message.
        self._message_extra: dict[str, Any] = {}
        self._seen = False
        self._outcome = StreamOutcome.TRUNCATED
        self._error: dict[str, Any] | None = None

    def feed(self, event: SSEEvent) -> None:
        if self._outcome is not StreamOutcome.TRUNCATED:
            return
        data = _load(event)
        kind = _event_kind(event, data)
        payload: Mapping[str, Any] = data if data is not None else {}
        if kind == "content_block_delta":
            kept = self._block_delta(payload)
            if len(payload) > 3:
                kept = None
                self._beyond_block(payload, kind)
            self.size += PIECE_OVERHEAD + (_length(event) if kept is None else kept)
            return
        self.size += PIECE_OVERHEAD + _length(event)
        envelope = _ENVELOPES.get(kind) if kind is not None else None
        if kind is not None and envelope is not None and not envelope.issuperset(payload):
            if kind.startswith("content_block"):
                self._beyond_block(payload, kind)
            elif kind != "message_start" or self._skeleton is None:
                self._message_extra.update(_beyond(payload, envelope))
        if kind == "message_stop":
            self._outcome = StreamOutcome.COMPLETED
        elif kind == "error":
            self._outcome = StreamOutcome.ERROR
            error = payload.get("error")
            self._error = dict(error) if isinstance(error, Mapping) else None
        elif kind == "message_start":
            self._message_start(payload)
        elif kind == "content_block_start":
            self._block_start(payload)
        elif kind == "message_delta":
            self._message_delta(payload)
        # content_block_stop needs nothing: fragments are joined when the response is built.
        # ping and unknown events are ignored.

    def _message_start(self, payload: Mapping[str, Any]) -> None:
        message = payload.get("message")
        if self._skeleton is not None or not isinstance(message, Mapping):
            return
        self._seen = True
        self._skeleton = dict(message)
        for index, block in enumerate(_blocks(message.get("content"))):
            self._blocks.setdefault(index, _Block(block))

    def _block_start(self, payload: Mapping[str, Any]) -> None:
        index = as_count(payload.get("index"))
        block = payload.get("content_block")
        if index is None or not isinstance(block, Mapping) or index in self._blocks:
            return
        self._seen = True
        self._blocks[index] = _Block(block)
        if block.get("type") == "fallback":
            model = as_dict(block.get("to")).get("model")
            if model is not None:
                self._message_extra["model"] = model

    def _beyond_block(self, payload: Mapping[str, Any], kind: str) -> None:
        index = as_count(payload.get("index"))
        block = self._blocks.get(index) if index is not None else None
        if block is not None:
            block.set.update(_beyond(payload, _ENVELOPES[kind]))

    def _block_delta(self, payload: Mapping[str, Any]) -> int | None:
        index = as_count(payload.get("index"))
        block = self._blocks.get(index) if index is not None else None
        delta = payload.get("delta")
        if block is not None and isinstance(delta, Mapping):
            return block.apply(delta)
        return 0

    def _message_delta(self, payload: Mapping[str, Any]) -> None:
        delta = payload.get("delta")
        usage = payload.get("usage")
        if isinstance(delta, Mapping):
            self._seen = True
            self._delta.update(
                (k, v)
                for k, v in delta.items()
                if k != "content" and (v is not None or k in _STOP_KEYS)
            )
        if isinstance(usage, Mapping):
            self._seen = True
            self._delta_usage.update((k, v) for k, v in usage.items() if v is not None)

    def finish(self) -> Reassembly:
        return Reassembly(self._build(), self._outcome, self._error)

    def _build(self) -> dict[str, Any] | None:
        if not self._seen:
            return None
        message = dict(self._skeleton or {})
        message.update(self._message_extra)
        message.update(self._delta)
        message["content"] = [self._blocks[index].build() for index in sorted(self._blocks)]
        if self._delta_usage:
            start_usage = message.get("usage")
            usage = dict(start_usage) if isinstance(start_usage, Mapping) else {}
            usage.update(self._delta_usage)
            message["usage"] = usage
        elif isinstance(message.get("usage"), Mapping):
            message["usage"] = dict(message["usage"])
        return message

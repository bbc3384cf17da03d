"""OpenAI Chat Completions: read a ``chat.completion``, rebuild one from its chunks (pure).

A stream is a run of ``data:`` events, each a ``chat.completion.chunk``, closed by ``data: [DONE]``.
With ``stream_options.include_usage`` a last chunk before ``[DONE]`` has empty ``choices`` and the
call's ``usage``. OpenAI-compatible servers (vLLM among them) report a failure mid-stream as
``data: {"error": {...}}``, often followed by ``[DONE]``.

Rebuild choices, stated once here:

- ``usage`` is the last usage object a chunk carried (vLLM's continuous usage stats send a running
  one on every chunk; the last is the call's). When no chunk carried one the key is omitted, since
  the stream did not say; ``normalize`` reads that as unknown, as it reads a null.
- Top-level ``id``, ``created`` and ``model`` are always present (``null`` when never sent),
  ``object`` is ``chat.completion``; ``system_fingerprint`` and ``service_tier`` are there only when
  some chunk carried the key. Each takes its first non-null value.
- Each choice's ``message`` has ``role``, ``content`` and ``refusal`` always (``null`` when no delta
  carried a string), ``reasoning_content`` / ``reasoning``, ``tool_calls``, ``function_call`` and
  ``annotations`` only when the stream sent them. Other delta fields (audio) are not rebuilt.
- After the first terminal event (``[DONE]`` or an error chunk) later events are ignored: vLLM sends
  ``[DONE]`` after its error chunk, and the error is what ended the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollcap._json import as_count, as_dict, as_str, load_json_object
from rollcap.dialects._base import (
    PIECE_OVERHEAD,
    Normalized,
    Reassembly,
    StreamOutcome,
    ToolCall,
    Usage,
    openai_error,
    openai_usage,
    parse_arguments,
)
from rollcap.sse import SSEEvent

__all__ = [
    "NAME",
    "StreamReassembler",
    "add_tool_fragment",
    "error_body",
    "is_terminal_event",
    "normalize",
    "tool_call_index",
    "tool_call_parts",
    "usage",
    "wants_stream_usage",
]

NAME = "chat"

_DONE = "[DONE]"
_REASONING_KEYS = ("reasoning_content", "reasoning")
# Keys of which at least one marks a JSON object as a chunk rather than stray data.
_CHUNK_KEYS = frozenset({"id", "object", "choices", "usage", "model"})
_PLAIN_DELTA_KEYS = frozenset({"role", "content"})


def wants_stream_usage(request: Mapping[str, Any]) -> bool:
    """Whether a streamed request asked for the usage chunk (``stream_options.include_usage``)."""
    return as_dict(request.get("stream_options")).get("include_usage") is True


def usage(response: Mapping[str, Any]) -> Usage:
    """Only the token counts of ``normalize``: what aggregation needs, without the rest."""
    return _usage(as_dict(as_dict(response).get("usage")))


def normalize(response: Mapping[str, Any]) -> Normalized:
    """Read a ``chat.completion`` object (non-streamed or rebuilt) per the contract's rules."""
    resp = as_dict(response)
    choices = resp.get("choices")
    first = as_dict(choices[0]) if isinstance(choices, list) and choices else {}
    message = as_dict(first.get("message"))
    return Normalized(
        response_id=as_str(resp.get("id")),
        model=as_str(resp.get("model")),
        response_status=None,
        finish_reason=as_str(first.get("finish_reason")),
        usage=usage(resp),
        tool_calls=_tool_calls(message),
        reasoning_content=_reasoning(message),
    )


def _usage(usage: Mapping[str, Any]) -> Usage:
    return openai_usage(usage, "prompt", "completion")


def tool_call_parts(item: Mapping[str, Any]) -> tuple[object, object]:
    """A message's tool call as ``(name, arguments)``, as sent (either may be anything).

    A function tool keeps them under ``function``; a custom (free-form) tool carries
    ``{"name", "input"}`` under ``custom`` instead.
    """
    if "function" not in item and isinstance(item.get("custom"), Mapping):
        custom = as_dict(item.get("custom"))
        return custom.get("name"), custom.get("input")
    function = as_dict(item.get("function"))
    return function.get("name"), function.get("arguments")


def _tool_calls(message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    calls: list[ToolCall] = []
    raw_calls = message.get("tool_calls")
    for raw in raw_calls if isinstance(raw_calls, list) else ():
        item = as_dict(raw)
        if not item:
            continue
        name, arguments = tool_call_parts(item)
        calls.append(ToolCall(as_str(item.get("id")), as_str(name), parse_arguments(arguments)))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        calls.append(
            ToolCall(None, as_str(legacy.get("name")), parse_arguments(legacy.get("arguments")))
        )
    return tuple(calls)


def _reasoning(message: Mapping[str, Any]) -> str | None:
    for key in _REASONING_KEYS:
        text = as_str(message.get(key))
        if text is not None:
            return text
    return None


def _error_of(event: SSEEvent, chunk: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The error an event reports, or ``None`` for an ordinary chunk."""
    if chunk is not None:
        error = chunk.get("error")
        if isinstance(error, dict):
            return error
        if isinstance(error, str) and error:
            return {"message": error}
    if event.event == "error":
        # No OpenAI stream names its events; a server that names one "error" means it.
        if chunk is not None:
            return dict(chunk)
        return {"message": event.data}
    return None


def error_body(kind: str, message: str) -> dict[str, Any]:
    """An error answer as the OpenAI API sends one."""
    return openai_error(message, kind=kind)


def is_terminal_event(event: SSEEvent) -> bool:
    """``data: [DONE]``, or a chunk that reports an error."""
    if not isinstance(event, SSEEvent) or not isinstance(event.data, str):
        return False
    data = event.data
    if data == _DONE or (_DONE in data and data.strip() == _DONE):  # strip copies: rarely
        return True
    # Parsing every chunk just to look for an error would be wasted on nearly all of them. A
    # key can only be spelled without the word "error" in it through \u escapes.
    if event.event != "error" and '"error"' not in data and "\\u" not in data:
        return False
    return _error_of(event, load_json_object(data)) is not None


class ToolCallPieces(Protocol):
    id: str | None
    name: str | None
    arguments: list[str]


def add_tool_fragment(pieces: ToolCallPieces, fragment: Mapping[str, Any]) -> str | None:
    """Fold one streamed fragment into its call's pieces; the arguments piece it added, if any.

    The first id and name stay (some servers repeat them on every fragment); arguments come
    in pieces, kept in order.
    """
    call_id = as_str(fragment.get("id")) or None
    if call_id and pieces.id is None:
        pieces.id = call_id
    function = as_dict(fragment.get("function"))
    name = as_str(function.get("name"))
    if name and pieces.name is None:
        pieces.name = name
    arguments = as_str(function.get("arguments"))
    if not arguments:
        return None
    pieces.arguments.append(arguments)
    return arguments


def tool_call_index(fragment: Mapping[str, Any], ids: Mapping[int, str | None]) -> int:
    """Which tool call a streamed fragment belongs to, given the calls seen so far (index: id).

    Some servers leave the index out: the fragment then matches a call by id, a new id opens a
    new call, and an id-less fragment continues the last one.
    """
    index = as_count(fragment.get("index"))
    if index is not None:
        return index
    call_id = as_str(fragment.get("id")) or None
    known = [i for i, known_id in ids.items() if call_id and known_id == call_id]
    if known:
        return known[0]
    if call_id is not None or not ids:
        return max(ids, default=-1) + 1
    return max(ids)


@dataclass(slots=True)
class _ToolCallParts:
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)

    def build(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type or "function",
            "function": {"name": self.name, "arguments": "".join(self.arguments)},
        }


@dataclass(slots=True)
class _ChoiceParts:
    role: str | None = None
    content: list[str] | None = None
    refusal: list[str] | None = None
    reasoning: dict[str, list[str]] = field(default_factory=dict)
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    function_name: str | None = None
    function_arguments: list[str] | None = None
    annotations: list[Any] | None = None
    finish_reason: str | None = None
    logprobs_seen: bool = False
    logprobs_content: list[Any] | None = None
    logprobs_refusal: list[Any] | None = None

    def feed(self, choice: Mapping[str, Any]) -> int | None:
        """Fold one chunk's choice in; the length of the text it kept, or ``None`` when it took
        the general path (which may keep more than text: the caller counts the whole chunk)."""
        delta = choice.get("delta")
        if (
            type(delta) is dict
            and _PLAIN_DELTA_KEYS.issuperset(delta)
            and choice.get("logprobs") is None
        ):
            # Nearly every chunk of a text answer: same effect as the general path below, for
            # a fraction of its lookups. Record building runs on the event loop, once per
            # chunk of every captured stream: keep it cheap.
            role = delta.get("role")
            if role and isinstance(role, str) and self.role is None:
                self.role = role
            text = delta.get("content")
            finish = choice.get("finish_reason")
            if isinstance(finish, str):
                self.finish_reason = finish
            if isinstance(text, str):
                if self.content is None:
                    self.content = []
                self.content.append(text)
                return len(text)
            return 0
        delta = as_dict(delta)
        role = as_str(delta.get("role"))
        if role and self.role is None:
            self.role = role
        text = as_str(delta.get("content"))
        if text is not None:
            if self.content is None:
                self.content = []
            self.content.append(text)
        text = as_str(delta.get("refusal"))
        if text is not None:
            if self.refusal is None:
                self.refusal = []
            self.refusal.append(text)
        for key in _REASONING_KEYS:
            text = as_str(delta.get(key))
            if text is not None:
                self.reasoning.setdefault(key, []).append(text)
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for fragment in tool_calls:
                self._feed_tool_call(as_dict(fragment))
        legacy = delta.get("function_call")
        if isinstance(legacy, Mapping):
            name = as_str(legacy.get("name"))
            if name and self.function_name is None:
                self.function_name = name
            self.function_arguments = self.function_arguments or []
            arguments = as_str(legacy.get("arguments"))
            if arguments:
                self.function_arguments.append(arguments)
        annotations = delta.get("annotations")
        if isinstance(annotations, list):
            if self.annotations is None:
                self.annotations = []
            self.annotations.extend(annotations)
        finish = as_str(choice.get("finish_reason"))
        if finish is not None:
            self.finish_reason = finish
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, Mapping):
            self.logprobs_seen = True
            entries = logprobs.get("content")
            if isinstance(entries, list):
                if self.logprobs_content is None:
                    self.logprobs_content = []
                self.logprobs_content.extend(entries)
            entries = logprobs.get("refusal")
            if isinstance(entries, list):
                if self.logprobs_refusal is None:
                    self.logprobs_refusal = []
                self.logprobs_refusal.extend(entries)
        return None

    def _feed_tool_call(self, fragment: Mapping[str, Any]) -> None:
        if not fragment:
            return
        index = tool_call_index(fragment, {i: p.id for i, p in self.tool_calls.items()})
        parts = self.tool_calls.setdefault(index, _ToolCallParts())
        add_tool_fragment(parts, fragment)
        kind = as_str(fragment.get("type"))
        if kind and parts.type is None:
            parts.type = kind

    def build(self, index: int) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": self.role or "assistant",
            "content": None if self.content is None else "".join(self.content),
            "refusal": None if self.refusal is None else "".join(self.refusal),
        }
        for key in _REASONING_KEYS:
            if key in self.reasoning:
                message[key] = "".join(self.reasoning[key])
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i].build() for i in sorted(self.tool_calls)]
        if self.function_arguments is not None:
            message["function_call"] = {
                "name": self.function_name,
                "arguments": "".join(self.function_arguments),
            }
        if self.annotations is not None:
            message["annotations"] = self.annotations
        logprobs = (
            {"content": self.logprobs_content, "refusal": self.logprobs_refusal}
            if self.logprobs_seen
            else None
        )
        return {
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": self.finish_reason,
        }


_FIRST_VALUE_KEYS = ("id", "created", "model")
_OPTIONAL_KEYS = ("system_fingerprint", "service_tier")


class StreamReassembler:
    """Feed the stream's events, then ``finish()`` gives the ``chat.completion`` they describe.

    ``size``: a plain text delta counts its text, any other chunk its whole data (see
    ``dialects._base.StreamReassembler``).
    """

    def __init__(self) -> None:
        self.size = 0
        self._seen_chunk = False
        self._top: dict[str, Any] = {}
        # Top-level keys whose first non-null value has not come yet.
        self._unset = list(_FIRST_VALUE_KEYS + _OPTIONAL_KEYS)
        self._choices: dict[int, _ChoiceParts] = {}
        self._usage: dict[str, Any] | None = None
        self._done = False
        self._error: dict[str, Any] | None = None

    def feed(self, event: SSEEvent) -> None:
        if self._done or self._error is not None:
            return
        data = event.data if isinstance(event.data, str) else ""
        if data == _DONE or (_DONE in data and data.strip() == _DONE):
            self._done = True
            return
        chunk = load_json_object(data)
        # Nearly every chunk: no error key and no "error" event, which _error_of would find.
        error = (
            None
            if chunk is not None and "error" not in chunk and event.event != "error"
            else _error_of(event, chunk)
        )
        if error is not None:
            self._error = error
            return
        if chunk is None or _CHUNK_KEYS.isdisjoint(chunk):
            return
        self._seen_chunk = True
        if self._unset:
            for key in [k for k in self._unset if chunk.get(k) is not None]:
                self._top[key] = chunk[key]
                self._unset.remove(key)
            for key in self._unset:  # a null keeps the place until a value comes
                if key in chunk and key not in self._top:
                    self._top[key] = None
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = chunk.get("choices")
        for raw in choices if isinstance(choices, list) else ():
            choice = as_dict(raw)
            if not choice:
                continue
            index = as_count(choice.get("index"))
            index = 0 if index is None else index
            parts = self._choices.get(index)
            if parts is None:
                parts = self._choices[index] = _ChoiceParts()
            kept = parts.feed(choice)
            self.size += PIECE_OVERHEAD + (len(data) if kept is None else kept)

    def finish(self) -> Reassembly:
        response = self._build()
        if self._error is not None:
            return Reassembly(response, StreamOutcome.ERROR, self._error)
        if self._done:
            return Reassembly(response, StreamOutcome.COMPLETED)
        return Reassembly(response, StreamOutcome.TRUNCATED)

    def _build(self) -> dict[str, Any] | None:
        if not self._seen_chunk:
            return None
        response: dict[str, Any] = {
            "id": self._top.get("id"),
            "object": "chat.completion",
            "created": self._top.get("created"),
            "model": self._top.get("model"),
            "choices": [self._choices[i].build(i) for i in sorted(self._choices)],
        }
        for key in _OPTIONAL_KEYS:
            if key in self._top:
                response[key] = self._top[key]
        if self._usage is not None:
            response["usage"] = self._usage
        return response

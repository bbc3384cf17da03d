"""OpenAI Chat Completions: read a ``chat.completion``, rebuild one from its chunks (pure).

A stream is a run of ``data:`` events, each a ``chat.completion.chunk``, closed by ``data: [DONE]``.
With ``stream_options.include_usage`` a last chunk before ``[DONE]`` has empty ``choices`` and the
call's ``usage``. OpenAI-compatible servers (vLLM among them) report a failure mid-stream as
``data: {"error": {...}}``, often followed by ``[DONE]``.

The rebuilt object is what the official ``openai`` SDK's stream accumulation
(``chat.completions.stream(...).get_final_completion()``) builds from the same chunks, key for key,
except where the SDK loses something the stream sent; there this keeps it (each such place is
marked *kept*). Stated once here:

- Top level: every key of the first chunk (``id``, ``created``, ``model``, ``service_tier``, unknown
  ones), ``object`` set to ``chat.completion``, the padding key ``obfuscation`` left out, as the
  SDK does. A key first sent by a later chunk is added (*kept*: the SDK reads only the first).
  ``system_fingerprint`` is the last non-null one sent, ``usage`` the last usage object a chunk
  carried (vLLM's continuous usage stats send a running one on every chunk; the last is the
  call's); the SDK takes both from the last chunk, null when it has none (*kept*: an earlier value
  is not lost). When no chunk carried usage the key is omitted, which ``normalize`` reads as
  unknown, as it reads a null.
- Each choice: the last ``finish_reason`` sent, ``logprobs`` ``content`` / ``refusal`` entries
  joined in order, and its other keys (vLLM's ``token_ids`` and ``stop_reason``, unknown ones)
  merged across chunks as delta keys are (below). The SDK keeps those of the chunk that first
  names the choice (*kept*: a later chunk's, such as the rest of ``token_ids``, are not lost).
- Each choice's ``message``: ``role``, ``content`` and ``refusal`` always (``null`` when no delta
  carried a string), then every other delta key merged as the SDK merges them: strings joined,
  numbers added, objects merged key by key, lists of ``index``-ed objects merged by index, other
  lists extended, ``index`` and ``type`` replaced. So ``reasoning_content`` / ``reasoning``,
  ``audio``, ``annotations``, ``function_call`` and unknown keys come out as the SDK builds them.
  Two differences, both where the SDK would garble what servers send: a repeated ``role``, tool
  call ``id`` or function ``name`` keeps its first value (the SDK would join the copies), and a
  custom tool call stays in ``tool_calls`` (*kept*: the SDK's final completion drops it).
- ``tool_calls``: one entry per call, with the ``index`` the fragments carried (as the SDK keeps
  it), ``id``, ``type`` (``function`` when never sent), ``function`` ``name`` and joined
  ``arguments``, and any other fragment key merged as above. A fragment without ``index`` joins a
  call by id, or the last call (``tool_call_index``); such calls carry no ``index``.
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


def merge_delta(into: dict[str, Any], delta: Mapping[str, Any]) -> None:
    """Merge one streamed delta object into what the earlier ones built, in place, by the rules
    the official SDK applies to a chat stream's deltas: a key first seen (or still null) takes the
    delta's value; ``index`` and ``type`` are replaced; strings are joined, numbers added, objects
    merged key by key; a list of ``index``-ed objects merges each entry into the one at its index
    (inserting a new one); any other list is extended. A value of another type than the one held
    leaves the held one."""
    for key, value in delta.items():
        held = into.get(key)
        if held is None:
            if _indexed(value):
                held = into[key] = []
            else:
                into[key] = _fresh(value)
                continue
        if key in ("index", "type"):
            into[key] = value
        elif isinstance(held, str):
            if isinstance(value, str):
                into[key] = held + value
        elif isinstance(held, int | float) and not isinstance(held, bool):
            if isinstance(value, int | float) and not isinstance(value, bool):
                into[key] = held + value
        elif isinstance(held, dict):
            if isinstance(value, Mapping):
                merge_delta(held, value)
        elif isinstance(held, list) and isinstance(value, list):
            _merge_list(held, value)


def _indexed(value: object) -> bool:
    return isinstance(value, list) and any(
        isinstance(entry, Mapping) and "index" in entry for entry in value
    )


def _fresh(value: Any) -> Any:
    # A held object is merged into in place later: it must not be the chunk's own.
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


def _merge_list(held: list[Any], value: list[Any]) -> None:
    if not _indexed(value) or (held and not any(isinstance(x, Mapping) for x in held)):
        held.extend(value)
        return
    for entry in value:
        index = as_count(entry.get("index")) if isinstance(entry, Mapping) else None
        if index is None or not isinstance(entry, Mapping):
            held.append(_fresh(entry))  # not indexed: nothing says where else it belongs
        elif index < len(held) and isinstance(held[index], dict):
            merge_delta(held[index], entry)
        else:
            held.insert(index, dict(entry))


# Delta keys read by name; every other key is merged as the SDK merges it (``merge_delta``).
_NAMED_DELTA_KEYS = frozenset({"role", "content", "refusal", "tool_calls"})
_NAMED_FRAGMENT_KEYS = frozenset({"id", "type", "function"})
_NAMED_FUNCTION_KEYS = frozenset({"name", "arguments"})
_NAMED_CHOICE_KEYS = frozenset({"index", "delta", "finish_reason", "logprobs"})


@dataclass(slots=True)
class _ToolCallParts:
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)
    index: object = None  # as the fragments sent it; None when they never did
    extra: dict[str, Any] = field(default_factory=dict)
    function_extra: dict[str, Any] = field(default_factory=dict)

    def build(self) -> dict[str, Any]:
        call: dict[str, Any] = dict(self.extra)
        if self.index is not None:
            call["index"] = self.index
        call["id"] = self.id
        call["type"] = self.type or "function"
        function = dict(self.function_extra)
        function["name"] = self.name
        function["arguments"] = "".join(self.arguments)
        call["function"] = function
        return call


@dataclass(slots=True)
class _ChoiceParts:
    role: str | None = None
    content: list[str] | None = None
    refusal: list[str] | None = None
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    # Every other delta key (reasoning, audio, annotations, function_call, unknown ones).
    extra: dict[str, Any] = field(default_factory=dict)
    # Choice keys besides the named ones (vLLM's token_ids, unknown ones), merged as deltas are.
    choice_extra: dict[str, Any] = field(default_factory=dict)
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
            and _NAMED_CHOICE_KEYS.issuperset(choice)
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
        if not _NAMED_CHOICE_KEYS.issuperset(choice):
            merge_delta(
                self.choice_extra, {k: v for k, v in choice.items() if k not in _NAMED_CHOICE_KEYS}
            )
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
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for fragment in tool_calls:
                self._feed_tool_call(as_dict(fragment))
        if not _NAMED_DELTA_KEYS.issuperset(delta):
            merge_delta(self.extra, {k: v for k, v in delta.items() if k not in _NAMED_DELTA_KEYS})
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
        if "index" in fragment:
            parts.index = fragment["index"]
        if len(fragment) > len(_NAMED_FRAGMENT_KEYS) or not _NAMED_FRAGMENT_KEYS.issuperset(
            fragment
        ):
            merge_delta(
                parts.extra,
                {
                    k: v
                    for k, v in fragment.items()
                    if k not in _NAMED_FRAGMENT_KEYS and k != "index"
                },
            )
        function = fragment.get("function")
        if isinstance(function, Mapping) and not _NAMED_FUNCTION_KEYS.issuperset(function):
            merge_delta(
                parts.function_extra,
                {k: v for k, v in function.items() if k not in _NAMED_FUNCTION_KEYS},
            )

    def build(self, index: int) -> dict[str, Any]:
        message: dict[str, Any] = dict(self.extra)
        message["role"] = self.role or "assistant"
        message["content"] = None if self.content is None else "".join(self.content)
        message["refusal"] = None if self.refusal is None else "".join(self.refusal)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i].build() for i in sorted(self.tool_calls)]
        logprobs = (
            {"content": self.logprobs_content, "refusal": self.logprobs_refusal}
            if self.logprobs_seen
            else None
        )
        return {
            **self.choice_extra,
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": self.finish_reason,
        }


# The top-level keys that are not the first chunk's: each has a rule of its own.
_OWN_RULE_KEYS = frozenset({"choices", "usage", "object", "system_fingerprint", "obfuscation"})


class StreamReassembler:
    """Feed the stream's events, then ``finish()`` gives the ``chat.completion`` they describe.

    ``size``: a plain text delta counts its text, any other chunk its whole data (see
    ``dialects._base.StreamReassembler``).
    """

    def __init__(self) -> None:
        self.size = 0
        self._seen_chunk = False
        self._top: dict[str, Any] = {}
        # The keys of the last chunk whose top level was read: a chunk of the same shape (nearly
        # every one) adds nothing, unless a key is still waiting for its first non-null value.
        self._top_shape: tuple[str, ...] = ()
        self._top_waits = False
        self._fingerprint: object = None
        self._fingerprint_sent = False
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
        shape = tuple(chunk)
        if shape != self._top_shape or self._top_waits:
            self._top_shape = shape
            top = self._top
            taken = False
            for key, value in chunk.items():
                # A null keeps the place until a value comes.
                if key not in _OWN_RULE_KEYS and top.get(key) is None:
                    top[key] = value
                    taken = True
            if taken:  # kept beyond the choices: counted whole, as a bound must see it
                self.size += PIECE_OVERHEAD + len(data)
            self._top_waits = any(value is None for value in top.values())
            if "system_fingerprint" in chunk:
                self._fingerprint_sent = True
        fingerprint = chunk.get("system_fingerprint")
        if fingerprint is not None:
            self._fingerprint = fingerprint
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
            "id": None,
            "created": None,
            "model": None,
            **self._top,
            "object": "chat.completion",
            "choices": [self._choices[i].build(i) for i in sorted(self._choices)],
        }
        if self._fingerprint_sent:
            response["system_fingerprint"] = self._fingerprint
        if self._usage is not None:
            response["usage"] = self._usage
        return response

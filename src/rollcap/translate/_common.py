"""Pieces shared by the Responses and Messages translators (pure).

Reading a chat answer the same way in the non-streamed and the streamed translators is what makes
a translated stream reassemble to the non-streamed translation, so both go through this module:

- The answer is choice ``0`` (a choice without an index counts as ``0``, as in the chat
  reassembler); other choices are not translated, since neither target API has ``n``.
- Reasoning is ``reasoning_content`` when it is a string, else ``reasoning`` (vLLM has used both
  names). A stream locks onto the first of the two it sees.
- A text (reasoning, content, refusal) becomes a part only once it holds a non-whitespace
  character; whitespace before that is kept as the part's prefix. Whitespace-only text makes no
  part: Anthropic refuses whitespace-only text blocks when a client sends them back.
- A tool call becomes a part once its name is known, or at the end of the answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import orjson

from rollcap._json import as_count, as_dict, as_str, load_json_object
from rollcap.dialects import chat as chat_dialect
from rollcap.sse import SSEEvent

__all__ = [
    "CHUNK_KEYS",
    "DONE",
    "REASONING_KEYS",
    "ChatToolCall",
    "ChatUsage",
    "ChoiceDeltas",
    "Delta",
    "Open",
    "chat_usage",
    "dumps",
    "fail",
    "first_choice",
    "has_text",
    "reasoning_of",
    "request_error",
    "tool_calls_of",
]

DONE = "[DONE]"
REASONING_KEYS = ("reasoning_content", "reasoning")
# As in the chat reassembler: one of these marks a JSON object as a chunk rather than stray data.
CHUNK_KEYS = ("id", "object", "choices", "usage", "model")


def request_error(field_name: str, problem: str) -> ValueError:
    return ValueError(f"{field_name}: {problem}")


def fail(field_name: str, problem: str) -> NoReturn:
    raise request_error(field_name, problem)


def dumps(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        # orjson refuses integers beyond 64 bits and foreign types; an echoed request field may
        # hold either, and translating must not fail on it.
        return json.dumps(value, ensure_ascii=False, default=str)


def has_text(text: str | None) -> bool:
    return text is not None and not text.isspace() and text != ""


def first_choice(chat: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = as_dict(chat).get("choices")
    for raw in choices if isinstance(choices, list) else ():
        choice = as_dict(raw)
        index = as_count(choice.get("index"))
        if choice and (index is None or index == 0):
            return choice
    return {}


def reasoning_of(message: Mapping[str, Any]) -> str | None:
    for key in REASONING_KEYS:
        text = as_str(message.get(key))
        if text is not None:
            return text
    return None


@dataclass(frozen=True, slots=True)
class ChatUsage:
    prompt: int | None
    cached: int | None
    completion: int | None
    reasoning: int | None
    total: int | None


def chat_usage(chat: Mapping[str, Any]) -> ChatUsage | None:
    """The answer's token counts, ``None`` when it carries no usage object."""
    usage = as_dict(chat).get("usage")
    if not isinstance(usage, Mapping):
        return None
    return ChatUsage(
        prompt=as_count(usage.get("prompt_tokens")),
        cached=as_count(as_dict(usage.get("prompt_tokens_details")).get("cached_tokens")),
        completion=as_count(usage.get("completion_tokens")),
        reasoning=as_count(as_dict(usage.get("completion_tokens_details")).get("reasoning_tokens")),
        total=as_count(usage.get("total_tokens")),
    )


@dataclass(frozen=True, slots=True)
class ChatToolCall:
    id: str | None
    name: str | None
    arguments: str


def tool_calls_of(message: Mapping[str, Any]) -> list[ChatToolCall]:
    calls: list[ChatToolCall] = []
    raw_calls = message.get("tool_calls")
    for raw in raw_calls if isinstance(raw_calls, list) else ():
        item = as_dict(raw)
        if not item:
            continue
        name, arguments = chat_dialect.tool_call_parts(item)
        if not isinstance(arguments, str):
            # Some servers send parsed arguments; both target APIs want the JSON text.
            arguments = "" if arguments is None else dumps(arguments)
        calls.append(
            ChatToolCall(
                id=as_str(item.get("id")) or None, name=as_str(name) or None, arguments=arguments
            )
        )
    return calls


# --- the streamed answer, as opened parts and deltas ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Open:
    """A part starts: ``kind`` is reasoning / text / refusal / tool (``ordinal`` for a tool)."""

    kind: str
    ordinal: int = 0


@dataclass(frozen=True, slots=True)
class Delta:
    kind: str
    text: str
    ordinal: int = 0


@dataclass(slots=True)
class _Text:
    fragments: list[str] = field(default_factory=list)
    opened: bool = False

    @property
    def text(self) -> str:
        return "".join(self.fragments)


@dataclass(slots=True)
class ToolState:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)
    ordinal: int | None = None


class ChoiceDeltas:
    """Turns choice ``0`` of each chunk into ``Open`` / ``Delta`` operations, in arrival order.

    Tool-call fragments are matched to calls exactly as the chat reassembler matches them (by
    ``index``, else by id, else the last call), so both see the same calls.
    """

    __slots__ = ("_reasoning_key", "_texts", "opened_tools", "stop_reason", "tools")

    def __init__(self) -> None:
        self._texts = {kind: _Text() for kind in ("reasoning", "text", "refusal")}
        self._reasoning_key: str | None = None
        self.tools: dict[int, ToolState] = {}
        self.opened_tools: list[ToolState] = []
        self.stop_reason: object = None

    def text(self, kind: str) -> str:
        return self._texts[kind].text

    def feed(self, choice: Mapping[str, Any]) -> list[Open | Delta]:
        ops: list[Open | Delta] = []
        delta = as_dict(choice.get("delta"))
        if self._reasoning_key is None:
            self._reasoning_key = next(
                (key for key in REASONING_KEYS if isinstance(delta.get(key), str)), None
            )
        if self._reasoning_key is not None:
            self._feed_text("reasoning", delta.get(self._reasoning_key), ops)
        self._feed_text("text", delta.get("content"), ops)
        self._feed_text("refusal", delta.get("refusal"), ops)
        fragments = delta.get("tool_calls")
        for fragment in fragments if isinstance(fragments, list) else ():
            self._feed_tool(as_dict(fragment), ops)
        # vLLM names the stop string that ended the answer here (an int for a stop token).
        if choice.get("stop_reason") is not None:
            self.stop_reason = choice.get("stop_reason")
        return ops

    def close(self) -> list[Open | Delta]:
        """End of the answer: tool calls still waiting for a name are opened now."""
        ops: list[Open | Delta] = []
        for index in sorted(self.tools):
            tool = self.tools[index]
            if tool.ordinal is None:
                self._open_tool(tool, ops)
        return ops

    def _feed_text(self, kind: str, value: object, ops: list[Open | Delta]) -> None:
        if not isinstance(value, str) or not value:
            return
        state = self._texts[kind]
        state.fragments.append(value)
        if state.opened:
            ops.append(Delta(kind, value))
        elif not value.isspace():
            state.opened = True
            ops.append(Open(kind))
            ops.append(Delta(kind, state.text))

    def _feed_tool(self, fragment: Mapping[str, Any], ops: list[Open | Delta]) -> None:
        if not fragment:
            return
        index = chat_dialect.tool_call_index(fragment, {i: t.id for i, t in self.tools.items()})
        tool = self.tools.setdefault(index, ToolState(index))
        arguments = chat_dialect.add_tool_fragment(tool, fragment)
        if tool.ordinal is None:
            if tool.name is not None:
                self._open_tool(tool, ops)
        elif arguments:
            ops.append(Delta("tool", arguments, tool.ordinal))

    def _open_tool(self, tool: ToolState, ops: list[Open | Delta]) -> None:
        tool.ordinal = len(self.opened_tools)
        self.opened_tools.append(tool)
        ops.append(Open("tool", tool.ordinal))
        if tool.arguments:
            ops.append(Delta("tool", "".join(tool.arguments), tool.ordinal))


class ChatStreamTranslator:
    """What both stream translators share: read chat events, spot the end, call the hooks.

    Subclasses give ``_begin(model)`` (the events that open the client's stream), ``_apply(ops,
    out)`` (the events of one chunk's deltas), ``_complete()`` (the closing events at
    ``[DONE]``) and ``_error(error)`` (the client's error event). ``finish()`` (the upstream
    closed) adds nothing, so a cut stream stays cut. Neither ``feed`` nor ``finish`` raises.
    """

    def __init__(self) -> None:
        self._chat = chat_dialect.StreamReassembler()
        self._choice = ChoiceDeltas()
        self._started = False
        self._ended = False

    def feed(self, event: SSEEvent) -> list[SSEEvent]:
        if self._ended:
            return []
        self._chat.feed(event)
        data = event.data if isinstance(event.data, str) else ""
        if data.strip() == DONE:
            self._ended = True
            return self._complete()
        if chat_dialect.is_terminal_event(event):
            self._ended = True
            return self._error(self._chat.finish().error or {})
        chunk = load_json_object(data)
        if chunk is None or not any(key in chunk for key in CHUNK_KEYS):
            return []
        out = self._start(as_str(chunk.get("model")))
        choices = chunk.get("choices")
        for raw in choices if isinstance(choices, list) else ():
            choice = as_dict(raw)
            index = as_count(choice.get("index"))
            if choice and (index is None or index == 0):
                self._apply(self._choice.feed(choice), out)
        return out

    def finish(self) -> list[SSEEvent]:
        return []

    def _start(self, model: str | None) -> list[SSEEvent]:
        """The opening events, once: at the first chunk, or at the end of an empty stream."""
        if self._started:
            return []
        self._started = True
        return self._begin(model)

    def _begin(self, model: str | None) -> list[SSEEvent]:
        raise NotImplementedError

    def _apply(self, ops: list[Open | Delta], out: list[SSEEvent]) -> None:
        raise NotImplementedError

    def _complete(self) -> list[SSEEvent]:
        raise NotImplementedError

    def _error(self, error: Mapping[str, Any]) -> list[SSEEvent]:
        raise NotImplementedError

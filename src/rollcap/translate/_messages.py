"""Anthropic Messages <-> Chat Completions (pure).

Request rules (``messages_request_to_chat``):

- ``system`` (a string, or text blocks joined by ``"\\n"``) becomes a leading system message.
- User messages: text and image blocks (base64 or URL sources, as ``image_url`` parts; text-only
  content is joined by ``"\\n"`` into one string) make a user message; each ``tool_result`` block
  becomes a ``tool`` message placed before it, since chat wants tool answers right after the
  assistant turn that called them. ``is_error`` has no chat counterpart and is dropped.
- Assistant messages: text blocks joined (``""``), ``tool_use`` blocks as ``tool_calls`` (input
  serialized to JSON), ``thinking`` blocks as ``reasoning_content`` (signatures ignored),
  ``redacted_thinking`` dropped (it is Anthropic-encrypted and means nothing to vLLM).
- ``tools`` (custom tools: ``input_schema`` -> ``parameters``) -> function tools; Anthropic's
  built-in tool types are refused. ``tool_choice`` auto / any / tool / none -> auto / required /
  function / none, ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``.
- ``max_tokens`` (required), ``stop_sequences`` -> ``stop``, ``temperature``, ``top_p``,
  ``top_k`` (vLLM takes it), ``stream`` (+ ``stream_options.include_usage``) and the vLLM extras
  of ``VLLM_PASSTHROUGH`` are sent.
- ``thinking`` becomes ``chat_template_kwargs.enable_thinking`` (true for ``enabled`` /
  ``adaptive``, false for ``disabled``): the switch Qwen3-style templates read, ignored by
  templates that have none. ``budget_tokens`` has no vLLM counterpart and is dropped. An explicit
  ``chat_template_kwargs.enable_thinking`` wins.
- Every other field (``metadata``, ``service_tier``, ``cache_control`` on blocks, unknown ones)
  is ignored; wrong types and missing required fields raise ``ValueError`` naming the field.

Response rules (``chat_response_to_messages``): content is a ``thinking`` block (signature
``THINKING_SIGNATURE``), a ``text`` block for the content, one for a refusal, then a ``tool_use``
block per tool call, each text block only when it has non-whitespace text (Anthropic refuses
whitespace-only text blocks sent back). ``input`` is the parsed arguments, ``{}`` for empty ones,
and the raw text when they are not JSON (as the Messages stream reassembler keeps it). A tool
call without an upstream id gets ``toolu_<base>_<n>``, ``<base>`` being ``message_id`` without its
``msg_`` prefix. ``stop_reason``: ``length`` -> ``max_tokens``, ``tool_calls`` (or any answer with
tool calls that stopped) -> ``tool_use``, ``content_filter`` -> ``refusal``, ``stop`` ->
``stop_sequence`` when vLLM's ``stop_reason`` names one of the request's ``stop_sequences``, else
``end_turn``. Usage keeps ``tokens_in`` equal to the chat ``prompt_tokens``: cached prompt tokens
are reported as ``cache_read_input_tokens`` and taken out of ``input_tokens``, as Anthropic counts
them; ``cache_read_input_tokens`` is present only when the upstream reported cached tokens.
``input_tokens`` / ``output_tokens`` are integers the schema requires, and read 0 when the
upstream reported no usage: the streamed ``message_start`` must state them before vLLM reports any.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from rollcap._json import as_count, as_dict, as_str
from rollcap.sse import SSEEvent
from rollcap.translate._common import (
    ChatStreamTranslator,
    ChatUsage,
    Delta,
    Open,
    chat_usage,
    dumps,
    fail,
    first_choice,
    has_text,
    reasoning_of,
    request_error,
    tool_calls_of,
)
from rollcap.translate._events import THINKING_SIGNATURE, messages_error, messages_event
from rollcap.translate._requests import (
    apply_stream,
    copy_passthrough,
    opt_bool,
    opt_count,
    opt_number,
    opt_str,
    req_list,
    req_mapping,
    req_str,
)

__all__ = ["ChatToMessagesStream", "chat_response_to_messages", "messages_request_to_chat"]

_CUSTOM_TOOL_TYPES = frozenset({None, "custom"})


# --- requests ------------------------------------------------------------------------------------


def messages_request_to_chat(request: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages ``create`` body as a Chat Completions body. Raises ``ValueError`` naming the
    field for a malformed request or one that needs what chat cannot express."""
    req = req_mapping(request, "request")
    chat: dict[str, Any] = {}
    model = opt_str(req, "model")
    if model is not None:
        chat["model"] = model
    if req.get("max_tokens") is None:
        fail("max_tokens", "is required")
    chat["max_tokens"] = opt_count(req, "max_tokens", minimum=1)
    messages: list[dict[str, Any]] = []
    system = _system(req.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    if req.get("messages") is None:
        fail("messages", "is required")
    turns = req_list(req["messages"], "messages")
    if not turns:
        fail("messages", "needs at least one message")
    for position, raw in enumerate(turns):
        messages.extend(
            _message(req_mapping(raw, f"messages[{position}]"), f"messages[{position}]")
        )
    chat["messages"] = messages
    if req.get("tools") is not None:
        tools = _tools(req_list(req["tools"], "tools"))
        if tools:
            chat["tools"] = tools
    if req.get("tool_choice") is not None:
        _tool_choice(req_mapping(req["tool_choice"], "tool_choice"), chat)
    if req.get("stop_sequences") is not None:
        stops = req_list(req["stop_sequences"], "stop_sequences")
        chat["stop"] = [req_str(s, f"stop_sequences[{i}]") for i, s in enumerate(stops)]
    for key in ("temperature", "top_p"):
        number = opt_number(req, key)
        if number is not None:
            chat[key] = number
    apply_stream(req, chat)
    copy_passthrough(req, chat)
    top_k = opt_count(req, "top_k", minimum=1)
    if top_k is not None:
        chat["top_k"] = top_k
    if req.get("thinking") is not None:
        enable = _thinking(req_mapping(req["thinking"], "thinking"))
        kwargs = dict(req_mapping(chat.get("chat_template_kwargs", {}), "chat_template_kwargs"))
        kwargs.setdefault("enable_thinking", enable)
        chat["chat_template_kwargs"] = kwargs
    return chat


def _system(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    texts = []
    for position, raw in enumerate(req_list(value, "system")):
        block = req_mapping(raw, f"system[{position}]")
        if block.get("type") != "text":
            fail(f"system[{position}].type", f"expected text, got {block.get('type')!r}")
        texts.append(req_str(block.get("text"), f"system[{position}].text"))
    return "\n".join(texts)


def _message(message: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    role = message.get("role")
    if role not in ("user", "assistant"):
        fail(f"{name}.role", f"expected user or assistant, got {role!r}")
    content = message.get("content")
    if content is None:
        fail(f"{name}.content", "is required")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = [
        req_mapping(raw, f"{name}.content[{i}]")
        for i, raw in enumerate(req_list(content, f"{name}.content"))
    ]
    if role == "assistant":
        return [_assistant(blocks, f"{name}.content")]
    return _user(blocks, f"{name}.content")


def _user(blocks: list[Mapping[str, Any]], name: str) -> list[dict[str, Any]]:
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for position, block in enumerate(blocks):
        block_name = f"{name}[{position}]"
        kind = block.get("type")
        if kind == "tool_result":
            tool_messages.append(
                {
                    "role": "tool",
                    "tool_call_id": req_str(block.get("tool_use_id"), f"{block_name}.tool_use_id"),
                    "content": _tool_result(block.get("content"), f"{block_name}.content"),
                }
            )
        else:
            parts.append(_user_part(block, kind, block_name))
    if parts or not tool_messages:
        tool_messages.append({"role": "user", "content": _join(parts, "\n")})
    return tool_messages


def _user_part(block: Mapping[str, Any], kind: object, name: str) -> dict[str, Any]:
    if kind == "text":
        return {"type": "text", "text": req_str(block.get("text"), f"{name}.text")}
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": _image_url(block, name)}}
    raise request_error(f"{name}.type", f"content block type {kind!r} cannot be translated")


def _image_url(block: Mapping[str, Any], name: str) -> str:
    source = req_mapping(block.get("source"), f"{name}.source")
    kind = source.get("type")
    if kind == "base64":
        media_type = req_str(source.get("media_type"), f"{name}.source.media_type")
        data = req_str(source.get("data"), f"{name}.source.data")
        return f"data:{media_type};base64,{data}"
    if kind == "url":
        return req_str(source.get("url"), f"{name}.source.url")
    raise request_error(f"{name}.source.type", f"image source {kind!r} cannot be translated")


def _tool_result(content: object, name: str) -> str | list[dict[str, Any]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for position, raw in enumerate(req_list(content, name)):
        block = req_mapping(raw, f"{name}[{position}]")
        parts.append(_user_part(block, block.get("type"), f"{name}[{position}]"))
    return _join(parts, "\n")


def _join(parts: list[dict[str, Any]], separator: str) -> str | list[dict[str, Any]]:
    if any(part["type"] != "text" for part in parts):
        return parts
    return separator.join(part["text"] for part in parts)


def _assistant(blocks: list[Mapping[str, Any]], name: str) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for position, block in enumerate(blocks):
        block_name = f"{name}[{position}]"
        kind = block.get("type")
        if kind == "text":
            texts.append(req_str(block.get("text"), f"{block_name}.text"))
        elif kind == "thinking":
            thinking.append(req_str(block.get("thinking"), f"{block_name}.thinking"))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            tool_input = block.get("input", {})
            calls.append(
                {
                    "id": req_str(block.get("id"), f"{block_name}.id"),
                    "type": "function",
                    "function": {
                        "name": req_str(block.get("name"), f"{block_name}.name"),
                        # A string is arguments that were not JSON; they go back as they came.
                        "arguments": tool_input
                        if isinstance(tool_input, str)
                        else dumps(tool_input),
                    },
                }
            )
        else:
            fail(f"{block_name}.type", f"content block type {kind!r} cannot be translated")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    chat_tools: list[dict[str, Any]] = []
    unsupported: list[str] = []
    for position, raw in enumerate(tools):
        name = f"tools[{position}]"
        tool = req_mapping(raw, name)
        if tool.get("type") not in _CUSTOM_TOOL_TYPES:
            unsupported.append(f"{name} ({tool.get('type')!r})")
            continue
        function: dict[str, Any] = {"name": req_str(tool.get("name"), f"{name}.name")}
        description = opt_str(tool, "description", f"{name}.description")
        if description is not None:
            function["description"] = description
        function["parameters"] = dict(req_mapping(tool.get("input_schema"), f"{name}.input_schema"))
        strict = opt_bool(tool, "strict", f"{name}.strict")
        if strict is not None:
            function["strict"] = strict
        chat_tools.append({"type": "function", "function": function})
    if unsupported:
        fail(
            "tools",
            "only custom (client) tools can be translated to Chat Completions; unsupported: "
            + ", ".join(unsupported),
        )
    return chat_tools


def _tool_choice(choice: Mapping[str, Any], chat: dict[str, Any]) -> None:
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        name = req_str(choice.get("name"), "tool_choice.name")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        fail("tool_choice.type", f"expected auto, any, tool or none, got {kind!r}")
    if opt_bool(choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _thinking(thinking: Mapping[str, Any]) -> bool:
    kind = thinking.get("type")
    if kind in ("enabled", "adaptive"):
        return True
    if kind == "disabled":
        return False
    raise request_error("thinking.type", f"expected enabled, adaptive or disabled, got {kind!r}")


# --- responses -----------------------------------------------------------------------------------


def _base(message_id: str) -> str:
    text = str(message_id)
    return text[4:] if text.startswith("msg_") and len(text) > 4 else text


def _tool_input(arguments: str) -> Any:
    if not has_text(arguments):
        return {}
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments


def _usage(usage: ChatUsage | None) -> dict[str, Any]:
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    prompt = usage.prompt
    cached = usage.cached
    if cached is not None and prompt is not None:
        cached = min(cached, prompt)
    result: dict[str, Any] = {
        "input_tokens": (prompt or 0) - (cached or 0),
        "output_tokens": usage.completion or 0,
    }
    if cached is not None:
        result["cache_read_input_tokens"] = cached
    if usage.reasoning is not None:
        result["output_tokens_details"] = {"thinking_tokens": usage.reasoning}
    return result


def _stop(
    choice: Mapping[str, Any], request: Mapping[str, Any], has_tools: bool, stop_reason: object
) -> tuple[str, str | None]:
    finish = as_str(choice.get("finish_reason"))
    if finish == "length":
        return "max_tokens", None
    if finish in ("tool_calls", "function_call") or (has_tools and finish in (None, "stop")):
        # vLLM answers a forced tool call with finish_reason "stop"; the client loops on tool_use.
        return "tool_use", None
    if finish == "content_filter":
        return "refusal", None
    stops = request.get("stop_sequences")
    if isinstance(stop_reason, str) and isinstance(stops, list) and stop_reason in stops:
        return "stop_sequence", stop_reason
    return "end_turn", None


def _model(chat: Mapping[str, Any], request: Mapping[str, Any]) -> str:
    return as_str(chat.get("model")) or as_str(request.get("model")) or ""


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": THINKING_SIGNATURE}


def _tool_use_block(tool_id: str, name: str, tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}


def chat_response_to_messages(
    chat: Mapping[str, Any], request: Mapping[str, Any], *, message_id: str
) -> dict[str, Any]:
    """A ``chat.completion`` as an Anthropic ``message``. Never raises: a malformed answer gives
    a best-effort translation."""
    answer = as_dict(chat)
    req = as_dict(request)
    choice = first_choice(answer)
    message = as_dict(choice.get("message"))
    content: list[dict[str, Any]] = []
    reasoning = reasoning_of(message)
    if reasoning is not None and has_text(reasoning):
        content.append(_thinking_block(reasoning))
    for key in ("content", "refusal"):
        text = as_str(message.get(key))
        if text is not None and has_text(text):
            content.append(_text_block(text))
    calls = tool_calls_of(message)
    base = _base(message_id)
    for ordinal, call in enumerate(calls):
        content.append(
            _tool_use_block(
                call.id or f"toolu_{base}_{ordinal}", call.name or "", _tool_input(call.arguments)
            )
        )
    stop_reason, stop_sequence = _stop(choice, req, bool(calls), choice.get("stop_reason"))
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": _model(answer, req),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(chat_usage(answer)),
    }


# --- streaming -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Block:
    kind: str  # reasoning / text / refusal / tool
    index: int
    held: list[str] = field(default_factory=list)  # leading whitespace-only argument fragments
    started_json: bool = False


class ChatToMessagesStream(ChatStreamTranslator):
    """Translates a chat SSE stream into the Anthropic Messages SSE stream, event by event.

    ``message_start`` goes out at the first chunk (usage 0/0: vLLM reports usage only at the
    end); a content block starts the moment its first non-whitespace text or its tool name
    arrives, and each chat delta becomes a ``content_block_delta`` at once (``thinking_delta``,
    ``text_delta``, ``input_json_delta``; argument fragments that are only whitespace before the
    first JSON character wait for it). Blocks start in order of arrival and may be open together;
    at ``[DONE]`` each is stopped (a thinking block after its ``signature_delta``), then
    ``message_delta`` (stop reason, final usage) and ``message_stop``. The reassembled message
    equals ``chat_response_to_messages`` of the reassembled chat answer whenever the answer's parts
    arrive in the order reasoning, text, tool calls.

    A chat error chunk gives one ``error`` event and ends the translation. ``finish()`` (the
    upstream closed) adds nothing, so a cut stream stays cut. Neither method raises.
    """

    def __init__(self, request: Mapping[str, Any], *, message_id: str) -> None:
        super().__init__()
        self._request = as_dict(request)
        self._message_id = message_id
        self._base = _base(message_id)
        self._blocks: list[_Block] = []
        self._by_kind: dict[tuple[str, int], _Block] = {}

    def _error(self, error: Mapping[str, Any]) -> list[SSEEvent]:
        return [messages_error(error)]

    def _begin(self, model: str | None) -> list[SSEEvent]:
        message: dict[str, Any] = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "model": model or as_str(self._request.get("model")) or "",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [messages_event("message_start", message=message)]

    def _apply(self, ops: list[Open | Delta], out: list[SSEEvent]) -> None:
        for op in ops:
            if isinstance(op, Open):
                self._open(op, out)
            else:
                self._delta(op, out)

    def _open(self, op: Open, out: list[SSEEvent]) -> None:
        block = _Block(op.kind, len(self._blocks))
        self._blocks.append(block)
        self._by_kind[(op.kind, op.ordinal)] = block
        start: dict[str, Any]
        if op.kind == "reasoning":
            start = {"type": "thinking", "thinking": "", "signature": ""}
        elif op.kind == "tool":
            state = self._choice.opened_tools[op.ordinal]
            tool_id = state.id or f"toolu_{self._base}_{op.ordinal}"
            start = _tool_use_block(tool_id, state.name or "", {})
        else:
            start = _text_block("")
        out.append(messages_event("content_block_start", index=block.index, content_block=start))

    def _delta(self, op: Delta, out: list[SSEEvent]) -> None:
        block = self._by_kind.get((op.kind, op.ordinal))
        if block is None:
            return
        if op.kind == "reasoning":
            delta = {"type": "thinking_delta", "thinking": op.text}
        elif op.kind == "tool":
            if not block.started_json:
                # Whitespace alone would make the client's partial JSON parser fail.
                block.held.append(op.text)
                if op.text.isspace():
                    return
                block.started_json = True
                text = "".join(block.held)
                block.held.clear()
            else:
                text = op.text
            delta = {"type": "input_json_delta", "partial_json": text}
        else:
            delta = {"type": "text_delta", "text": op.text}
        out.append(messages_event("content_block_delta", index=block.index, delta=delta))

    def _complete(self) -> list[SSEEvent]:
        out = self._start(None)
        self._apply(self._choice.close(), out)
        answer = dict(self._chat.finish().response or {})
        if self._choice.stop_reason is not None:
            # The chat reassembler keeps no per-choice stop_reason; the stop sequence is there.
            answer = _with_stop_reason(answer, self._choice.stop_reason)
        message = chat_response_to_messages(answer, self._request, message_id=self._message_id)
        for block in self._blocks:
            if block.kind == "reasoning":
                delta = {"type": "signature_delta", "signature": THINKING_SIGNATURE}
                out.append(messages_event("content_block_delta", index=block.index, delta=delta))
            out.append(messages_event("content_block_stop", index=block.index))
        out.append(
            messages_event(
                "message_delta",
                delta={
                    "stop_reason": message["stop_reason"],
                    "stop_sequence": message["stop_sequence"],
                },
                usage=message["usage"],
            )
        )
        out.append(messages_event("message_stop"))
        return out


def _with_stop_reason(answer: dict[str, Any], stop_reason: object) -> dict[str, Any]:
    choices = answer.get("choices")
    if not isinstance(choices, list):
        return answer
    patched = []
    for raw in choices:
        choice = as_dict(raw)
        index = as_count(choice.get("index"))
        if choice and (index is None or index == 0) and "stop_reason" not in choice:
            choice = {**choice, "stop_reason": stop_reason}
        patched.append(choice)
    return {**answer, "choices": patched}

"""A call's conversation in the OpenTelemetry GenAI message schema, and its size cap (pure).

The four opt-in content attributes of a GenAI span are JSON text in one shape for every provider:
``gen_ai.system_instructions`` (a list of parts), ``gen_ai.input.messages`` and
``gen_ai.output.messages`` (lists of ``{"role", "parts", "finish_reason"?}``) and
``gen_ai.tool.definitions`` (``{"type", "name", "description"?, "parameters"?}``). A part is
``{"type": "text", "content"}``, ``{"type": "reasoning", "content"}``,
``{"type": "tool_call", "id", "name", "arguments"}``, ``{"type": "tool_call_response", "id",
"response"}``, ``{"type": "uri", "modality", "uri"}``, or, for anything else, the dialect's own
block as a generic part (it keeps its ``type``).

Each function reads a request or response object of one dialect (``chat``, ``responses``,
``messages``) and never raises, whatever the input; ``None`` means the payload says nothing of
that kind. Arguments that are JSON text are parsed; an output message's ``finish_reason`` is the
record's, left out when the record has none (unknown stays absent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from rollcap._json import as_dict, as_str

__all__ = [
    "cap_json_list",
    "input_messages",
    "output_messages",
    "system_instructions",
    "tool_definitions",
]

Part = dict[str, Any]
Message = dict[str, Any]


def _arguments(value: object) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _text(content: str) -> Part:
    return {"type": "text", "content": content}


def _tool_call(call_id: object, name: object, arguments: object) -> Part:
    return {
        "type": "tool_call",
        "id": as_str(call_id),
        "name": as_str(name) or "",
        "arguments": _arguments(arguments),
    }


def _tool_response(call_id: object, response: object) -> Part:
    return {"type": "tool_call_response", "id": as_str(call_id), "response": response}


def _image(url: object) -> Part:
    return {"type": "uri", "modality": "image", "uri": url}


def _block_texts(blocks: object) -> list[str]:
    """The ``text`` of each block in a list (Responses summaries, Anthropic tool results)."""
    if not isinstance(blocks, list):
        return []
    return [text for block in blocks if (text := as_str(as_dict(block).get("text"))) is not None]


# --- chat ---------------------------------------------------------------------------------------


def _chat_content(content: object) -> list[Part]:
    if isinstance(content, str):
        return [_text(content)] if content else []
    parts: list[Part] = []
    for item in content if isinstance(content, list) else ():
        block = as_dict(item)
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(_text(block["text"]))
        elif kind == "image_url":
            parts.append(_image(as_dict(block.get("image_url")).get("url")))
        elif block:
            parts.append(dict(block))
    return parts


def _chat_message(message: Mapping[str, Any]) -> Message:
    role = as_str(message.get("role")) or "user"
    parts: list[Part] = []
    for key in ("reasoning_content", "reasoning"):
        if reasoning := as_str(message.get(key)):
            parts.append({"type": "reasoning", "content": reasoning})
            break
    if role == "tool":
        content = message.get("content")
        texts = _block_texts(content)
        response = content if isinstance(content, str) or not texts else "".join(texts)
        parts.append(_tool_response(message.get("tool_call_id"), response))
    else:
        parts.extend(_chat_content(message.get("content")))
    for item in message.get("tool_calls") or ():
        call = as_dict(item)
        function = as_dict(call.get("function"))
        parts.append(_tool_call(call.get("id"), function.get("name"), function.get("arguments")))
    return {"role": role, "parts": parts}


# --- responses ----------------------------------------------------------------------------------

_RESPONSES_TEXT = frozenset(("input_text", "output_text", "text", "refusal"))


def _responses_content(content: object) -> list[Part]:
    if isinstance(content, str):
        return [_text(content)] if content else []
    parts: list[Part] = []
    for item in content if isinstance(content, list) else ():
        block = as_dict(item)
        kind = block.get("type")
        text = as_str(block.get("text")) or as_str(block.get("refusal"))
        if kind in _RESPONSES_TEXT and text is not None:
            parts.append(_text(text))
        elif kind == "input_image" and "image_url" in block:
            parts.append(_image(block["image_url"]))
        elif block:
            parts.append(dict(block))
    return parts


def _responses_item(item: Mapping[str, Any]) -> Message:
    kind = as_str(item.get("type")) or "message"
    if kind == "message":
        role = as_str(item.get("role")) or "user"
        return {"role": role, "parts": _responses_content(item.get("content"))}
    if kind == "function_call":
        call_id = item.get("call_id") or item.get("id")
        call = _tool_call(call_id, item.get("name"), item.get("arguments"))
        return {"role": "assistant", "parts": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "parts": [_tool_response(item.get("call_id"), item.get("output"))]}
    if kind == "reasoning":
        texts = _block_texts(item.get("summary")) or _block_texts(item.get("content"))
        return {"role": "assistant", "parts": [{"type": "reasoning", "content": "\n".join(texts)}]}
    # Another item (a built-in tool's call or its output): kept whole as a generic part.
    other_role = as_str(item.get("role")) or ("tool" if kind.endswith("_output") else "assistant")
    return {"role": other_role, "parts": [dict(item)]}


def _responses_output(items: object, finish_reason: str | None) -> list[Message]:
    parts: list[Part] = []
    for item in items if isinstance(items, list) else ():
        parts.extend(_responses_item(as_dict(item))["parts"])
    return [_output_message(parts, finish_reason)]


# --- messages -----------------------------------------------------------------------------------


def _messages_blocks(content: object) -> list[Part]:
    if isinstance(content, str):
        return [_text(content)] if content else []
    parts: list[Part] = []
    for item in content if isinstance(content, list) else ():
        block = as_dict(item)
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(_text(block["text"]))
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            parts.append({"type": "reasoning", "content": block["thinking"]})
        elif kind == "tool_use":
            parts.append(_tool_call(block.get("id"), block.get("name"), block.get("input")))
        elif kind == "tool_result":
            result = block.get("content")
            texts = _block_texts(result)
            response = result if isinstance(result, str) or not texts else "".join(texts)
            parts.append(_tool_response(block.get("tool_use_id"), response))
        elif kind == "image" and as_dict(block.get("source")).get("type") == "url":
            parts.append(_image(as_dict(block.get("source")).get("url")))
        elif kind == "redacted_thinking":
            parts.append({"type": "redacted_thinking"})  # encrypted: nothing to read
        elif block:
            parts.append(dict(block))
    return parts


# --- the four attributes ------------------------------------------------------------------------


def _output_message(parts: list[Part], finish_reason: str | None) -> Message:
    message: Message = {"role": "assistant", "parts": parts}
    if finish_reason is not None:
        message["finish_reason"] = finish_reason
    return message


def system_instructions(dialect: str, request: Mapping[str, Any] | None) -> list[Part] | None:
    """Instructions given apart from the messages: Responses ``instructions``, Messages
    ``system``. Chat system messages stay in the input messages, where the client put them."""
    body = as_dict(request)
    if dialect == "responses" and (text := as_str(body.get("instructions"))):
        return [_text(text)]
    if dialect == "messages":
        parts = _messages_blocks(body.get("system"))
        return parts or None
    return None


def input_messages(dialect: str, request: Mapping[str, Any] | None) -> list[Message] | None:
    body = as_dict(request)
    if dialect == "chat" and isinstance(body.get("messages"), list):
        return [_chat_message(as_dict(m)) for m in body["messages"]]
    if dialect == "responses":
        items = body.get("input")
        if isinstance(items, str):
            return [{"role": "user", "parts": [_text(items)]}]
        if isinstance(items, list):
            return [_responses_item(as_dict(item)) for item in items]
    if dialect == "messages" and isinstance(body.get("messages"), list):
        return [
            {
                "role": as_str(as_dict(m).get("role")) or "user",
                "parts": _messages_blocks(as_dict(m).get("content")),
            }
            for m in body["messages"]
        ]
    return None


def output_messages(
    dialect: str, response: Mapping[str, Any] | None, finish_reason: str | None
) -> list[Message] | None:
    """The answer: one message per chat choice, one message for the other dialects.

    An error body (no ``choices``, ``output`` or ``content``) has no output messages.
    """
    body = as_dict(response)
    if dialect == "chat" and isinstance(body.get("choices"), list):
        out = []
        for item in body["choices"]:
            choice = as_dict(item)
            message = _chat_message(as_dict(choice.get("message")))
            reason = as_str(choice.get("finish_reason")) or finish_reason
            out.append(_output_message(message["parts"], reason))
        return out
    if dialect == "responses" and isinstance(body.get("output"), list):
        return _responses_output(body["output"], finish_reason)
    if dialect == "messages" and isinstance(body.get("content"), list):
        return [_output_message(_messages_blocks(body["content"]), finish_reason)]
    return None


def tool_definitions(dialect: str, request: Mapping[str, Any] | None) -> list[Part] | None:
    tools = as_dict(request).get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    out: list[Part] = []
    for item in tools:
        tool = as_dict(item)
        if dialect == "chat" and tool.get("type") == "function":
            function = as_dict(tool.get("function"))
            out.append({"type": "function", **function})
        elif dialect == "messages" and "input_schema" in tool:
            definition = {k: v for k, v in tool.items() if k != "input_schema"}
            out.append({"type": "function", **definition, "parameters": tool["input_schema"]})
        elif tool:
            out.append(dict(tool))
    return out


def cap_json_list(items: Sequence[Any], max_bytes: int) -> tuple[str, bool]:
    """``items`` as JSON text of at most ``max_bytes`` bytes, and whether anything was cut.

    When the whole list is too long, the longest run of its *last* items that fits is kept (the
    newest messages are the ones a reader looks for), so the text stays valid JSON. When not
    even the last item fits, the text of the whole list is cut at a character boundary and is
    no longer valid JSON; the flag says so either way.
    """
    encoded = [orjson.dumps(item) for item in items]
    total = 2 + sum(len(e) for e in encoded) + max(len(encoded) - 1, 0)
    if total <= max_bytes:
        return "[" + b",".join(encoded).decode() + "]", False
    kept: list[bytes] = []
    size = 2
    for item in reversed(encoded):
        extra = len(item) + (1 if kept else 0)
        if size + extra > max_bytes:
            break
        kept.append(item)
        size += extra
    if kept:
        return "[" + b",".join(reversed(kept)).decode() + "]", True
    whole = b"[" + b",".join(encoded) + b"]"
    return whole[:max_bytes].decode(errors="ignore"), True

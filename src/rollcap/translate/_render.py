"""A complete response object as the SSE events its API would have streamed (pure).

Used to replay a buffered answer to a client that asked for ``stream: true``. Each text goes out
as a single delta. The rendered stream reassembles (``rollcap.dialects.reassemble``) to the object
it came from whenever that object has the shape the reassembler builds: every Responses and
Messages object, and a ``chat.completion`` whose tool calls carry their stream ``index`` (a
non-streamed one gains it) and without an empty ``tool_calls`` list or ``usage: null``.

- ``responses``: ``response.created`` and ``response.in_progress`` carrying the response without
  output (status ``in_progress``, no usage), each output item with its part and text events, then
  ``response.completed`` / ``.incomplete`` / ``.failed`` by status; another status (a cut
  response) gets no terminal event, as it was cut.
- ``chat``: per choice one chunk with the whole message as its delta (tool calls as indexed
  fragments) and the choice's own keys, and one with the finish reason, a usage chunk when the
  response has usage, then ``[DONE]``. Every top-level key goes on each chunk.
- ``messages``: ``message_start`` (the message without content, stop reason not yet set), each
  block's start / deltas / stop, ``message_delta`` (stop reason and usage), ``message_stop``.

Never raises on a malformed object: what is not an object is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollcap._json import as_dict, as_str
from rollcap.sse import SSEEvent
from rollcap.translate._common import DONE, dumps
from rollcap.translate._events import ResponsesEvents, chat_event, messages_event

__all__ = ["render_sse"]

_RESPONSES_TERMINALS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}
# Keys the terminal event fills in; the opening snapshot has them empty, as the API sends it.
_RESPONSES_LATE_KEYS = ("usage", "incomplete_details", "error", "completed_at")


def render_sse(dialect: str, response: Mapping[str, Any]) -> list[SSEEvent]:
    """The events ``dialect``'s streaming API would have sent for ``response``."""
    body = as_dict(response)
    if dialect == "responses":
        return _responses(body)
    if dialect == "chat":
        return _chat(body)
    if dialect == "messages":
        return _messages(body)
    raise ValueError(f"unknown dialect {dialect!r}: expected responses, chat or messages")


# --- responses -----------------------------------------------------------------------------------


def _responses(response: Mapping[str, Any]) -> list[SSEEvent]:
    emit = ResponsesEvents()
    terminal = _RESPONSES_TERMINALS.get(as_str(response.get("status")) or "")
    snapshot = dict(response)
    snapshot["output"] = []
    if terminal is not None:
        snapshot["status"] = "in_progress"
        for key in _RESPONSES_LATE_KEYS:
            if key in snapshot:
                snapshot[key] = None
    out = [
        emit("response.created", response=snapshot),
        emit("response.in_progress", response=snapshot),
    ]
    output = response.get("output")
    items = (
        [item for item in output if isinstance(item, Mapping)] if isinstance(output, list) else []
    )
    for index, item in enumerate(items):
        _responses_item(emit, index, item, out)
    if terminal is not None:
        out.append(emit(terminal, response=response))
    return out


def _responses_item(
    emit: ResponsesEvents, index: int, item: Mapping[str, Any], out: list[SSEEvent]
) -> None:
    kind = item.get("type")
    skeleton = dict(item)
    if "status" in skeleton:
        skeleton["status"] = "in_progress"
    where = {"item_id": item.get("id"), "output_index": index}
    parts: list[Any] = []
    summary: list[Any] = []
    if kind in ("message", "reasoning") and isinstance(item.get("content"), list):
        parts = item["content"]
        skeleton["content"] = []
    if kind == "reasoning" and isinstance(item.get("summary"), list):
        summary = item["summary"]
        skeleton["summary"] = []
    text_field = {"function_call": "arguments", "custom_tool_call": "input"}.get(str(kind))
    text = as_str(item.get(text_field)) if text_field else None
    if text_field is not None and text is not None:
        skeleton[text_field] = ""
    out.append(emit("response.output_item.added", output_index=index, item=skeleton))
    for summary_index, raw in enumerate(summary):
        part = as_dict(raw)
        text_value = as_str(part.get("text")) or ""
        at = {**where, "summary_index": summary_index}
        out.append(emit("response.reasoning_summary_part.added", **at, part={**part, "text": ""}))
        if text_value:
            out.append(emit("response.reasoning_summary_text.delta", **at, delta=text_value))
        out.append(emit("response.reasoning_summary_text.done", **at, text=text_value))
        out.append(emit("response.reasoning_summary_part.done", **at, part=raw))
    for content_index, raw in enumerate(parts):
        _responses_part(emit, {**where, "content_index": content_index}, raw, out)
    if text_field is not None and text:
        name = "function_call_arguments" if kind == "function_call" else "custom_tool_call_input"
        out.append(emit(f"response.{name}.delta", **where, delta=text))
    if text_field is not None and text is not None:
        name = "function_call_arguments" if kind == "function_call" else "custom_tool_call_input"
        out.append(emit(f"response.{name}.done", **where, **{text_field: text}))
    out.append(emit("response.output_item.done", output_index=index, item=item))


def _responses_part(
    emit: ResponsesEvents, at: dict[str, Any], raw: object, out: list[SSEEvent]
) -> None:
    part = as_dict(raw)
    kind = part.get("type")
    if kind == "output_text":
        text = as_str(part.get("text")) or ""
        logprobs = part.get("logprobs")
        added = {**part, "text": "", "annotations": []}
        out.append(emit("response.content_part.added", **at, part=added))
        if text:
            out.append(emit("response.output_text.delta", **at, delta=text, logprobs=[]))
        annotations = part.get("annotations")
        for position, annotation in enumerate(annotations if isinstance(annotations, list) else ()):
            out.append(
                emit(
                    "response.output_text.annotation.added",
                    **at,
                    annotation_index=position,
                    annotation=annotation,
                )
            )
        done_logprobs = logprobs if isinstance(logprobs, list) else []
        out.append(emit("response.output_text.done", **at, text=text, logprobs=done_logprobs))
    elif kind in ("refusal", "reasoning_text"):
        field = "refusal" if kind == "refusal" else "text"
        text = as_str(part.get(field)) or ""
        name = "response.refusal" if kind == "refusal" else "response.reasoning_text"
        out.append(emit("response.content_part.added", **at, part={**part, field: ""}))
        if text:
            out.append(emit(f"{name}.delta", **at, delta=text))
        out.append(emit(f"{name}.done", **at, **{field: text}))
    else:
        out.append(emit("response.content_part.added", **at, part=raw))
    out.append(emit("response.content_part.done", **at, part=raw))


# --- chat ----------------------------------------------------------------------------------------


# Top-level and choice keys with a rule of their own; every other key goes out as it is.
_CHAT_OWN_KEYS = frozenset({"choices", "usage", "object"})
_CHAT_CHOICE_KEYS = frozenset({"index", "message", "logprobs", "finish_reason"})


def _chat(response: Mapping[str, Any]) -> list[SSEEvent]:
    base: dict[str, Any] = {"id": None, "created": None, "model": None}
    base.update((k, v) for k, v in response.items() if k not in _CHAT_OWN_KEYS)
    base["object"] = "chat.completion.chunk"
    out: list[SSEEvent] = []
    choices = response.get("choices")
    for position, raw in enumerate(choices if isinstance(choices, list) else ()):
        choice = as_dict(raw)
        if not choice:
            continue
        index = choice.get("index", position)
        delta = _chat_delta(as_dict(choice.get("message")))
        # The choice's own keys (vLLM's token_ids, stop_reason) ride on its first chunk.
        own = {k: v for k, v in choice.items() if k not in _CHAT_CHOICE_KEYS}
        first = {**own, "index": index, "delta": delta, "logprobs": choice.get("logprobs")}
        out.append(chat_event({**base, "choices": [{**first, "finish_reason": None}]}))
        finish = choice.get("finish_reason")
        if finish is not None:
            last = {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}
            out.append(chat_event({**base, "choices": [last]}))
    if isinstance(response.get("usage"), Mapping):
        out.append(chat_event({**base, "choices": [], "usage": response["usage"]}))
    out.append(chat_event(DONE))
    return out


def _chat_delta(message: Mapping[str, Any]) -> dict[str, Any]:
    # Every key of the message goes out as it is (the reassembler merges each back), but
    # tool calls, which stream as indexed fragments.
    delta: dict[str, Any] = {k: v for k, v in message.items() if k != "tool_calls"}
    delta["role"] = as_str(message.get("role")) or "assistant"
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        fragments = []
        for position, raw in enumerate(calls):
            call = as_dict(raw)
            function = as_dict(call.get("function"))
            fragment: dict[str, Any] = {**call, "index": call.get("index", position)}
            fragment["type"] = call.get("type") or "function"
            fragment["function"] = {**function, "arguments": function.get("arguments") or ""}
            fragments.append(fragment)
        delta["tool_calls"] = fragments
    return delta


# --- messages ------------------------------------------------------------------------------------


_MESSAGE_DELTA_KEYS = ("stop_reason", "stop_sequence", "stop_details")
# Block type -> the fields streamed as deltas, each with its delta type.
_TEXT_DELTAS = {
    "text": (("text", "text_delta"),),
    "thinking": (("thinking", "thinking_delta"), ("signature", "signature_delta")),
}


def _messages(message: Mapping[str, Any]) -> list[SSEEvent]:
    start = {key: value for key, value in message.items() if key != "content"}
    start["content"] = []
    for key in _MESSAGE_DELTA_KEYS:
        if key in start:
            start[key] = None
    out = [messages_event("message_start", message=start)]
    content = message.get("content")
    blocks = [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []
    for index, block in enumerate(blocks):
        _messages_block(index, block, out)
    delta = {key: message[key] for key in _MESSAGE_DELTA_KEYS if key in message}
    usage = message.get("usage")
    out.append(
        messages_event(
            "message_delta", delta=delta, usage=dict(usage) if isinstance(usage, Mapping) else {}
        )
    )
    out.append(messages_event("message_stop"))
    return out


def _messages_block(index: int, block: Mapping[str, Any], out: list[SSEEvent]) -> None:
    start = dict(block)
    deltas: list[dict[str, Any]] = []
    kind = block.get("type")
    for field, delta_type in _TEXT_DELTAS.get(str(kind), ()):
        text = as_str(block.get(field))
        if text is not None:
            start[field] = ""
            if text:
                deltas.append({"type": delta_type, field: text})
    citations = block.get("citations")
    if isinstance(citations, list) and kind == "text":
        start["citations"] = []
        deltas.extend({"type": "citations_delta", "citation": c} for c in citations)
    if kind in ("tool_use", "server_tool_use") and "input" in block:
        tool_input = block["input"]
        partial = tool_input if isinstance(tool_input, str) else dumps(tool_input)
        if partial and tool_input != {}:
            start["input"] = {}
            deltas.append({"type": "input_json_delta", "partial_json": partial})
    out.append(messages_event("content_block_start", index=index, content_block=start))
    out.extend(messages_event("content_block_delta", index=index, delta=d) for d in deltas)
    out.append(messages_event("content_block_stop", index=index))

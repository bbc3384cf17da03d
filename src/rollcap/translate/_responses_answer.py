"""Chat Completions answers and streams as OpenAI Responses ones (pure).

Response rules (``chat_response_to_responses``): output items are a reasoning item (one
``summary_text`` part), a message item (``output_text``, then ``refusal``), then one
``function_call`` item per tool call, each only when it has non-whitespace text (a tool call
always). A tool call whose name is in the request's ``namespaced_tool_names`` table becomes a
``function_call`` with the inner ``name`` and the ``namespace``; any other name is kept whole, with
no ``namespace`` field. An answer with none of them gets one message item with the (possibly empty)
text, so ``output_text`` always has a message to read. Ids derive from ``response_id`` (``resp_X``
gives ``rs_X``, ``msg_X``, ``fc_X_<n>``; ``call_X_<n>`` for a call the upstream gave no id). Status
is ``incomplete`` (reason ``max_output_tokens``) for finish reason ``length``, ``incomplete``
(``content_filter``) for ``content_filter``, else ``completed``. ``usage`` is ``null`` when the
answer reported none; the detail counts (``cached_tokens``, ``reasoning_tokens``) are ``null`` when
the upstream did not report them (the SDKs read them as ``None``): a made-up 0 would be captured as
a measured zero.

Streaming (``ChatToResponsesStream``): see its docstring. Requests go the other way in
``_responses_request``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollcap._json import as_count, as_dict, as_str
from rollcap.sse import SSEEvent
from rollcap.translate._common import (
    ChatStreamTranslator,
    ChatUsage,
    Delta,
    Open,
    chat_usage,
    first_choice,
    has_text,
    reasoning_of,
    tool_calls_of,
)
from rollcap.translate._events import (
    ResponsesEvents,
    function_call_item,
    message_item,
    output_text_part,
    reasoning_item,
    refusal_part,
    responses_error_fields,
)
from rollcap.translate._responses_request import namespaced_tool_names, split_name

__all__ = ["ChatToResponsesStream", "chat_response_to_responses"]


# --- responses -----------------------------------------------------------------------------------


class _Ids:
    __slots__ = ("base", "message", "reasoning")

    def __init__(self, response_id: str) -> None:
        text = str(response_id)
        self.base = text[5:] if text.startswith("resp_") and len(text) > 5 else text
        self.reasoning = f"rs_{self.base}"
        self.message = f"msg_{self.base}"

    def function_call(self, ordinal: int) -> str:
        return f"fc_{self.base}_{ordinal}"

    def call_id(self, ordinal: int) -> str:
        return f"call_{self.base}_{ordinal}"


def _model(chat: Mapping[str, Any], request: Mapping[str, Any]) -> str:
    return as_str(chat.get("model")) or as_str(request.get("model")) or ""


def _status(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _usage(usage: ChatUsage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    total = usage.total
    if total is None and usage.prompt is not None and usage.completion is not None:
        total = usage.prompt + usage.completion
    return {
        "input_tokens": usage.prompt or 0,
        # null, not 0, when upstream did not say: a capture must not turn unknown into zero.
        "input_tokens_details": {"cached_tokens": usage.cached},
        "output_tokens": usage.completion or 0,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning},
        "total_tokens": total or 0,
    }


def _envelope(
    request: Mapping[str, Any], response_id: str, created_at: float, model: str
) -> dict[str, Any]:
    """The response object around the output, echoing the request the way the API does."""
    reasoning = as_dict(request.get("reasoning"))
    number = {key: request.get(key) for key in ("temperature", "top_p")}
    for key, value in number.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            number[key] = None
    text = request.get("text")
    tool_choice = request.get("tool_choice")
    tools = request.get("tools")
    metadata = request.get("metadata")
    parallel = request.get("parallel_tool_calls")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": as_str(request.get("instructions")),
        "max_output_tokens": as_count(request.get("max_output_tokens")),
        "model": model,
        "output": [],
        "parallel_tool_calls": parallel if isinstance(parallel, bool) else True,
        "previous_response_id": None,
        "reasoning": {
            "effort": as_str(reasoning.get("effort")),
            "summary": as_str(reasoning.get("summary")),
        },
        "store": False,
        "temperature": number["temperature"],
        "text": copy.deepcopy(dict(text))
        if isinstance(text, Mapping)
        else {"format": {"type": "text"}},
        "tool_choice": (
            copy.deepcopy(tool_choice) if isinstance(tool_choice, str | Mapping) else "auto"
        ),
        "tools": copy.deepcopy(tools) if isinstance(tools, list) else [],
        "top_p": number["top_p"],
        "truncation": "disabled",
        "usage": None,
        "user": as_str(request.get("user")),
        "metadata": copy.deepcopy(dict(metadata)) if isinstance(metadata, Mapping) else {},
    }


def _content_text(value: object) -> str | None:
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, list):
        # Some servers answer with content parts; their text is the answer.
        return "".join(
            text for part in value if (text := as_str(as_dict(part).get("text"))) is not None
        )
    return None


def chat_response_to_responses(
    chat: Mapping[str, Any],
    request: Mapping[str, Any],
    *,
    response_id: str,
    created_at: float,
) -> dict[str, Any]:
    """A ``chat.completion`` as the Responses ``response`` object. Never raises: a malformed
    answer gives a best-effort translation."""
    answer = as_dict(chat)
    req = as_dict(request)
    ids = _Ids(response_id)
    choice = first_choice(answer)
    message = as_dict(choice.get("message"))
    status, incomplete = _status(as_str(choice.get("finish_reason")))
    item_status = "completed" if status == "completed" else "incomplete"
    output: list[dict[str, Any]] = []
    reasoning = reasoning_of(message)
    if reasoning is not None and has_text(reasoning):
        output.append(reasoning_item(ids.reasoning, reasoning))
    content = _content_text(message.get("content"))
    parts: list[dict[str, Any]] = []
    if content is not None and has_text(content):
        parts.append(output_text_part(content))
    refusal = as_str(message.get("refusal"))
    if refusal is not None and has_text(refusal):
        parts.append(refusal_part(refusal))
    if parts:
        output.append(message_item(ids.message, parts, item_status))
    names = namespaced_tool_names(req)
    for ordinal, call in enumerate(tool_calls_of(message)):
        namespace, name = split_name(call.name or "", names)
        output.append(
            function_call_item(
                ids.function_call(ordinal),
                call.id or ids.call_id(ordinal),
                name,
                call.arguments,
                item_status,
                namespace,
            )
        )
    if not output:
        output.append(message_item(ids.message, [output_text_part(content or "")], item_status))
    response = _envelope(req, response_id, created_at, _model(answer, req))
    response["status"] = status
    response["incomplete_details"] = incomplete
    response["output"] = output
    response["usage"] = _usage(chat_usage(answer))
    return response


# --- streaming -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Item:
    kind: str  # reasoning / message / tool
    output_index: int
    item_id: str
    parts: list[str] = field(default_factory=list)  # a message's part kinds, in content order
    ordinal: int = 0
    call_id: str = ""
    name: str = ""
    namespace: str | None = None


class ChatToResponsesStream(ChatStreamTranslator):
    """Translates a chat SSE stream into the Responses SSE stream, event by event.

    ``feed(event)`` returns the Responses events the chat event makes, at once: the
    ``response.created`` / ``response.in_progress`` pair at the first chunk, then an output item
    (and its part) the moment its first non-whitespace text or its tool name arrives, then a delta
    per chat delta. Items are opened in order of arrival and may be open together (text can
    follow a tool call); all are closed (``*.done`` events) when ``[DONE]`` arrives, followed by
    ``response.completed`` or ``response.incomplete``, whose ``response`` is
    ``chat_response_to_responses`` of the reassembled chat answer with the streamed items in
    their streamed order. Every event carries a running ``sequence_number``.

    A chat error chunk gives one Responses ``error`` event and ends the translation. ``finish()``
    (the upstream closed) adds nothing: a stream cut before ``[DONE]`` stays cut, so the client
    sees a truncated stream, never a made-up success. Neither method raises.
    """

    def __init__(self, request: Mapping[str, Any], *, response_id: str, created_at: float) -> None:
        super().__init__()
        self._request = as_dict(request)
        self._response_id = response_id
        self._created_at = created_at
        self._ids = _Ids(response_id)
        self._names = namespaced_tool_names(self._request)
        self._emit = ResponsesEvents()
        self._items: list[_Item] = []
        self._message: _Item | None = None
        self._reasoning: _Item | None = None
        self._tools: dict[int, _Item] = {}

    def _error(self, error: Mapping[str, Any]) -> list[SSEEvent]:
        return [self._emit("error", **responses_error_fields(error))]

    # -- opening

    def _begin(self, model: str | None) -> list[SSEEvent]:
        snapshot = _envelope(
            self._request,
            self._response_id,
            self._created_at,
            model or as_str(self._request.get("model")) or "",
        )
        return [
            self._emit("response.created", response=snapshot),
            self._emit("response.in_progress", response=snapshot),
        ]

    def _apply(self, ops: list[Open | Delta], out: list[SSEEvent]) -> None:
        for op in ops:
            if isinstance(op, Open):
                self._open(op, out)
            else:
                self._delta(op, out)

    def _add_item(self, item: _Item, body: dict[str, Any], out: list[SSEEvent]) -> None:
        self._items.append(item)
        out.append(
            self._emit("response.output_item.added", output_index=item.output_index, item=body)
        )

    def _open(self, op: Open, out: list[SSEEvent]) -> None:
        index = len(self._items)
        if op.kind == "reasoning":
            item = self._reasoning = _Item("reasoning", index, self._ids.reasoning)
            body = {"id": item.item_id, "type": "reasoning", "summary": []}
            self._add_item(item, body, out)
            out.append(
                self._emit(
                    "response.reasoning_summary_part.added",
                    item_id=item.item_id,
                    output_index=index,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        elif op.kind == "tool":
            state = self._choice.opened_tools[op.ordinal]
            namespace, name = split_name(state.name or "", self._names)
            item = _Item(
                "tool",
                index,
                self._ids.function_call(op.ordinal),
                ordinal=op.ordinal,
                call_id=state.id or self._ids.call_id(op.ordinal),
                name=name,
                namespace=namespace,
            )
            self._tools[op.ordinal] = item
            body = function_call_item(
                item.item_id, item.call_id, item.name, "", "in_progress", item.namespace
            )
            self._add_item(item, body, out)
        else:
            message = self._message
            if message is None:
                message = self._message = _Item("message", index, self._ids.message)
                self._add_item(message, message_item(message.item_id, [], "in_progress"), out)
            message.parts.append(op.kind)
            part = output_text_part("") if op.kind == "text" else refusal_part("")
            out.append(
                self._emit(
                    "response.content_part.added",
                    item_id=message.item_id,
                    output_index=message.output_index,
                    content_index=len(message.parts) - 1,
                    part=part,
                )
            )

    def _delta(self, op: Delta, out: list[SSEEvent]) -> None:
        if op.kind == "reasoning" and self._reasoning is not None:
            item = self._reasoning
            out.append(
                self._emit(
                    "response.reasoning_summary_text.delta",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    summary_index=0,
                    delta=op.text,
                )
            )
        elif op.kind == "tool" and op.ordinal in self._tools:
            item = self._tools[op.ordinal]
            out.append(
                self._emit(
                    "response.function_call_arguments.delta",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    delta=op.text,
                )
            )
        elif self._message is not None and op.kind in self._message.parts:
            message = self._message
            fields: dict[str, Any] = {"delta": op.text}
            if op.kind == "text":
                kind = "response.output_text.delta"
                fields["logprobs"] = []
            else:
                kind = "response.refusal.delta"
            out.append(
                self._emit(
                    kind,
                    item_id=message.item_id,
                    output_index=message.output_index,
                    content_index=message.parts.index(op.kind),
                    **fields,
                )
            )

    # -- closing

    def _complete(self) -> list[SSEEvent]:
        out = self._start(None)
        self._apply(self._choice.close(), out)
        answer = self._chat.finish().response or {}
        response = chat_response_to_responses(
            answer, self._request, response_id=self._response_id, created_at=self._created_at
        )
        if not self._items:
            held = self._choice.text("text")
            self._apply([Open("text"), *([Delta("text", held)] if held else [])], out)
        status = "completed" if response["status"] == "completed" else "incomplete"
        output = [self._close(item, status, out) for item in self._items]
        response["output"] = output
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        out.append(self._emit(kind, response=response))
        return out

    def _close(self, item: _Item, status: str, out: list[SSEEvent]) -> dict[str, Any]:
        where = {"item_id": item.item_id, "output_index": item.output_index}
        if item.kind == "reasoning":
            text = self._choice.text("reasoning")
            out.append(
                self._emit(
                    "response.reasoning_summary_text.done", **where, summary_index=0, text=text
                )
            )
            out.append(
                self._emit(
                    "response.reasoning_summary_part.done",
                    **where,
                    summary_index=0,
                    part={"type": "summary_text", "text": text},
                )
            )
            body = reasoning_item(item.item_id, text)
        elif item.kind == "tool":
            arguments = "".join(self._choice.opened_tools[item.ordinal].arguments)
            out.append(
                self._emit("response.function_call_arguments.done", **where, arguments=arguments)
            )
            body = function_call_item(
                item.item_id, item.call_id, item.name, arguments, status, item.namespace
            )
        else:
            parts: list[dict[str, Any]] = []
            for content_index, kind in enumerate(item.parts):
                text = self._choice.text(kind)
                if kind == "text":
                    part = output_text_part(text)
                    out.append(
                        self._emit(
                            "response.output_text.done",
                            **where,
                            content_index=content_index,
                            text=text,
                            logprobs=[],
                        )
                    )
                else:
                    part = refusal_part(text)
                    out.append(
                        self._emit(
                            "response.refusal.done",
                            **where,
                            content_index=content_index,
                            refusal=text,
                        )
                    )
                parts.append(part)
                out.append(
                    self._emit(
                        "response.content_part.done",
                        **where,
                        content_index=content_index,
                        part=part,
                    )
                )
            body = message_item(item.item_id, parts, status)
        out.append(
            self._emit("response.output_item.done", output_index=item.output_index, item=body)
        )
        return body

"""The OpenAI Responses API dialect: normalize a response, spot the end of a stream, reassemble one.

A stream ends with ``response.completed``, ``response.incomplete`` or ``response.failed`` (each
carrying the whole response object) or with a top-level ``error`` event. When no such response
object arrives, the reassembler rebuilds one from the latest ``response.created`` /
``response.in_progress`` snapshot plus the output item, content part and delta events, so a cut
stream still yields everything that was received.

For a stream that completes, the result is what the official ``openai`` SDK's
``responses.stream(...).get_final_response()`` returns: the terminal event's response, and when
that response comes without its ``output`` (some servers leave it out), the output rebuilt from
the stream's finished items. The SDK gives nothing for a stream that fails or is cut; this still
gives everything received. Keys of the other events that are about the transport
(``sequence_number``, ``obfuscation``) stay in the raw stream only.

An event's type is its data's ``"type"``, else the SSE event name; an event whose data is not a JSON
object is ignored everywhere (it is neither terminal nor applied).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rollcap._json import as_count, as_dict, as_str, load_json_object
from rollcap.dialects._base import (
    PIECE_OVERHEAD,
    Normalized,
    Reassembly,
    StreamOutcome,
    ToolCall,
    Usage,
    kept_piece,
    openai_error,
    openai_usage,
    parse_arguments,
)
from rollcap.sse import SSEEvent

__all__ = ["NAME", "StreamReassembler", "error_body", "is_terminal_event", "normalize", "usage"]

NAME = "responses"

_COMPLETED = "response.completed"
_INCOMPLETE = "response.incomplete"
_FAILED = "response.failed"
_ERROR = "error"
_RESPONSE_TERMINALS = {
    _COMPLETED: StreamOutcome.COMPLETED,
    _INCOMPLETE: StreamOutcome.INCOMPLETE,
    _FAILED: StreamOutcome.ERROR,
}
_TERMINAL_TYPES = frozenset({*_RESPONSE_TERMINALS, _ERROR})
_SNAPSHOT_TYPES = frozenset({"response.created", "response.in_progress", "response.queued"})
_ERROR_FIELDS = ("code", "message", "param")


# --- normalize -----------------------------------------------------------------------------------


def usage(response: Mapping[str, Any]) -> Usage:
    """Only the token counts of ``normalize``: what aggregation needs, without the rest."""
    return _usage(as_dict(response).get("usage"))


def normalize(response: Mapping[str, Any]) -> Normalized:
    """Read a Responses object (non-streamed or reassembled). Never raises."""
    body = as_dict(response)
    output = body.get("output")
    items = (
        [item for item in output if isinstance(item, Mapping)] if isinstance(output, list) else []
    )
    return Normalized(
        response_id=as_str(body.get("id")),
        model=as_str(body.get("model")),
        response_status=as_str(body.get("status")),
        finish_reason=as_str(as_dict(body.get("incomplete_details")).get("reason")),
        usage=usage(body),
        tool_calls=tuple(call for item in items if (call := _tool_call(item)) is not None),
        reasoning_content=_reasoning_content(items),
    )


def _usage(value: object) -> Usage:
    return openai_usage(as_dict(value), "input", "output")


def _tool_call(item: Mapping[str, Any]) -> ToolCall | None:
    kind = item.get("type")
    if kind == "function_call":
        arguments = item.get("arguments")
    elif kind == "custom_tool_call":
        arguments = item.get("input")
    else:
        return None
    call_id = as_str(item.get("call_id"))
    return ToolCall(
        call_id=call_id if call_id is not None else as_str(item.get("id")),
        name=as_str(item.get("name")),
        arguments=parse_arguments(arguments),
    )


def _reasoning_content(items: list[Mapping[str, Any]]) -> str | None:
    texts: list[str] = []
    for item in items:
        if item.get("type") != "reasoning":
            continue
        summary = item.get("summary")
        if isinstance(summary, list):
            texts.extend(_part_texts(summary, None))
        content = item.get("content")
        if isinstance(content, list):
            texts.extend(_part_texts(content, "reasoning_text"))
    return "\n".join(texts) if texts else None


def _part_texts(parts: list[Any], kind: str | None) -> list[str]:
    # Empty texts are skipped: a part that was opened but got no text adds no blank line.
    texts = []
    for part in parts:
        if isinstance(part, Mapping) and (kind is None or part.get("type") == kind):
            text = part.get("text")
            if isinstance(text, str) and text:
                texts.append(text)
    return texts


# --- terminal events -----------------------------------------------------------------------------


def _event_type(event: SSEEvent, data: Mapping[str, Any]) -> str | None:
    kind = data.get("type")
    return kind if isinstance(kind, str) else event.event


def error_body(kind: str, message: str) -> dict[str, Any]:
    """An error answer as the OpenAI API sends one."""
    return openai_error(message, kind=kind)


def is_terminal_event(event: SSEEvent) -> bool:
    """True for ``response.completed`` / ``.incomplete`` / ``.failed`` and the ``error`` event."""
    if _only_piecewise(event):
        return False
    data = load_json_object(event.data)
    return data is not None and _event_type(event, data) in _TERMINAL_TYPES


# --- reassembly ----------------------------------------------------------------------------------


def _new_output_text() -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "text": ""}


def _new_refusal() -> dict[str, Any]:
    return {"type": "refusal", "refusal": ""}


def _new_summary_text() -> dict[str, Any]:
    return {"type": "summary_text", "text": ""}


def _new_reasoning_text() -> dict[str, Any]:
    return {"type": "reasoning_text", "text": ""}


@dataclass(frozen=True, slots=True)
class _PartText:
    """A text event aimed at one part of an item: ``item[parts][data[index]][field]``."""

    parts: str
    index: str
    field: str
    value: str  # the data key holding the delta, or the whole text for a ``.done`` event
    is_delta: bool
    # Some servers skip the ``*.part.added`` event; the first delta then opens the part.
    new_part: Callable[[], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class _ItemText:
    """A text event aimed at a field of the item itself (function call arguments)."""

    field: str
    value: str
    is_delta: bool


_PART_TEXT_EVENTS = {
    "response.output_text.delta": _PartText(
        "content", "content_index", "text", "delta", True, _new_output_text
    ),
    "response.output_text.done": _PartText(
        "content", "content_index", "text", "text", False, _new_output_text
    ),
    "response.refusal.delta": _PartText(
        "content", "content_index", "refusal", "delta", True, _new_refusal
    ),
    "response.refusal.done": _PartText(
        "content", "content_index", "refusal", "refusal", False, _new_refusal
    ),
    "response.reasoning_summary_text.delta": _PartText(
        "summary", "summary_index", "text", "delta", True, _new_summary_text
    ),
    "response.reasoning_summary_text.done": _PartText(
        "summary", "summary_index", "text", "text", False, _new_summary_text
    ),
    "response.reasoning_text.delta": _PartText(
        "content", "content_index", "text", "delta", True, _new_reasoning_text
    ),
    "response.reasoning_text.done": _PartText(
        "content", "content_index", "text", "text", False, _new_reasoning_text
    ),
}
_ITEM_TEXT_EVENTS = {
    "response.function_call_arguments.delta": _ItemText("arguments", "delta", True),
    "response.function_call_arguments.done": _ItemText("arguments", "arguments", False),
    "response.custom_tool_call_input.delta": _ItemText("input", "delta", True),
    "response.custom_tool_call_input.done": _ItemText("input", "input", False),
}
# event type -> (the item's list of parts, the index key, whether a repeat replaces the part)
_PART_EVENTS = {
    "response.content_part.added": ("content", "content_index", False),
    "response.content_part.done": ("content", "content_index", True),
    "response.reasoning_summary_part.added": ("summary", "summary_index", False),
    "response.reasoning_summary_part.done": ("summary", "summary_index", True),
}


# Events that only build the answer piece by piece. When the stream's terminal event carries the
# whole response (every API stream does), they change nothing in the result, so their data is
# parsed only if it turns out to be needed. An event is taken for one of them only when its data
# cannot be a terminal or an error event in disguise: none of those names appear in it, nor a
# JSON escape that could spell one.
_PIECEWISE = frozenset(
    {
        *_PART_TEXT_EVENTS,
        *_ITEM_TEXT_EVENTS,
        *_PART_EVENTS,
        "response.output_item.added",
        "response.output_item.done",
        "response.output_text.annotation.added",
    }
)
_NOT_IN_PIECEWISE = ("error", "response.completed", "response.incomplete", "response.failed", "\\u")
# Deferred events are kept whole until the stream ends; past this many bytes of them, they are
# applied (in order) and the rest as they come, so a long stream holds its answer, not every
# event of it.
_DEFER_MAX_BYTES = 256 * 1024


def _only_piecewise(event: SSEEvent) -> bool:
    data = event.data
    return event.event in _PIECEWISE and not any(word in data for word in _NOT_IN_PIECEWISE)


class StreamReassembler:
    """Feed each decoded event, then ``finish()``. Neither method raises, whatever the input.

    The first ``response.completed`` / ``.incomplete`` / ``.failed`` ends the stream (later events
    are ignored) and its ``response`` object is the result. An ``error`` event makes the outcome
    ERROR for good (a later terminal still supplies the response); its error is the event's nested
    ``error`` object when it has one, else its ``code`` / ``message`` / ``param`` fields as present.
    A ``response.failed`` reports ``response.error``, or the earlier ``error`` event's error when
    that is not an object. Events naming an item not seen are ignored; a text delta may open the
    item's next part, but never skips a part index.

    ``defer``: events that only build the answer piece by piece wait unparsed for the final
    response, which makes them unneeded; past ``_DEFER_MAX_BYTES`` of them they are applied after
    all. ``size``: a deferred event counts its data, an applied delta its text, any other applied
    event its data (see ``dialects._base.StreamReassembler``).
    """

    __slots__ = (
        "_defer",
        "_deferred",
        "_ended",
        "_error",
        "_events",
        "_final",
        "_full",
        "_items",
        "_outcome",
        "_pending",
        "_snapshot",
        "size",
    )

    def __init__(self, *, defer: bool = True) -> None:
        self.size = 0
        self._snapshot: dict[str, Any] | None = None
        self._items: dict[int, dict[str, Any]] = {}
        self._final: dict[str, Any] | None = None
        self._outcome = StreamOutcome.TRUNCATED
        self._error: dict[str, Any] | None = None
        self._ended = False
        # Deltas are collected in lists and joined once (at a ``.done`` or at finish): appending
        # to the stored string would copy it on every delta, quadratic in a long answer.
        self._pending: dict[tuple[int, str], tuple[dict[str, Any], str, list[str]]] = {}
        # Every event in order, when piecewise ones are deferred: without a final response
        # at the end, the answer is rebuilt from all of them.
        self._defer = defer
        self._events: list[SSEEvent] = []
        self._deferred = False
        # Past the deferral bound: the reassembler every event is applied to, this one's stand-in.
        self._full: StreamReassembler | None = None

    def feed(self, event: SSEEvent) -> None:
        if self._full is not None:
            self._full.feed(event)
            self.size = self._full.size
            return
        if self._ended:
            return
        if self._defer:
            self._events.append(event)
            # The event and its text are both kept: count the header of each.
            self.size += len(event.data) + 2 * PIECE_OVERHEAD
            if self.size > _DEFER_MAX_BYTES:
                full = StreamReassembler(defer=False)
                for deferred in self._events:
                    full.feed(deferred)
                self._full, self._events = full, []
                self.size = full.size
                return
            if _only_piecewise(event):
                self._deferred = True
                return
        data = load_json_object(event.data)
        if data is None:
            return
        kind = _event_type(event, data)
        if kind is None:
            return
        if not self._defer:
            text = _PART_TEXT_EVENTS.get(kind) or _ITEM_TEXT_EVENTS.get(kind)
            value = data.get(text.value) if text is not None and text.is_delta else None
            self.size += (
                kept_piece(value) if isinstance(value, str) else len(event.data) + PIECE_OVERHEAD
            )
        if (part_text := _PART_TEXT_EVENTS.get(kind)) is not None:
            self._on_part_text(data, part_text)
        elif (item_text := _ITEM_TEXT_EVENTS.get(kind)) is not None:
            self._on_item_text(data, item_text)
        elif (part_event := _PART_EVENTS.get(kind)) is not None:
            self._on_part(data, *part_event)
        elif kind == "response.output_item.added":
            self._on_output_item(data, replace=False)
        elif kind == "response.output_item.done":
            self._on_output_item(data, replace=True)
        elif kind == "response.output_text.annotation.added":
            self._on_annotation(data)
        elif kind in _SNAPSHOT_TYPES:
            self._on_snapshot(data)
        elif kind in _RESPONSE_TERMINALS:
            self._on_terminal(data, kind)
        elif kind == _ERROR:
            self._on_error(data)

    def finish(self) -> Reassembly:
        if self._full is not None:
            return self._full.finish()
        if self._final is None and self._deferred:
            # No whole response came (or one without its output): build it from every event,
            # in order.
            full = StreamReassembler(defer=False)
            for event in self._events:
                full.feed(event)
            return full.finish()
        response = self._final if self._final is not None else self._rebuild()
        return Reassembly(response, self._outcome, self._error)

    # -- lifecycle events

    def _on_snapshot(self, data: dict[str, Any]) -> None:
        response = data.get("response")
        if not isinstance(response, dict):
            return
        self._snapshot = response
        output = response.get("output")
        if isinstance(output, list):
            # Items already rebuilt from events are further along than a snapshot's copy.
            for index, item in enumerate(output):
                if isinstance(item, dict):
                    self._items.setdefault(index, item)

    def _on_terminal(self, data: dict[str, Any], kind: str) -> None:
        response = data.get("response")
        # A terminal response without its output (some servers leave it out) gets the output
        # rebuilt from the items, as the SDK rebuilds it from the finished ones; while events
        # are deferred, that waits for finish(), which replays them all.
        if isinstance(response, dict) and (
            response.get("output") is not None or not self._deferred
        ):
            if response.get("output") is None:
                self._flush()
                response = {**response, "output": [self._items[i] for i in sorted(self._items)]}
            self._final = response
            self._events = []  # the whole response came: the deferred events are not needed
        if kind == _FAILED:
            self._outcome = StreamOutcome.ERROR
            error = response.get("error") if isinstance(response, dict) else None
            if isinstance(error, dict):
                self._error = error
        elif self._outcome is not StreamOutcome.ERROR:
            self._outcome = _RESPONSE_TERMINALS[kind]
        self._ended = True

    def _on_error(self, data: dict[str, Any]) -> None:
        nested = data.get("error")
        if isinstance(nested, dict):
            self._error = nested
        else:
            self._error = {key: data[key] for key in _ERROR_FIELDS if key in data}
        self._outcome = StreamOutcome.ERROR

    # -- output items and their parts

    def _on_output_item(self, data: dict[str, Any], *, replace: bool) -> None:
        index = as_count(data.get("output_index"))
        item = data.get("item")
        if index is None or not isinstance(item, dict):
            return
        if replace or index not in self._items:
            self._items[index] = item

    def _find_item(self, data: dict[str, Any]) -> dict[str, Any] | None:
        index = as_count(data.get("output_index"))
        if index is not None and (item := self._items.get(index)) is not None:
            return item
        item_id = as_str(data.get("item_id"))
        if item_id is not None:
            for item in self._items.values():
                if item.get("id") == item_id:
                    return item
        return None

    def _on_part(self, data: dict[str, Any], parts_key: str, index_key: str, replace: bool) -> None:
        item = self._find_item(data)
        part = data.get("part")
        index = as_count(data.get(index_key))
        if item is None or index is None or not isinstance(part, dict):
            return
        parts = item.get(parts_key)
        if not isinstance(parts, list):
            parts = item[parts_key] = []
        if index < len(parts):
            if replace or not isinstance(parts[index], dict):
                parts[index] = part
        elif index == len(parts):
            parts.append(part)

    def _part(
        self,
        item: dict[str, Any],
        parts_key: str,
        index: int,
        new_part: Callable[[], dict[str, Any]],
    ) -> dict[str, Any] | None:
        parts = item.get(parts_key)
        if not isinstance(parts, list):
            parts = item[parts_key] = []
        if index < len(parts):
            part = parts[index]
            return part if isinstance(part, dict) else None
        if index == len(parts):
            part = new_part()
            parts.append(part)
            return part
        return None

    def _on_part_text(self, data: dict[str, Any], spec: _PartText) -> None:
        item = self._find_item(data)
        index = as_count(data.get(spec.index))
        if item is None or index is None:
            return
        part = self._part(item, spec.parts, index, spec.new_part)
        if part is not None:
            self._write(part, spec.field, data.get(spec.value), is_delta=spec.is_delta)

    def _on_item_text(self, data: dict[str, Any], spec: _ItemText) -> None:
        item = self._find_item(data)
        if item is not None:
            self._write(item, spec.field, data.get(spec.value), is_delta=spec.is_delta)

    def _on_annotation(self, data: dict[str, Any]) -> None:
        item = self._find_item(data)
        index = as_count(data.get("content_index"))
        annotation = data.get("annotation")
        if item is None or index is None or not isinstance(annotation, dict):
            return
        part = self._part(item, "content", index, _new_output_text)
        if part is None:
            return
        annotations = part.get("annotations")
        if not isinstance(annotations, list):
            annotations = part["annotations"] = []
        position = as_count(data.get("annotation_index"))
        if position is not None and position < len(annotations):
            annotations[position] = annotation
        else:
            annotations.append(annotation)

    # -- text

    def _write(self, target: dict[str, Any], field: str, value: object, *, is_delta: bool) -> None:
        if not isinstance(value, str):
            return
        key = (id(target), field)
        if not is_delta:
            self._pending.pop(key, None)
            target[field] = value
            return
        pending = self._pending.get(key)
        if pending is not None:
            pending[2].append(value)
        else:
            current = target.get(field)
            # The entry holds ``target`` alive, so its id cannot be reused while it is pending.
            self._pending[key] = (
                target,
                field,
                [current if isinstance(current, str) else "", value],
            )

    def _flush(self) -> None:
        for target, field, chunks in self._pending.values():
            target[field] = "".join(chunks)
        self._pending.clear()

    def _rebuild(self) -> dict[str, Any] | None:
        self._flush()
        if self._snapshot is None and not self._items:
            return None
        response = dict(self._snapshot) if self._snapshot is not None else {}
        response["output"] = [self._items[index] for index in sorted(self._items)]
        return response

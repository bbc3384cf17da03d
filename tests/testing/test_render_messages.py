"""The Messages renderer: Anthropic's event sequence."""

from __future__ import annotations

import orjson

from rollcap.dialects import reassemble
from tests.dialects._sdk import sdk_final
from tests.testing._support import (
    decode,
    json_of,
    reply,
    request,
    streamed,
)


def test_messages_stream_event_sequence() -> None:
    events = decode(streamed("messages", request("messages"), {"x-fake-events": "2"}).events)
    assert [event.event for event in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(orjson.loads(event.data)["type"] == event.event for event in events)


def test_context_management_is_answered_as_the_api_answers_it() -> None:
    edits = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    body = request("messages", context_management=edits)
    whole = json_of(reply("messages", body))
    assert whole["context_management"] == {"applied_edits": []}
    stream = streamed("messages", body)
    (delta,) = [e for e in decode(stream.events) if e.event == "message_delta"]
    assert orjson.loads(delta.data)["context_management"] == {"applied_edits": []}
    raw = b"".join(stream.events)
    assert reassemble("messages", [raw]).response == whole
    assert sdk_final("messages", raw)["context_management"] == {"applied_edits": []}
    # Not asked for, not answered.
    assert "context_management" not in json_of(reply("messages", request("messages")))

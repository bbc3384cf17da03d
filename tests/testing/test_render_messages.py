"""The Messages renderer: Anthropic's event sequence."""

from __future__ import annotations

import orjson

from tests.testing._support import (
    decode,
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

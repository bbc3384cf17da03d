"""The Responses renderer: the full event sequence, numbered."""

from __future__ import annotations

import orjson

from tests.testing._support import (
    decode,
    request,
    streamed,
)


def test_responses_stream_is_the_full_event_sequence() -> None:
    events = decode(streamed("responses", request("responses"), {"x-fake-events": "3"}).events)
    names = [event.event for event in events]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    datas = [orjson.loads(event.data) for event in events]
    assert [data["sequence_number"] for data in datas] == list(range(len(events)))
    assert all(data["type"] == event.event for data, event in zip(datas, events, strict=True))

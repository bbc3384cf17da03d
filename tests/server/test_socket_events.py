"""A Responses WebSocket's events as the model server reads them: client events, server events,
their SSE frames (which the stream decoder reads back as they were), and the server's own
error event."""

from __future__ import annotations

import orjson
import pytest

from rollcap.server._socket_events import (
    BEFORE_OUTPUT,
    ServerEvent,
    SocketEventError,
    error_event,
    read_client_event,
    read_server_event,
    sse_frame,
)
from rollcap.sse import SSEDecoder


def test_a_create_event_is_a_turn_whose_request_is_the_event_without_its_type() -> None:
    sent = '{"type":"response.create","model":"m","input":[{"role":"user","content":"hi"}],"x":1}'
    event = read_client_event(sent)
    assert event.type == "response.create"
    assert event.body is not None
    # The body keeps the event's keys in the order they were sent, unknown ones included.
    assert list(orjson.loads(event.body)) == ["model", "input", "x"]
    steer = read_client_event(b'{"type": "response.steer", "input": []}')
    assert (steer.type, steer.body, steer.event["input"]) == ("response.steer", None, [])


@pytest.mark.parametrize(
    ("message", "code"),
    [("{not json", "invalid_json"), ("[1, 2]", "invalid_event"), ('{"type": 3}', "invalid_event")],
)
def test_a_message_that_is_no_event_is_refused_with_a_code(message: str, code: str) -> None:
    with pytest.raises(SocketEventError) as refused:
        read_client_event(message)
    assert refused.value.code == code


def test_server_events_give_their_type_and_an_errors_status() -> None:
    assert read_server_event('{"type": "response.created"}') == ServerEvent("response.created")
    error = '{"type": "error", "status": 400, "error": {"code": "previous_response_not_found"}}'
    assert read_server_event(error) == ServerEvent("error", 400)
    assert read_server_event('{"type": "error"}') == ServerEvent("error", None)
    assert read_server_event("nonsense") == ServerEvent(None)
    assert read_server_event('"text"') == ServerEvent(None)
    assert "response.created" in BEFORE_OUTPUT
    assert "response.output_text.delta" not in BEFORE_OUTPUT


def test_an_events_frame_reads_back_as_the_event_it_was() -> None:
    data = '{"type":"response.output_text.delta","delta":"a\\nb"}'
    frames = sse_frame("response.output_text.delta", data) + sse_frame(None, "line one\nline two")
    events = SSEDecoder().feed(frames)
    assert [(e.event, e.data) for e in events] == [
        ("response.output_text.delta", data),
        (None, "line one\nline two"),
    ]


def test_the_servers_own_error_event_has_the_apis_shape() -> None:
    event = orjson.loads(error_event(400, "invalid_json", "the message is not JSON"))
    assert event == {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "invalid_json",
            "message": "the message is not JSON",
            "param": None,
        },
    }


@pytest.mark.parametrize(
    "message",
    [
        '{"type":"response.output_text.delta","delta":"x"}',
        '{"type":"error","status":429,"error":{}}',
        '{"type":"resp\\u006fnse.created"}',
        '{"delta":"x","type":"response.output_text.delta"}',
        '{"type": "response.created"}',
    ],
)
def test_the_type_read_from_the_first_bytes_is_the_parsed_one(message: str) -> None:
    parsed = orjson.loads(message)
    expected = ServerEvent(parsed["type"], parsed.get("status"))
    assert read_server_event(message) == expected
    assert read_server_event(message.encode()) == expected

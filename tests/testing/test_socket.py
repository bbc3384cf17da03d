"""The fake upstream's Responses WebSocket mode, without a socket: turns, state, errors."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollcap.testing._scenarios import ReplyKind
from rollcap.testing._socket import CREATE, ResponsesSocket, SocketReply
from tests.testing._support import PROMPT, decode, json_of, reply, request, streamed


def create(**fields: Any) -> str:
    """A ``response.create`` message."""
    return orjson.dumps({"type": CREATE, **fields}).decode()


def first_turn(**extra: Any) -> dict[str, Any]:
    """A typical Responses body, as a turn sends it (no ``stream``)."""
    return request("responses", **extra)


def events(turn: SocketReply) -> list[dict[str, Any]]:
    return [orjson.loads(message) for message in turn.messages]


def terminal(turn: SocketReply) -> dict[str, Any]:
    last = events(turn)[-1]
    assert last["type"] in ("response.completed", "response.incomplete")
    response: dict[str, Any] = last["response"]
    return response


def http_data(body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[str, ...]:
    """The ``data`` of each event the HTTP route streams for ``body``."""
    answered = streamed("responses", body, headers)
    assert answered.kind is ReplyKind.STREAM
    return tuple(event.data for event in decode(answered.events))


def only_error(turn: SocketReply) -> dict[str, Any]:
    assert len(turn.messages) == 1
    assert not turn.close
    assert not turn.hang
    error = orjson.loads(turn.messages[0])
    assert set(error) == {"type", "status", "error"}
    assert error["type"] == "error"
    return dict(error)


# --- turns continued by previous_response_id ------------------------------------------------------


def test_a_tool_conversation_continued_by_previous_response_id() -> None:
    headers = {"x-fake-scenario": "tool_turns", "x-fake-tool-turns": "4"}
    socket = ResponsesSocket(headers)
    history: list[Any] = [{"role": "user", "content": PROMPT}]
    turn = socket.receive(create(**first_turn()), request_id="req_1")
    # The first turn is the request as sent: the same answer as over HTTP, event for event.
    assert turn.messages == http_data(first_turn(), headers)
    assert turn.request == {**first_turn(), "stream": True}
    previous: str | None = None
    for number in range(2, 6):
        response = terminal(turn)
        assert response["previous_response_id"] == previous
        [call] = response["output"]
        assert call["type"] == "function_call"
        assert call["name"] == "get_weather"
        assert socket.stored[-1] == response["id"]
        result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
        previous = response["id"]
        history += [call, result]
        body = {"model": "gpt-test", "tools": first_turn()["tools"], "input": [result]}
        turn = socket.receive(
            create(**body, previous_response_id=previous), request_id=f"req_{number}"
        )
        # Answered as the whole conversation sent at once: the tool results all count.
        full = {**body, "previous_response_id": previous, "input": history}
        assert turn.request == {**full, "stream": True}
        assert turn.messages == http_data(full, headers)
    response = terminal(turn)
    assert response["status"] == "completed"
    assert [item["type"] for item in response["output"]] == ["message"]
    assert response["previous_response_id"] == previous
    assert len(socket.stored) == 5


def test_only_input_and_output_carry_forward() -> None:
    socket = ResponsesSocket({})
    turn = socket.receive(create(**first_turn(instructions="Be brief.")), request_id="req_1")
    first = terminal(turn)
    assert first["instructions"] == "Be brief."
    nxt = socket.receive(
        create(model="gpt-test", input="And Spain?", previous_response_id=first["id"]),
        request_id="req_2",
    )
    assert nxt.request is not None
    assert "instructions" not in nxt.request
    assert "tools" not in nxt.request
    assert nxt.request["input"] == [
        {"role": "user", "content": PROMPT},
        *first["output"],
        {"role": "user", "content": "And Spain?"},
    ]
    assert terminal(nxt)["instructions"] is None


def test_an_incomplete_response_can_be_continued() -> None:
    socket = ResponsesSocket({"x-fake-scenario": "incomplete"})
    response = terminal(socket.receive(create(**first_turn()), request_id="req_1"))
    assert response["status"] == "incomplete"
    assert socket.stored == (response["id"],)
    nxt = socket.receive(create(previous_response_id=response["id"]), request_id="req_2")
    assert nxt.request is not None
    assert nxt.request["input"] == [{"role": "user", "content": PROMPT}, *response["output"]]


def test_the_same_turn_gets_the_same_ids_on_every_socket() -> None:
    one, two = ResponsesSocket({}), ResponsesSocket({})
    assert (
        one.receive(create(**first_turn()), request_id="req_a").messages
        == two.receive(create(**first_turn()), request_id="req_b").messages
    )


def test_stream_and_background_are_not_forwarded_and_bytes_are_read() -> None:
    socket = ResponsesSocket({})
    message = create(**first_turn(), stream=False, background=True).encode()
    turn = socket.receive(message, request_id="req_1")
    assert turn.request == {**first_turn(), "stream": True}
    assert turn.messages == http_data(first_turn())


# --- generate: false ------------------------------------------------------------------------------


def test_generate_false_stores_the_state_without_generating() -> None:
    socket = ResponsesSocket({"x-fake-scenario": "tool", "x-fake-delay-ms": "5000"})
    body = first_turn(instructions="Be brief.")
    turn = socket.receive(create(**body, generate=False), request_id="req_1")
    assert (turn.delay_s, turn.close, turn.hang) == (0.0, False, False)
    created, completed = events(turn)
    assert [created["type"], completed["type"]] == ["response.created", "response.completed"]
    assert [created["sequence_number"], completed["sequence_number"]] == [0, 1]
    response = completed["response"]
    assert created["response"]["id"] == response["id"]
    assert response["id"].startswith("resp_")
    assert (created["response"]["status"], response["status"]) == ("in_progress", "completed")
    assert response["output"] == []
    assert response["usage"] == {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }
    assert response["instructions"] == "Be brief."
    assert response["tools"] == body["tools"]
    # Not the id the same request generated gets, and the same on every run.
    generated = terminal(ResponsesSocket({}).receive(create(**body), request_id="req_2"))
    assert response["id"] != generated["id"]
    again = ResponsesSocket({}).receive(create(**body, generate=False), request_id="req_3")
    assert again.messages == turn.messages
    assert socket.stored == (response["id"],)

    nxt = socket.receive(
        create(**first_turn(input="Go on."), previous_response_id=response["id"]),
        request_id="req_4",
    )
    assert nxt.request is not None
    assert nxt.request["input"] == [
        {"role": "user", "content": PROMPT},
        {"role": "user", "content": "Go on."},
    ]
    answered = terminal(nxt)
    assert answered["previous_response_id"] == response["id"]
    assert answered["output"][0]["type"] == "function_call"


# --- errors ---------------------------------------------------------------------------------------


def test_an_unknown_previous_response_id_is_an_error_event() -> None:
    socket = ResponsesSocket({})
    turn = socket.receive(create(input="hi", previous_response_id="resp_nope"), request_id="r")
    assert turn.request is None
    assert only_error(turn) == {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "message": "Previous response with id 'resp_nope' not found.",
            "param": "previous_response_id",
        },
    }
    # The socket goes on.
    assert terminal(socket.receive(create(**first_turn()), request_id="r2"))["status"] == (
        "completed"
    )


@pytest.mark.parametrize(
    ("message", "code", "param"),
    [
        (b"{oops", "invalid_json", None),
        (b"\xff\xfe", "invalid_json", None),
        ("[1, 2]", "invalid_event", None),
        ('"response.create"', "invalid_event", None),
        ('{"input": "hi"}', "invalid_event", "type"),
        ('{"type": 5}', "invalid_event", "type"),
        ('{"type": "response.cancel"}', "unknown_event_type", "type"),
        ('{"type": "response.create", "generate": "no"}', "invalid_type", "generate"),
        (
            '{"type": "response.create", "previous_response_id": 7}',
            "invalid_type",
            "previous_response_id",
        ),
    ],
)
def test_a_malformed_message_is_an_error_event(
    message: str | bytes, code: str, param: str | None
) -> None:
    error = only_error(ResponsesSocket({}).receive(message, request_id="req_1"))
    assert error["status"] == 400
    assert error["error"]["type"] == "invalid_request_error"
    assert (error["error"]["code"], error["error"]["param"]) == (code, param)
    assert error["error"]["message"]


def test_new_input_of_the_wrong_type_is_an_error_event() -> None:
    socket = ResponsesSocket({})
    first = terminal(socket.receive(create(**first_turn()), request_id="req_1"))
    turn = socket.receive(create(input=5, previous_response_id=first["id"]), request_id="req_2")
    error = only_error(turn)["error"]
    assert (error["code"], error["param"]) == ("invalid_type", "input")


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"x-fake-scenario": "http_500"}, 500),
        ({"x-fake-scenario": "http_429"}, 429),
        ({"x-fake-scenario": "context_length"}, 400),
        ({"x-fake-events": "many"}, 400),
    ],
)
def test_an_error_status_is_an_error_event(headers: dict[str, str], status: int) -> None:
    socket = ResponsesSocket(headers)
    turn = socket.receive(create(**first_turn()), request_id="req_1")
    error = only_error(turn)
    http = reply("responses", {**first_turn(), "stream": True}, headers)
    assert error == {"type": "error", "status": status, "error": json_of(http)["error"]}
    assert socket.stored == ()


def test_a_scenario_by_model_name() -> None:
    turn = ResponsesSocket({}).receive(create(**first_turn(model="http_503")), request_id="r")
    assert only_error(turn)["status"] == 503


def test_the_api_key_is_checked_on_every_turn() -> None:
    refused = ResponsesSocket({"authorization": "Bearer wrong"}, api_key="sk")
    error = only_error(refused.receive(create(**first_turn()), request_id="req_1"))
    assert error["status"] == 401
    assert error["error"]["code"] == "invalid_api_key"
    allowed = ResponsesSocket({"Authorization": "Bearer sk"}, api_key="sk")
    assert terminal(allowed.receive(create(**first_turn()), request_id="req_2"))


# --- the scenarios that do not complete -----------------------------------------------------------


def test_truncate_sends_the_events_so_far_then_closes() -> None:
    headers = {"x-fake-scenario": "truncate"}
    socket = ResponsesSocket(headers)
    turn = socket.receive(create(**first_turn()), request_id="req_1")
    assert turn.close
    assert not turn.hang
    assert turn.messages == http_data(first_turn(), headers)
    assert turn.messages
    assert events(turn)[-1]["type"] not in ("response.completed", "response.incomplete")
    assert socket.stored == ()


def test_hang_disconnect_and_endless() -> None:
    hang = ResponsesSocket({"x-fake-scenario": "hang", "x-fake-delay-ms": "20"})
    turn = hang.receive(create(**first_turn()), request_id="req_1")
    assert (turn.messages, turn.hang, turn.close, turn.delay_s) == ((), True, False, 0.02)
    gone = ResponsesSocket({"x-fake-scenario": "disconnect"})
    turn = gone.receive(create(**first_turn()), request_id="req_2")
    assert (turn.messages, turn.hang, turn.close) == ((), False, True)
    endless = ResponsesSocket({"x-fake-scenario": "endless"})
    error = only_error(endless.receive(create(**first_turn()), request_id="req_3"))
    assert (error["status"], error["error"]["code"]) == (400, "unsupported_scenario")


def test_stream_error_and_malformed_json_pass_their_events_on() -> None:
    for scenario in ("stream_error", "malformed_json"):
        headers = {"x-fake-scenario": scenario}
        socket = ResponsesSocket(headers)
        turn = socket.receive(create(**first_turn()), request_id="req_1")
        assert turn.messages == http_data(first_turn(), headers)
        assert not turn.close


def test_the_waits_are_the_knobs() -> None:
    headers = {"x-fake-delay-ms": "250", "x-fake-chunk-delay-ms": "2"}
    turn = ResponsesSocket(headers).receive(create(**first_turn()), request_id="req_1")
    assert (turn.delay_s, turn.chunk_delay_s) == (0.25, 0.002)


# --- the socket's state is bounded ----------------------------------------------------------------


def test_at_most_max_stored_responses_are_kept() -> None:
    socket = ResponsesSocket({}, max_stored=2)
    ids = [
        terminal(socket.receive(create(**first_turn(input=f"turn {n}")), request_id=f"r{n}"))["id"]
        for n in range(3)
    ]
    assert socket.stored == (ids[1], ids[2])
    dropped = socket.receive(create(previous_response_id=ids[0]), request_id="r3")
    assert only_error(dropped)["error"]["code"] == "previous_response_not_found"
    # A response stored again is the newest: the other one goes first.
    socket.receive(create(**first_turn(input="turn 1")), request_id="r4")
    socket.receive(create(**first_turn(input="turn 3")), request_id="r5")
    assert socket.stored[0] == ids[1]
    with pytest.raises(ValueError, match="max_stored"):
        ResponsesSocket({}, max_stored=0)


def test_a_steer_is_taken_and_not_answered() -> None:
    socket = ResponsesSocket({})
    steer = orjson.dumps({"type": "response.steer", "input": [{"role": "user", "content": "x"}]})
    assert socket.receive(steer, request_id="req_1") == SocketReply()
    assert socket.stored == ()

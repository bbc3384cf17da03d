"""What a translated Responses WebSocket remembers: a turn made whole from its previous
response, a bounded number of responses kept, and the warm-up answer of generate: false."""

from __future__ import annotations

import pytest

from rollcap.server._socket_state import PreviousResponseNotFound, SocketState, prepared_response


def test_a_turn_with_previous_response_id_becomes_the_whole_conversation() -> None:
    state = SocketState(max_responses=4)
    first = {"model": "m", "input": "hi", "instructions": "Be brief."}
    assert state.expand(first) == first  # nothing to continue: as sent
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    state.remember("resp_1", first, [call])
    result = {"type": "function_call_output", "call_id": "c1", "output": "42"}
    turn = {"model": "m", "previous_response_id": "resp_1", "input": [result], "tools": []}
    whole = state.expand(turn)
    assert whole == {
        "model": "m",
        "input": [{"role": "user", "content": "hi"}, call, result],
        "tools": [],  # the turn's own; the first turn's instructions are not carried forward
    }
    assert "previous_response_id" in turn  # the turn itself is left as it was


def test_at_most_max_responses_are_kept_and_a_forgotten_one_is_not_found() -> None:
    state = SocketState(max_responses=2)
    for index in range(3):
        state.remember(f"resp_{index}", {"input": str(index)}, [])
    assert len(state) == 2
    with pytest.raises(PreviousResponseNotFound) as missing:
        state.expand({"previous_response_id": "resp_0"})
    assert missing.value.response_id == "resp_0"
    assert "resp_0" in str(missing.value)
    assert state.expand({"previous_response_id": "resp_2"})["input"] == [
        {"role": "user", "content": "2"}
    ]


@pytest.mark.parametrize(
    "turn", [{"previous_response_id": 3}, {"previous_response_id": "resp_1", "input": 5}]
)
def test_a_turn_of_the_wrong_shape_is_refused(turn: dict[str, object]) -> None:
    state = SocketState(max_responses=1)
    state.remember("resp_1", {"input": []}, [])
    with pytest.raises(ValueError, match="must be a string"):
        state.expand(turn)


def test_a_state_keeps_at_least_one_response() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SocketState(max_responses=0)


def test_a_warm_up_is_a_completed_response_with_no_output_and_no_tokens() -> None:
    response = prepared_response("resp_w", {"model": "m", "tools": [], "input": "x"}, 1786.5)
    assert response["id"] == "resp_w"
    assert (response["status"], response["output"], response["model"]) == ("completed", [], "m")
    assert response["tools"] == []
    assert "input" not in response
    assert response["usage"]["total_tokens"] == 0

"""Responses over WebSocket through the model server, pass-through: the official SDK's WebSocket
client (``client.responses.connect()``) through rollcap to the fake upstream's socket, over
real sockets. Each turn is one record, exact against what the upstream sent, and the client
gets the upstream's messages byte for byte; faults end in one record per turn, or none."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.resources.responses.responses import AsyncResponsesConnection

from rollcap.dialects import reassemble
from rollcap.server._socket import MAX_OPEN_TURNS
from rollcap.sse import SSEDecoder
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream, expected_response
from tests._polling import until
from tests.server.conftest import CLIENT_KEY, UPSTREAM_KEY, model_server, settings_for

TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string"}},
            "required": ["word"],
        },
    }
]
FIRST_INPUT = [{"role": "user", "content": "Look up five words, one at a time."}]
TURNS = 5
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


@dataclass
class Turn:
    sent: dict[str, Any]  # the client event, as sent
    messages: list[bytes]  # what the client received, as received


async def _turn(connection: AsyncResponsesConnection, event: dict[str, Any]) -> Turn:
    await connection.send(event)  # type: ignore[arg-type]
    messages: list[bytes] = []
    while True:
        message = await connection.recv_bytes()
        messages.append(message)
        if orjson.loads(message)["type"] in TERMINAL:
            return Turn(event, messages)


def _completed(turn: Turn) -> dict[str, Any]:
    last = orjson.loads(turn.messages[-1])
    assert last["type"] == "response.completed", last
    response: dict[str, Any] = last["response"]
    return response


async def _tool_conversation(base_url: str, key: str = CLIENT_KEY) -> list[Turn]:
    """Five turns over one socket: four tool calls answered by their outputs alone, each turn
    continuing the one before by ``previous_response_id``, then the answer."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
    headers = {"x-fake-scenario": "tool_turns", "x-fake-tool-turns": str(TURNS - 1)}
    turns: list[Turn] = []
    async with client.responses.connect(extra_headers=headers) as connection:
        event: dict[str, Any] = {
            "type": "response.create",
            "model": "fake-model",
            "store": False,
            "input": FIRST_INPUT,
            "tools": TOOLS,
        }
        for index in range(TURNS):
            turn = await _turn(connection, event)
            turns.append(turn)
            response = _completed(turn)
            if index == TURNS - 1:
                break
            (call,) = [item for item in response["output"] if item["type"] == "function_call"]
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
            event = {
                "type": "response.create",
                "model": "fake-model",
                "store": False,
                "previous_response_id": response["id"],
                "input": [output],
                "tools": TOOLS,
            }
    await client.close()
    return turns


def _records(capture: Path, rollout_id: str = "0-0") -> list[dict[str, Any]]:
    if not CaptureStore(capture).path_for(rollout_id).exists():
        return []
    return CaptureStore(capture).read(rollout_id)


async def test_a_tool_conversation_is_five_records_exact_and_byte_equal_to_direct(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture = tmp_path / "model-calls"
    settings = settings_for(upstream.url, capture)
    async with model_server(settings) as url:
        through = await _tool_conversation(url + "/ng-rollout/0-0/v1")
    direct = await _tool_conversation(upstream.url + "/v1", UPSTREAM_KEY)
    # The client's events, message for message and byte for byte, are the upstream's.
    assert [t.messages for t in through] == [t.messages for t in direct]
    final = _completed(through[-1])
    assert [item["type"] for item in final["output"]] == ["message"]

    records = _records(capture)
    assert len(records) == TURNS
    for record, turn in zip(records, through, strict=True):
        assert record["transport"] == "websocket"
        assert (record["dialect"], record["status_code"], record["error_category"]) == (
            "responses",
            200,
            None,
        )
        # The request is the client event without its type, keys in the order sent.
        assert record["request"] == {k: v for k, v in turn.sent.items() if k != "type"}
        assert list(record["request"]) == [k for k in turn.sent if k != "type"]
        # response_raw holds every event the upstream sent, as SSE, in order.
        events = SSEDecoder().feed(record["response_raw"].encode())
        assert [e.data.encode() for e in events] == turn.messages
        assert [e.event for e in events] == [orjson.loads(m)["type"] for m in turn.messages]
        # The response is the reassembled stream, which is the completed event's response.
        assert record["response"] == _completed(turn)
        rebuilt = reassemble("responses", [record["response_raw"].encode()]).response
        assert record["response"] == rebuilt
        assert record["latency_ttft_ms"] is not None
        assert record["latency_ttft_ms"] <= record["latency_ms"]
        assert record["upstream_attempted"] is True
        assert record["response_source"] == "upstream"
    # Each turn after the first continues the one before.
    ids = [r["response"]["id"] for r in records]
    assert [r["request"].get("previous_response_id") for r in records] == [None, *ids[:-1]]
    # The upstream got the upstream key, never the client's.
    sockets = [r for r in upstream.requests if r.method == "WEBSOCKET"]
    assert len(sockets) == 2 * TURNS
    raw = b"".join(r.body for r in upstream.requests)
    assert CLIENT_KEY.encode() not in raw


async def _written(capture: Path, rollout_id: str, count: int) -> None:
    """Wait until the rollout has ``count`` records: a socket's turns are written once the
    server has seen it close, after the client's ``close()`` returned."""

    async def records() -> dict[str, Any]:
        return {"records": len(_records(capture, rollout_id))}

    await until(records, lambda seen: seen["records"] >= count, bound_s=10.0, every_s=0.02)


async def _raw_socket(
    session: aiohttp.ClientSession, url: str, **headers: str
) -> aiohttp.ClientWebSocketResponse:
    return await session.ws_connect(
        url, headers={"authorization": f"Bearer {CLIENT_KEY}", **headers}
    )


async def _until_terminal(socket: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        message = await asyncio.wait_for(socket.receive(), 10)
        if message.type is not aiohttp.WSMsgType.TEXT:
            return events
        events.append(orjson.loads(message.data))
        if events[-1]["type"] in TERMINAL:
            return events


def _create(**extra: Any) -> str:
    return orjson.dumps(
        {"type": "response.create", "model": "fake-model", "input": "hi", **extra}
    ).decode()


async def test_faults_end_in_one_record_each_or_none(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture = tmp_path / "model-calls"
    settings = settings_for(upstream.url, capture)
    async with model_server(settings) as url, aiohttp.ClientSession() as session:
        socket_url = url + "/ng-rollout/1-0/v1/responses"
        socket = await _raw_socket(session, socket_url)
        # A message that is no event: the server's own error event, nothing upstream, no record.
        await socket.send_str("{not json")
        (refused,) = await _until_terminal(socket)
        assert refused["type"] == "error"
        assert refused["error"]["code"] == "invalid_json"
        # An unknown previous_response_id: the upstream's error event, one record of it.
        await socket.send_str(_create(previous_response_id="resp_nobody"))
        (unknown,) = await _until_terminal(socket)
        assert unknown["error"]["code"] == "previous_response_not_found"
        # The socket goes on: a turn after the errors completes.
        await socket.send_str(_create())
        events = await _until_terminal(socket)
        assert events[-1]["type"] == "response.completed"
        await socket.close()
        records = _records(capture, "1-0")
        assert [(r["status_code"], r["error_category"]) for r in records] == [
            (400, "client_error"),
            (200, None),
        ]
        assert records[0]["response"] == {"error": unknown["error"]}

        # The upstream closes mid-turn: one truncated record, and the client's socket closes.
        socket = await _raw_socket(session, url + "/ng-rollout/2-0/v1/responses")
        await socket.send_str(_create(model="truncate"))
        events = await _until_terminal(socket)
        assert events
        assert events[-1]["type"] not in TERMINAL
        assert socket.closed or (await socket.receive()).type in (
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.CLOSED,
        )
        (truncated,) = _records(capture, "2-0")
        assert truncated["error_category"] == "stream_truncated"
        assert truncated["transport"] == "websocket"

        # The client closes mid-turn: one cancelled record.
        socket = await _raw_socket(
            session, url + "/ng-rollout/3-0/v1/responses", **{"x-fake-chunk-delay-ms": "200"}
        )
        await socket.send_str(_create(model="fake-model"))
        first = await asyncio.wait_for(socket.receive(), 10)
        assert orjson.loads(first.data)["type"] == "response.created"
        await socket.close()
        await _written(capture, "3-0", 1)
        (cancelled,) = _records(capture, "3-0")
        assert cancelled["error_category"] == "cancelled"

        # A client event other than response.create, sent mid-turn: relayed, and kept with
        # the turn it was sent in.
        socket = await _raw_socket(
            session, url + "/ng-rollout/5-0/v1/responses", **{"x-fake-chunk-delay-ms": "50"}
        )
        await socket.send_str(_create())
        first = await asyncio.wait_for(socket.receive(), 10)
        assert orjson.loads(first.data)["type"] == "response.created"
        steer = {"type": "response.steer", "input": [{"role": "user", "content": "shorter"}]}
        await socket.send_str(orjson.dumps(steer).decode())
        events = await _until_terminal(socket)
        assert events[-1]["type"] == "response.completed"
        await socket.close()
        (steered,) = _records(capture, "5-0")
        assert steered["client_events"] == [steer]
        assert steered["error_category"] is None
        steers = [r for r in upstream.requests if r.json == steer]
        assert len(steers) == 1  # passed on to the upstream, once

        # A socket that never sends: no turn, no record; the server answers the next one.
        idle = await _raw_socket(session, url + "/ng-rollout/4-0/v1/responses")
        await asyncio.sleep(0.2)
        await idle.close()
        assert _records(capture, "4-0") == []
        async with session.get(url + "/health") as response:
            health = await response.json()
        assert (health["captured"], health["capture_failures"]) == (5, 0)


async def test_an_uncaptured_socket_is_relayed_and_counted(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    settings = settings_for(upstream.url, tmp_path / "model-calls")
    async with model_server(settings) as url, aiohttp.ClientSession() as session:
        socket = await _raw_socket(session, url + "/v1/responses")  # no rollout prefix
        await socket.send_str(_create())
        events = await _until_terminal(socket)
        assert events[-1]["type"] == "response.completed"
        await socket.close()
        async with session.get(url + "/health") as response:
            health = await response.json()
        assert (health["captured"], health["uncorrelated"]) == (0, 1)
    assert not (tmp_path / "model-calls").exists() or not list(
        (tmp_path / "model-calls").glob("*.jsonl")
    )


async def test_a_refused_handshake_is_answered_with_the_upstreams_status(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    # The upstream wants another key than the one configured: it refuses the handshake.
    settings = settings_for(upstream.url, tmp_path / "model-calls", api_key="a-wrong-key")
    async with model_server(settings) as url, aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await _raw_socket(session, url + "/ng-rollout/0-0/v1/responses")
        assert refused.value.status == 401
    # Past websocket_max_sockets a handshake is answered 503, and the open one goes on.
    limited = replace(settings_for(upstream.url, None), websocket_max_sockets=1)
    async with model_server(limited) as url, aiohttp.ClientSession() as session:
        first = await _raw_socket(session, url + "/v1/responses")
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await _raw_socket(session, url + "/v1/responses")
        assert refused.value.status == 503
        await first.send_str(_create())
        assert (await _until_terminal(first))[-1]["type"] == "response.completed"
        await first.close()
        again = await _raw_socket(session, url + "/v1/responses")  # closed: room again
        await again.close()


# -- translated: the server holds the socket's state ------------------------------------------


async def test_a_translated_tool_conversation_is_one_whole_chat_call_per_turn(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture = tmp_path / "model-calls"
    settings = settings_for(upstream.url, capture, model_type="vllm_model")
    async with model_server(settings) as url:
        turns = await _tool_conversation(url + "/ng-rollout/0-0/v1")
    chats = [r for r in upstream.requests if r.path == "/v1/chat/completions"]
    assert len(chats) == TURNS
    records = _records(capture)
    assert len(records) == TURNS
    for index, (record, turn, chat) in enumerate(zip(records, turns, chats, strict=True)):
        assert chat.json is not None
        # One complete chat call: the whole conversation so far, the tool results included.
        tool_results = [m for m in chat.json["messages"] if m["role"] == "tool"]
        assert len(tool_results) == index
        assert chat.json["stream"] is True
        assert record["transport"] == "websocket"
        assert record["request"] == {k: v for k, v in turn.sent.items() if k != "type"}
        assert (record["status_code"], record["error_category"]) == (200, None)
        assert record["response"] == _completed(turn)
        events = SSEDecoder().feed(record["response_raw"].encode())
        assert [e.data.encode() for e in events] == turn.messages
        # What the upstream answered, in the Responses dialect.
        expected = expected_response("chat", chat.json, chat.headers)["choices"][0]["message"]
        output = record["response"]["output"]
        if expected.get("tool_calls"):
            (call,) = [item for item in output if item["type"] == "function_call"]
            function = expected["tool_calls"][0]["function"]
            assert (call["name"], call["arguments"]) == (function["name"], function["arguments"])
        else:
            (message,) = output
            assert message["content"][0]["text"] == expected["content"]


async def test_a_translated_socket_keeps_bounded_state_and_answers_its_errors(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture = tmp_path / "model-calls"
    settings = replace(
        settings_for(upstream.url, capture, model_type="vllm_model"),
        websocket_max_stored_responses=2,
    )
    async with model_server(settings) as url, aiohttp.ClientSession() as session:
        socket = await _raw_socket(session, url + "/ng-rollout/6-0/v1/responses")
        # generate: false keeps the state and calls nothing upstream.
        await socket.send_str(_create(generate=False, instructions="Be brief."))
        warm = await _until_terminal(socket)
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        assert not [r for r in upstream.requests if r.path == "/v1/chat/completions"]
        ids = [warm[-1]["response"]["id"]]
        for word in ("one", "two", "three"):
            await socket.send_str(_create(previous_response_id=ids[-1], input=word))
            events = await _until_terminal(socket)
            assert events[-1]["type"] == "response.completed"
            ids.append(events[-1]["response"]["id"])
        chats = [r.json for r in upstream.requests if r.path == "/v1/chat/completions"]
        assert [m["content"] for m in chats[-1]["messages"] if m["role"] == "user"] == [
            "hi",
            "one",
            "two",
            "three",
        ]
        # Only the last two responses are kept: the first is gone, as the provider's would be.
        await socket.send_str(_create(previous_response_id=ids[0]))
        (gone,) = await _until_terminal(socket)
        assert gone["error"]["code"] == "previous_response_not_found"
        # A request the translation refuses is the API's error event; the socket goes on.
        await socket.send_str(_create(conversation="conv_1"))
        (refused,) = await _until_terminal(socket)
        assert (refused["status"], refused["error"]["type"]) == (400, "invalid_request_error")
        await socket.send_str(_create(model="http_500"))
        (failed,) = await _until_terminal(socket)
        assert failed["status"] == 500
        await socket.close()
    records = _records(capture, "6-0")
    summary = [
        (r["status_code"], r["error_category"], r.get("local_response_reason")) for r in records
    ]
    assert summary == [
        (200, None, "state_only"),
        (200, None, None),
        (200, None, None),
        (200, None, None),
        (400, "client_error", "invalid_request"),
        (400, "client_error", "invalid_request"),
        (500, "upstream_error", None),
    ]
    assert records[0]["upstream_attempted"] is False
    assert all(r["transport"] == "websocket" for r in records)


async def test_turns_past_the_bound_are_refused_and_a_closed_socket_ends_its_turns(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture = tmp_path / "model-calls"
    async with model_server(settings_for(upstream.url, capture)) as url:
        async with aiohttp.ClientSession() as session:
            # The upstream answers nothing: every turn sent waits, up to the bound.
            socket = await _raw_socket(session, url + "/ng-rollout/7-0/v1/responses")
            for _ in range(MAX_OPEN_TURNS + 1):
                await socket.send_str(_create(model="hang"))
            (refused,) = await _until_terminal(socket)
            assert refused["error"]["code"] == "too_many_turns"
            await socket.close()
        await _written(capture, "7-0", MAX_OPEN_TURNS)
        records = _records(capture, "7-0")
        assert len(records) == MAX_OPEN_TURNS
        assert {r["error_category"] for r in records} == {"cancelled"}


async def test_a_translated_turn_whose_client_leaves_is_cancelled(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture = tmp_path / "model-calls"
    settings = settings_for(upstream.url, capture, model_type="vllm_model")
    async with model_server(settings) as url, aiohttp.ClientSession() as session:
        socket = await _raw_socket(
            session,
            url + "/ng-rollout/8-0/v1/responses",
            **{"x-fake-events": "40", "x-fake-chunk-delay-ms": "100"},
        )
        await socket.send_str(_create())
        first = await asyncio.wait_for(socket.receive(), 10)
        assert orjson.loads(first.data)["type"] == "response.created"
        await socket.close()
        await _written(capture, "8-0", 1)
        (record,) = _records(capture, "8-0")
        assert record["error_category"] == "cancelled"
        assert record["upstream_attempted"] is True
        async with session.get(url + "/inflight") as response:
            assert (await response.json())["open"] == 0


async def test_an_event_in_a_binary_message_is_a_turn_as_well(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    capture = tmp_path / "model-calls"
    async with model_server(settings_for(upstream.url, capture)) as url:
        async with aiohttp.ClientSession() as session:
            socket = await _raw_socket(session, url + "/ng-rollout/9-0/v1/responses")
            await socket.send_bytes(_create().encode())
            assert (await _until_terminal(socket))[-1]["type"] == "response.completed"
            await socket.close()
        (record,) = _records(capture, "9-0")
        assert record["request"]["input"] == "hi"
    received = [r for r in upstream.requests if r.method == "WEBSOCKET"]
    assert [r.json for r in received] == [orjson.loads(_create())]


async def test_a_fault_of_the_servers_own_ends_the_turn_and_closes_the_socket(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(data: str | bytes) -> object:
        raise ValueError("a bug reading an event")

    monkeypatch.setattr("rollcap.server._socket.read_server_event", broken)
    capture = tmp_path / "model-calls"
    async with model_server(settings_for(upstream.url, capture)) as url:
        async with aiohttp.ClientSession() as session:
            socket = await _raw_socket(session, url + "/ng-rollout/10-0/v1/responses")
            await socket.send_str(_create())
            closing = await asyncio.wait_for(socket.receive(), 10)
            assert closing.type is aiohttp.WSMsgType.CLOSE
            assert closing.data == 1011
        (record,) = _records(capture, "10-0")
        # As for an HTTP call the server failed: 500, answered by the server itself.
        assert (record["status_code"], record["local_response_reason"]) == (500, "server_error")
        async with aiohttp.ClientSession() as session, session.get(url + "/health") as response:
            assert (await response.json())["status"] == "ok"  # the server goes on

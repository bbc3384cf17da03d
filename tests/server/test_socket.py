"""Responses over WebSocket through the model server, pass-through: the official SDK's WebSocket
client (``client.responses.connect()``) through rollcap to the fake upstream's socket, over
real sockets. Each turn is one record, exact against what the upstream sent, and the client
gets the upstream's messages byte for byte; faults end in one record per turn, or none."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.resources.responses.responses import AsyncResponsesConnection

from rollcap.dialects import reassemble
from rollcap.sse import SSEDecoder
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream
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


@pytest.fixture(autouse=True)
def _quiet_test_client() -> Iterator[None]:
    """The SDK's WebSocket library logs its handshake's headers at DEBUG, the test client's key
    among them; what is checked for credentials is what rollcap logs."""
    logger = logging.getLogger("websockets.client")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)


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
        for _ in range(200):
            if _records(capture, "3-0"):
                break
            await asyncio.sleep(0.02)
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
    translated = settings_for(upstream.url, None, model_type="vllm_model")
    async with model_server(translated) as url, aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await _raw_socket(session, url + "/ng-rollout/0-0/v1/responses")
        assert refused.value.status == 501

"""The fake upstream over a real socket: routes, streams, failure modes, auth, lifecycle."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2
import orjson
import pytest

from rollcap.dialects import StreamOutcome, get_dialect, reassemble
from rollcap.sse import SSEDecoder
from rollcap.testing import SCENARIOS, FakeUpstream
from tests.testing._support import DIALECTS, TERMINAL_OUTCOME, request, with_stream_index

PATHS = {"responses": "/v1/responses", "chat": "/v1/chat/completions", "messages": "/v1/messages"}
# Bounds every wait in this file: a broken fake fails a test instead of hanging it.
TIMEOUT = httpx2.Timeout(10.0)


@pytest.fixture
async def client(upstream: FakeUpstream) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=upstream.url, timeout=TIMEOUT) as http:
        yield http


def stream_body(dialect: str, **extra: Any) -> dict[str, Any]:
    options = {"stream_options": {"include_usage": True}} if dialect == "chat" else {}
    return request(dialect, stream=True, **options, **extra)


async def read_stream(
    client: httpx2.AsyncClient, dialect: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[httpx2.Response, list[bytes]]:
    chunks: list[bytes] = []
    async with client.stream("POST", PATHS[dialect], json=body, headers=headers) as response:
        async for chunk in response.aiter_raw():
            chunks.append(chunk)
    return response, chunks


async def wait_until(condition: Any, what: str) -> None:
    """Poll ``condition`` for up to 10 s (a bound against hanging, not a timing assertion)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# --- complete answers -----------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["text", "tool", "reasoning", "incomplete"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_stream_reassembles_to_the_non_streamed_answer(
    client: httpx2.AsyncClient, dialect: str, scenario: str
) -> None:
    headers = {"x-fake-scenario": scenario}
    whole = await client.post(PATHS[dialect], json=request(dialect), headers=headers)
    response, chunks = await read_stream(client, dialect, stream_body(dialect), headers)

    assert whole.status_code == response.status_code == 200
    assert whole.headers["content-type"] == "application/json"
    assert response.headers["content-type"].startswith("text/event-stream")
    id_header = "request-id" if dialect == "messages" else "x-request-id"
    assert whole.headers[id_header].startswith("req_")
    assert response.headers[id_header] != whole.headers[id_header]

    result = reassemble(dialect, chunks)
    assert result.outcome is TERMINAL_OUTCOME.get((dialect, scenario), StreamOutcome.COMPLETED)
    assert result.response == with_stream_index(whole.json())
    usage = get_dialect(dialect).normalize(whole.json()).usage
    assert usage.tokens_in == 17
    assert usage.cached_tokens == 8


async def test_scenario_by_model_name(client: httpx2.AsyncClient) -> None:
    body = {**request("chat"), "model": "tool"}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert response.json()["model"] == "tool"


async def test_many_events_and_chunk_delay(client: httpx2.AsyncClient) -> None:
    headers = {"x-fake-events": "200", "x-fake-chunk-delay-ms": "0.1", "x-fake-delay-ms": "1"}
    _, chunks = await read_stream(client, "responses", stream_body("responses"), headers)
    result = reassemble("responses", chunks)
    assert result.outcome is StreamOutcome.COMPLETED
    assert result.response is not None
    assert len(result.response["output"][0]["content"][0]["text"].split()) == 200


async def test_large_non_streamed_answer(client: httpx2.AsyncClient) -> None:
    headers = {"x-fake-content-bytes": "2000000"}
    response = await client.post("/v1/messages", json=request("messages"), headers=headers)
    assert len(response.json()["content"][0]["text"]) == 2_000_000


# --- failure modes --------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.startswith("http_")])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_http_error_status_and_body(
    client: httpx2.AsyncClient, dialect: str, scenario: str
) -> None:
    headers = {"x-fake-scenario": scenario}
    response = await client.post(PATHS[dialect], json=stream_body(dialect), headers=headers)
    assert response.status_code == int(scenario.removeprefix("http_"))
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    if dialect == "messages":
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
        assert body["request_id"] == response.headers["request-id"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_malformed_json(client: httpx2.AsyncClient, dialect: str) -> None:
    headers = {"x-fake-scenario": "malformed_json"}
    whole = await client.post(PATHS[dialect], json=request(dialect), headers=headers)
    assert whole.status_code == 200
    assert whole.headers["content-type"] == "application/json"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(whole.content)

    response, chunks = await read_stream(client, dialect, stream_body(dialect), headers)
    assert response.status_code == 200
    result = reassemble(dialect, chunks)
    assert result.outcome is StreamOutcome.COMPLETED


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_truncated_stream_closes_without_terminal_event(
    client: httpx2.AsyncClient, dialect: str
) -> None:
    chunks: list[bytes] = []
    headers = {"x-fake-scenario": "truncate"}

    async def call() -> None:
        async with client.stream(
            "POST", PATHS[dialect], json=stream_body(dialect), headers=headers
        ) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                chunks.append(chunk)

    with pytest.raises(httpx2.RemoteProtocolError):
        await call()
    result = reassemble(dialect, chunks)
    assert result.outcome is StreamOutcome.TRUNCATED
    assert result.response is not None


async def test_truncated_body_closes_short_of_its_length(client: httpx2.AsyncClient) -> None:
    with pytest.raises(httpx2.RemoteProtocolError):
        await client.post(
            "/v1/responses", json=request("responses"), headers={"x-fake-scenario": "truncate"}
        )


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_stream_error(client: httpx2.AsyncClient, dialect: str) -> None:
    headers = {"x-fake-scenario": "stream_error"}
    response, chunks = await read_stream(client, dialect, stream_body(dialect), headers)
    assert response.status_code == 200
    result = reassemble(dialect, chunks)
    assert result.outcome is StreamOutcome.ERROR
    assert result.error is not None


async def test_hang_ends_when_the_client_gives_up(
    upstream: FakeUpstream, client: httpx2.AsyncClient
) -> None:
    with pytest.raises(httpx2.ReadTimeout):
        await client.post(
            "/v1/chat/completions",
            json=request("chat"),
            headers={"x-fake-scenario": "hang"},
            timeout=0.2,
        )
    await wait_until(lambda: upstream.in_flight == 0, "the hanging handler to end")
    # The server still answers.
    assert (await client.post("/v1/chat/completions", json=request("chat"))).status_code == 200


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_endless_streams_text_until_the_client_leaves(
    upstream: FakeUpstream, client: httpx2.AsyncClient, dialect: str
) -> None:
    headers = {"x-fake-scenario": "endless", "x-fake-content-bytes": "100"}
    received = bytearray()
    async with client.stream(
        "POST", PATHS[dialect], json=stream_body(dialect), headers=headers
    ) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_raw():
            received += chunk
            if len(received) > 1_000_000:  # far more than any finite answer of the fake's
                break
    result = reassemble(dialect, [bytes(received)])
    assert result.outcome is StreamOutcome.TRUNCATED  # never a terminal event
    assert result.response is not None
    text = orjson.dumps(result.response).decode()
    assert text.count("alpha bravo") > 1000  # the same 100 bytes of text, again and again
    await wait_until(lambda: upstream.in_flight == 0, "the handler to end")
    refused = await client.post(
        PATHS[dialect], json=request(dialect), headers={"x-fake-scenario": "endless"}
    )
    assert refused.status_code == 400  # a stream only


async def test_delay_before_the_first_byte(client: httpx2.AsyncClient) -> None:
    with pytest.raises(httpx2.ReadTimeout):
        await client.post(
            "/v1/messages",
            json=request("messages"),
            headers={"x-fake-delay-ms": "60000"},
            timeout=0.2,
        )


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect(client: httpx2.AsyncClient, stream: bool) -> None:
    with pytest.raises(httpx2.RemoteProtocolError):
        await client.post(
            "/v1/responses",
            json=request("responses", stream=stream),
            headers={"x-fake-scenario": "disconnect"},
        )


async def test_bad_json_body_gets_400(client: httpx2.AsyncClient) -> None:
    response = await client.post("/v1/messages", content=b"{oops")
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


# --- auth -----------------------------------------------------------------------------------------


@pytest.fixture
async def locked() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream(api_key="sk-secret") as server:
        yield server


@pytest.mark.parametrize(
    ("dialect", "headers", "status"),
    [
        ("responses", {}, 401),
        ("responses", {"authorization": "Bearer sk-wrong"}, 401),
        ("responses", {"authorization": "Bearer sk-secret"}, 200),
        ("chat", {"authorization": "Bearer sk-secret"}, 200),
        ("chat", {"x-api-key": "sk-secret"}, 401),
        ("messages", {"x-api-key": "sk-secret"}, 200),
        ("messages", {"authorization": "Bearer sk-secret"}, 200),
        ("messages", {"x-api-key": "sk-wrong"}, 401),
        ("messages", {}, 401),
    ],
)
async def test_api_key(
    locked: FakeUpstream, dialect: str, headers: dict[str, str], status: int
) -> None:
    async with httpx2.AsyncClient(base_url=locked.url, timeout=TIMEOUT) as http:
        response = await http.post(PATHS[dialect], json=request(dialect), headers=headers)
    assert response.status_code == status
    if status == 401:
        body = response.json()
        if dialect == "messages":
            assert body["error"]["type"] == "authentication_error"
        else:
            assert body["error"]["code"] == "invalid_api_key"


async def test_api_key_guards_models_not_health(locked: FakeUpstream) -> None:
    async with httpx2.AsyncClient(base_url=locked.url, timeout=TIMEOUT) as http:
        assert (await http.get("/v1/models")).status_code == 401
        good = await http.get("/v1/models", headers={"authorization": "Bearer sk-secret"})
        assert good.status_code == 200
        assert (await http.get("/health")).status_code == 200


# --- other routes, observability ------------------------------------------------------------------


async def test_models_and_health(client: httpx2.AsyncClient) -> None:
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    ids = [model["id"] for model in models["data"]]
    assert ids[0] == "fake-model"
    assert set(SCENARIOS) <= set(ids)
    assert all(model["object"] == "model" for model in models["data"])
    health = (await client.get("/health")).json()
    assert health == {"status": "ok", "in_flight": 0, "open_connections": 1}


async def test_only_v1_routes(client: httpx2.AsyncClient) -> None:
    assert (await client.post("/chat/completions", json=request("chat"))).status_code == 404
    assert (await client.get("/v1/messages")).status_code == 405


async def test_requests_are_recorded(upstream: FakeUpstream, client: httpx2.AsyncClient) -> None:
    await client.post("/v1/chat/completions", json=request("chat"), headers={"X-Session-Id": "s-1"})
    await client.post("/v1/messages", content=b"not json")
    first, second = upstream.requests
    assert (first.method, first.path) == ("POST", "/v1/chat/completions")
    assert first.headers["x-session-id"] == "s-1"
    assert first.json == request("chat")
    assert orjson.loads(first.body) == first.json
    assert (second.path, second.body, second.json) == ("/v1/messages", b"not json", None)


async def test_connection_and_in_flight_counts(
    upstream: FakeUpstream, client: httpx2.AsyncClient
) -> None:
    assert (upstream.open_connections, upstream.in_flight) == (0, 0)
    hanging = asyncio.create_task(
        client.post("/v1/responses", json=request("responses"), headers={"x-fake-scenario": "hang"})
    )
    try:
        await wait_until(lambda: upstream.in_flight == 1, "the request to arrive")
        assert upstream.open_connections == 1
    finally:
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
    await wait_until(lambda: upstream.in_flight == 0, "the handler to end")
    await wait_until(lambda: upstream.open_connections == 0, "the connection to close")


# --- lifecycle ------------------------------------------------------------------------------------


async def test_url_shape_and_stop_refuses_connections() -> None:
    server = FakeUpstream()
    with pytest.raises(RuntimeError, match="not been started"):
        _ = server.url
    await server.start()
    assert server.running
    assert server.url.startswith("http://127.0.0.1:")
    assert not server.url.endswith("/")
    with pytest.raises(RuntimeError, match="already running"):
        await server.start()
    await server.stop()
    await server.stop()  # twice is fine
    assert not server.running
    async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
        with pytest.raises(httpx2.ConnectError):
            await http.get(server.url + "/health")


@pytest.mark.parametrize(
    "headers",
    [
        {"x-fake-scenario": "hang"},
        {"x-fake-delay-ms": "600000"},
        {"x-fake-chunk-delay-ms": "600000"},
    ],
)
async def test_stop_ends_waiting_requests_and_leaves_no_tasks(headers: dict[str, str]) -> None:
    server = FakeUpstream()
    await server.start()
    async with httpx2.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:

        async def call() -> None:
            async with http.stream(
                "POST", "/v1/chat/completions", json=stream_body("chat"), headers=headers
            ) as response:
                async for _ in response.aiter_raw():
                    pass

        waiting = asyncio.create_task(call())
        await wait_until(lambda: server.in_flight == 1, "the request to arrive")
        await asyncio.wait_for(server.stop(), 10)
        with pytest.raises(httpx2.RemoteProtocolError):
            await asyncio.wait_for(waiting, 10)
    assert server.in_flight == 0
    assert server.open_connections == 0
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_restart_after_stop() -> None:
    server = FakeUpstream()
    async with server:
        pass
    async with server, httpx2.AsyncClient(timeout=TIMEOUT) as http:
        assert (await http.get(server.url + "/health")).status_code == 200


async def test_port_in_use_fails_to_start(upstream: FakeUpstream) -> None:
    port = int(upstream.url.rsplit(":", 1)[1])
    with pytest.raises(OSError, match=r"(?i)in use"):
        await FakeUpstream(port=port).start()


def test_running_in_thread_serves_sync_code() -> None:
    threads = threading.active_count()
    with FakeUpstream.running_in_thread(api_key="k") as server:
        with httpx2.Client(base_url=server.url, timeout=TIMEOUT) as http:
            response = http.post(
                "/v1/chat/completions", json=request("chat"), headers={"authorization": "Bearer k"}
            )
        assert response.status_code == 200
        assert len(server.requests) == 1
        assert server.running
    assert not server.running
    assert threading.active_count() == threads


def test_running_in_thread_raises_start_errors() -> None:
    with FakeUpstream.running_in_thread() as server:
        port = int(server.url.rsplit(":", 1)[1])
        with pytest.raises(OSError, match=r"(?i)in use"), FakeUpstream.running_in_thread(port=port):
            pass


# --- the Responses WebSocket ----------------------------------------------------------------------

# Bounds every wait on a socket in this file, as TIMEOUT does for HTTP.
WS_TIMEOUT_S = 10.0
TERMINAL = ("response.completed", "response.incomplete")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WS_TIMEOUT_S)) as http:
        yield http


def create(**fields: Any) -> str:
    return orjson.dumps({"type": "response.create", **fields}).decode()


async def read_turn(ws: aiohttp.ClientWebSocketResponse) -> list[str]:
    """The messages of one turn: up to its terminal or error event, or the socket's close."""
    messages: list[str] = []
    while True:
        message = await ws.receive(timeout=WS_TIMEOUT_S)
        if message.type is not aiohttp.WSMsgType.TEXT:
            return messages
        messages.append(message.data)
        if orjson.loads(message.data)["type"] in (*TERMINAL, "error"):
            return messages


async def http_stream_data(
    client: httpx2.AsyncClient, body: dict[str, Any], headers: dict[str, str]
) -> list[str]:
    """The ``data`` of each event the HTTP route streams for ``body``."""
    response, chunks = await read_stream(client, "responses", {**body, "stream": True}, headers)
    assert response.status_code == 200
    decoder = SSEDecoder()
    return [event.data for chunk in chunks for event in decoder.feed(chunk)] + [
        event.data for event in decoder.flush()
    ]


async def test_socket_turns_are_the_http_stream_of_the_full_request(
    upstream: FakeUpstream, client: httpx2.AsyncClient, session: aiohttp.ClientSession
) -> None:
    headers = {"x-fake-scenario": "tool_turns", "x-fake-chunk-delay-ms": "1"}
    first = request("responses")
    async with session.ws_connect(upstream.url + "/v1/responses", headers=headers) as ws:
        await ws.send_str(create(**first))
        turn = await read_turn(ws)
        assert turn == await http_stream_data(client, first, headers)
        response = orjson.loads(turn[-1])["response"]
        [call] = response["output"]
        result = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        second = {"model": "gpt-test", "tools": first["tools"], "input": [result]}
        await ws.send_str(create(**second, previous_response_id=response["id"]))
        turn = await read_turn(ws)
        full = {
            **second,
            "previous_response_id": response["id"],
            "input": [{"role": "user", "content": first["input"]}, call, result],
        }
        assert turn == await http_stream_data(client, full, headers)
        assert orjson.loads(turn[-1])["type"] == "response.completed"
    received = [r for r in upstream.requests if r.method == "WEBSOCKET"]
    assert [r.json["input"] for r in received] == [first["input"], [result]]
    assert {(r.path, r.headers["x-fake-scenario"]) for r in received} == {
        ("/v1/responses", "tool_turns")
    }
    assert orjson.loads(received[0].body) == received[0].json


async def test_socket_turns_are_answered_one_after_another(
    upstream: FakeUpstream, session: aiohttp.ClientSession
) -> None:
    headers = {"x-fake-chunk-delay-ms": "2"}
    async with session.ws_connect(upstream.url + "/v1/responses", headers=headers) as ws:
        for word in ("one", "two", "three"):
            await ws.send_str(create(**request("responses", input=word)))
        turns = [await read_turn(ws) for _ in range(3)]
    inputs = [orjson.loads(turn[-1])["response"]["id"] for turn in turns]
    assert len(set(inputs)) == 3
    for turn in turns:
        kinds = [orjson.loads(message)["type"] for message in turn]
        assert kinds[0] == "response.created"
        assert kinds.count("response.created") == 1
        assert kinds[-1] == "response.completed"
    await wait_until(lambda: upstream.in_flight == 0, "the turns to end")


async def test_socket_refused_without_the_api_key(
    locked: FakeUpstream, session: aiohttp.ClientSession
) -> None:
    for headers in ({}, {"authorization": "Bearer sk-wrong"}):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(locked.url + "/v1/responses", headers=headers)
        assert refused.value.status == 401
    good = {"authorization": "Bearer sk-secret"}
    async with session.ws_connect(locked.url + "/v1/responses", headers=good) as ws:
        await ws.send_str(create(**request("responses")))
        assert orjson.loads((await read_turn(ws))[-1])["type"] == "response.completed"
    assert [r.method for r in locked.requests] == ["WEBSOCKET"]


async def test_a_plain_get_of_responses_is_still_refused(client: httpx2.AsyncClient) -> None:
    response = await client.get("/v1/responses")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    # An upgrade without the WebSocket handshake's headers is a bad request.
    upgrade = {"connection": "upgrade", "upgrade": "websocket"}
    assert (await client.get("/v1/responses", headers=upgrade)).status_code == 400


async def test_truncate_closes_the_socket_mid_turn(
    upstream: FakeUpstream, session: aiohttp.ClientSession
) -> None:
    headers = {"x-fake-scenario": "truncate"}
    async with session.ws_connect(upstream.url + "/v1/responses", headers=headers) as ws:
        await ws.send_str(create(**request("responses")))
        turn = await read_turn(ws)
        assert turn
        assert all(orjson.loads(message)["type"] not in TERMINAL for message in turn)
        assert ws.closed
        assert ws.close_code == 1011
    await wait_until(lambda: upstream.in_flight == 0, "the turn to end")
    await wait_until(lambda: upstream.open_connections == 0, "the connection to close")


async def test_disconnect_closes_the_socket_without_an_answer(
    upstream: FakeUpstream, session: aiohttp.ClientSession
) -> None:
    async with session.ws_connect(upstream.url + "/v1/responses") as ws:
        await ws.send_str(create(**request("responses", model="disconnect")))
        assert await read_turn(ws) == []
        assert ws.close_code == 1011


async def test_the_socket_survives_an_error_event(
    upstream: FakeUpstream, session: aiohttp.ClientSession
) -> None:
    async with session.ws_connect(upstream.url + "/v1/responses") as ws:
        await ws.send_str(create(**request("responses", model="http_500")))
        await ws.send_str("not json")
        await ws.send_str(create(input="hi", previous_response_id="resp_gone"))
        errors = [orjson.loads((await read_turn(ws))[0]) for _ in range(3)]
        assert [(e["type"], e["status"]) for e in errors] == [
            ("error", 500),
            ("error", 400),
            ("error", 400),
        ]
        assert errors[0]["error"]["type"] == "server_error"
        assert errors[1]["error"]["code"] == "invalid_json"
        assert errors[2]["error"]["code"] == "previous_response_not_found"
        await ws.send_str(create(**request("responses")))
        assert orjson.loads((await read_turn(ws))[-1])["type"] == "response.completed"
    assert [r.json for r in upstream.requests][1] is None  # "not json", noted as it came


async def test_a_hanging_turn_ends_when_the_client_closes(
    upstream: FakeUpstream, session: aiohttp.ClientSession
) -> None:
    async with session.ws_connect(upstream.url + "/v1/responses") as ws:
        await ws.send_str(create(**request("responses", model="hang")))
        await wait_until(lambda: upstream.in_flight == 1, "the turn to start")
        assert upstream.open_connections == 1
    await wait_until(lambda: upstream.in_flight == 0, "the hanging turn to end")
    await wait_until(lambda: upstream.open_connections == 0, "the connection to close")


@pytest.mark.parametrize("reading", [True, False])
@pytest.mark.parametrize("model", ["gpt-test", "hang"])
async def test_stop_closes_an_open_socket(model: str, reading: bool) -> None:
    server = FakeUpstream()
    await server.start()
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(server.url + "/v1/responses") as ws,
    ):
        await ws.send_str(create(**request("responses", model=model)))
        if model == "hang":
            await wait_until(lambda: server.in_flight == 1, "the turn to start")
        else:
            await read_turn(ws)
        stopping = asyncio.create_task(asyncio.wait_for(server.stop(), WS_TIMEOUT_S))
        if not reading:
            # A client that does not read gets the close frame all the same: the connection
            # closes right after it (the client's own close frame then finds it gone).
            await stopping
        message = await ws.receive(timeout=WS_TIMEOUT_S)
        await stopping
        assert message.type is aiohttp.WSMsgType.CLOSE
        assert (message.data, message.extra) == (1001, "the fake upstream is stopping")
        if reading:  # its reply completed the close handshake
            assert ws.close_code == 1001
    assert server.in_flight == 0
    assert server.open_connections == 0
    assert asyncio.all_tasks() == {asyncio.current_task()}

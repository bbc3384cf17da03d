"""A scripted model upstream on 127.0.0.1 for the real harnesses, keeping every byte it exchanged.

It plays a short coding-agent session in Anthropic Messages (for Claude Code) and OpenAI
Responses (for Codex CLI): while the conversation carries fewer tool results than the script has
steps, the answer is the next step's tool call (a shell command, a file read); then a text
answer. A request that is not the agent's main loop (a title, a topic, a summary: Claude Code's
side calls carry no shell tool) gets a short text answer, and ``count_tokens`` a count. Streams
go out one event per write, after a pause before the first byte, so that time to first token has
something to measure.

Responses also come over WebSocket (``GET /v1/responses`` upgraded): each ``response.create``
event is a turn, answered by the same script with the same events, one JSON object per text
message, after the same pause. A turn with ``previous_response_id`` sends only its new input
items, so the socket keeps its responses (their full input and their output), as the API does:
the script counts the tool results of the whole conversation. ``generate: false`` is answered as
the API answers it: a response with no output, stored to be continued from.

Each call is kept as an ``Exchange``: the request's exact body and the response's exact bytes,
with the tool calls and token counts the answer carried, for a test to hold rollcap's record to.
A socket is one ``Exchange`` for its handshake (kind ``websocket``) and one for each message the
client sent on it (``transport`` ``websocket``): the message's exact text as the request, and the
server's messages that answered it in the SSE form a stream record holds (``event: <type>`` and
``data: <the message>``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import WSMsgType, web

__all__ = [
    "FIRST_BYTE_DELAY_S",
    "MARK",
    "Exchange",
    "ScriptedUpstream",
    "Step",
    "scripted_upstream",
]

# Long enough to stand out from the proxy's own overhead in the record's TTFT.
FIRST_BYTE_DELAY_S = 0.2
MARK = "harness"  # in every id the upstream makes, so a test can tell its tool calls apart
FINAL_TEXT = "Done: the command printed hi and the notes file says rollcap-harness-ok."
SIDE_TEXT = "Harness session"
_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key"})
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Step:
    """One tool call the script makes, for each harness in its own words."""

    name: str
    arguments: dict[str, Any]
    expect_in_result: str  # the tool's output must show this when it comes back


@dataclass
class Exchange:
    """One call as it crossed the wire: what came in, what went out, what the answer meant."""

    index: int
    method: str
    path: str  # with its query string
    headers: dict[str, str]  # the request's, names lower-cased
    request: bytes
    status: int
    response: bytes
    # tool | answer | side | prewarm | count_tokens | models | websocket (a handshake) |
    # unknown; a client event on a socket that is no response.create: its type
    kind: str
    stream: bool
    response_id: str | None
    tool_calls: list[dict[str, Any]]  # [{call_id, name, arguments}], as sent
    usage: dict[str, Any]  # the usage object the answer reported
    # call id -> the tool's output, in the conversation the answer was made for: as the request
    # sent it back over HTTP; on a socket, the stored conversation's and the turn's new items
    tool_results: dict[str, str]
    transport: str = "http"  # http | websocket (a message on a socket)
    socket: int | None = None  # a socket message's: its handshake's index

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["request"] = base64.b64encode(self.request).decode()
        out["response"] = base64.b64encode(self.response).decode()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Exchange:
        fields = dict(data)
        fields["request"] = base64.b64decode(fields["request"])
        fields["response"] = base64.b64decode(fields["response"])
        return cls(**fields)


@dataclass
class _Answer:
    kind: str
    text: str | None = None
    tool: Step | None = None
    call_id: str | None = None


@dataclass
class ScriptedUpstream:
    """The server; ``exchanges`` in the order the calls arrived."""

    messages_steps: list[Step]
    responses_steps: list[Step]
    expected_key: str
    exchanges: list[Exchange] = field(default_factory=list)
    refused_credentials: int = 0  # calls that came with another key than rollcap's
    url: str = ""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        given = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
        if given != self.expected_key:
            self.refused_credentials += 1
        exchange = Exchange(
            index=next(self._ids),
            method=request.method,
            path=request.path_qs,
            # Written to disk beside the capture: a key in it would be this test's own leak.
            headers={
                name: "<redacted>" if name in _CREDENTIAL_HEADERS else value
                for name, value in headers.items()
            },
            request=raw,
            status=200,
            response=b"",
            kind="unknown",
            stream=False,
            response_id=None,
            tool_calls=[],
            usage={},
            tool_results={},
        )
        self.exchanges.append(exchange)
        route = (request.method, request.path.rstrip("/"))
        if route == ("GET", "/v1/responses") and _upgrade(request):
            return await self._socket(request, exchange)
        if route == ("POST", "/v1/messages/count_tokens"):
            exchange.kind = "count_tokens"
            return _json(exchange, {"input_tokens": 42})
        if route == ("GET", "/v1/models"):
            exchange.kind = "models"
            return _json(exchange, {"object": "list", "data": []})
        if route == ("POST", "/v1/messages"):
            body = orjson.loads(raw)
            exchange.tool_results = _messages_tool_results(body.get("messages") or [])
            answer = self._answer(self.messages_steps, body, exchange, "toolu")
            message = _message(body, answer, exchange)
            if body.get("stream") is not True:
                return _json(exchange, message, "request-id")
            events = _message_events(message)
            return await _stream(request, exchange, events, "request-id")
        if route == ("POST", "/v1/responses"):
            body = orjson.loads(raw)
            items = body.get("input")
            exchange.tool_results = _responses_tool_results(
                items if isinstance(items, list) else []
            )
            answer = self._answer(self.responses_steps, body, exchange, "call")
            response = _response(body, answer, exchange)
            if body.get("stream") is not True:
                return _json(exchange, response, "x-request-id")
            events = _response_events(response)
            return await _stream(request, exchange, events, "x-request-id")
        exchange.status = 404
        return _json(exchange, {"error": {"type": "not_found", "message": request.path_qs}})

    async def _socket(self, request: web.Request, handshake: Exchange) -> web.StreamResponse:
        """A Responses WebSocket: its messages answered one after another, as they came."""
        handshake.kind = "websocket"
        handshake.status = 101
        ws = web.WebSocketResponse(max_msg_size=_MAX_MESSAGE_BYTES, autoping=True)
        # The API names the socket's request as it names an HTTP call's.
        ws.headers["x-request-id"] = f"req_{MARK}_{handshake.index:04d}"
        await ws.prepare(request)
        conversation = _Conversation()
        async for message in ws:
            if message.type is WSMsgType.TEXT:
                raw = message.data.encode()
            elif message.type is WSMsgType.BINARY:
                raw = message.data
            else:
                continue
            exchange = dataclasses.replace(
                handshake,
                index=next(self._ids),
                method="WEBSOCKET",
                headers=dict(handshake.headers),
                request=raw,
                status=200,
                response=b"",
                kind="unknown",
                tool_calls=[],
                usage={},
                tool_results={},
                transport="websocket",
                socket=handshake.index,
            )
            self.exchanges.append(exchange)
            try:
                await self._turn(ws, conversation, exchange)
            except ConnectionError:  # the client left in the middle of the answer
                break
        return ws

    async def _turn(
        self, ws: web.WebSocketResponse, conversation: _Conversation, exchange: Exchange
    ) -> None:
        """One client message: a ``response.create`` is answered; another event is kept, by its
        type, and not answered (Codex sends none: the test would see one)."""
        try:
            event = orjson.loads(exchange.request)
        except orjson.JSONDecodeError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            exchange.status = 400
            await _send_events(ws, exchange, [_invalid("invalid_event", "Not an event.")])
            return
        if event["type"] != "response.create":
            exchange.kind = event["type"]
            return
        body = {key: value for key, value in event.items() if key != "type"}
        previous_id = body.get("previous_response_id")
        previous = conversation.stored.get(previous_id) if previous_id is not None else None
        if previous_id is not None and previous is None:
            exchange.status = 400
            message = f"Previous response with id '{previous_id}' not found."
            error = _invalid("previous_response_not_found", message, "previous_response_id")
            await _send_events(ws, exchange, [error])
            return
        items = body.get("input")
        new_items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        full = [*(previous or ()), *(new_items if isinstance(new_items, list) else [])]
        exchange.tool_results = _responses_tool_results(full)
        if body.get("generate") is False:
            # Prepared, not generated: the API stores the input under a response with no output.
            exchange.kind = "prewarm"
            exchange.stream = True
            response = _response(body, _Answer("prewarm"), exchange)
            response["usage"] = exchange.usage = _zero_usage()
            events: list[dict[str, Any]] = [
                {
                    "type": "response.created",
                    "response": {**response, "status": "in_progress", "usage": None},
                },
                {"type": "response.completed", "response": response},
            ]
            events = [{**event, "sequence_number": n} for n, event in enumerate(events)]
        else:
            answer = self._answer(self.responses_steps, body, exchange, "call")
            exchange.stream = True  # every turn on a socket is a stream
            response = _response(body, answer, exchange)
            events = _response_events(response)
        await asyncio.sleep(FIRST_BYTE_DELAY_S)
        await _send_events(ws, exchange, events)
        conversation.stored[response["id"]] = (*full, *response["output"])

    def _answer(
        self, steps: list[Step], body: Mapping[str, Any], exchange: Exchange, id_prefix: str
    ) -> _Answer:
        tools = {tool.get("name") for tool in body.get("tools") or [] if isinstance(tool, dict)}
        answer = _next_answer(steps, tools, exchange.tool_results, exchange.index, id_prefix)
        exchange.kind = answer.kind
        exchange.stream = body.get("stream") is True
        if answer.tool is not None and answer.call_id is not None:
            exchange.tool_calls = [
                {
                    "call_id": answer.call_id,
                    "name": answer.tool.name,
                    "arguments": answer.tool.arguments,
                }
            ]
        return answer


@dataclass
class _Conversation:
    """What one socket remembers: each response's whole conversation, its input and output."""

    stored: dict[str, tuple[Any, ...]] = field(default_factory=dict)


def _upgrade(request: web.Request) -> bool:
    return request.headers.get("upgrade", "").strip().lower() == "websocket"


async def _send_events(
    ws: web.WebSocketResponse, exchange: Exchange, events: list[dict[str, Any]]
) -> None:
    """Each event one text message, its JSON object; kept in the SSE form of a stream: its type
    as ``event:`` and the message's exact text as ``data:``."""
    for event in events:
        text = orjson.dumps(event)
        await ws.send_str(text.decode())
        exchange.response += b"event: " + str(event["type"]).encode() + b"\ndata: " + text + b"\n\n"


def _invalid(code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """The API's error event on a socket, for a request it refuses."""
    error = {"type": "invalid_request_error", "code": code, "message": message, "param": param}
    return {"type": "error", "status": 400, "error": error}


def _zero_usage() -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }


def _json(exchange: Exchange, value: Any, id_header: str | None = None) -> web.Response:
    exchange.response = orjson.dumps(value)
    headers = {id_header: f"req_{MARK}_{exchange.index:04d}"} if id_header else {}
    return web.Response(
        body=exchange.response,
        status=exchange.status,
        content_type="application/json",
        headers=headers,
    )


async def _stream(
    request: web.Request, exchange: Exchange, events: list[dict[str, Any]], id_header: str
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            id_header: f"req_{MARK}_{exchange.index:04d}",
        },
    )
    await response.prepare(request)
    await asyncio.sleep(FIRST_BYTE_DELAY_S)
    for event in events:  # one write each, as an API streams them
        frame = _sse(event)
        await response.write(frame)
        exchange.response += frame
    await response.write_eof()
    return response


def _message(body: Mapping[str, Any], answer: _Answer, exchange: Exchange) -> dict[str, Any]:
    """The whole Messages answer; ``_message_events`` streams it."""
    index = exchange.index
    exchange.response_id = f"msg_{MARK}_{index:04d}"
    exchange.usage = {
        "input_tokens": 100 + index,
        "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 7,
        "output_tokens": 10 + index,
    }
    content: list[dict[str, Any]] = []
    if answer.text is not None:
        content.append({"type": "text", "text": answer.text})
    if answer.tool is not None:
        tool = {"type": "tool_use", "id": answer.call_id, "name": answer.tool.name}
        content.append({**tool, "input": answer.tool.arguments})
    message: dict[str, Any] = {
        "id": exchange.response_id,
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": "tool_use" if answer.tool is not None else "end_turn",
        "stop_sequence": None,
        "usage": exchange.usage,
    }
    if "context_management" in body:
        # What the API answers a request that asked for context management: the edits applied.
        message["context_management"] = {"applied_edits": []}
    return message


def _response(body: Mapping[str, Any], answer: _Answer, exchange: Exchange) -> dict[str, Any]:
    """The whole Responses answer; ``_response_events`` streams it."""
    index = exchange.index
    exchange.response_id = f"resp_{MARK}_{index:04d}"
    exchange.usage = {
        "input_tokens": 200 + index,
        "input_tokens_details": {"cached_tokens": 64},
        "output_tokens": 20 + index,
        "output_tokens_details": {"reasoning_tokens": 5},
        "total_tokens": 220 + 2 * index,
    }
    output: list[dict[str, Any]] = []
    if answer.text is not None:
        text = {"type": "output_text", "text": answer.text, "annotations": []}
        output.append(
            {
                "id": f"msg_{MARK}_{index:04d}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        )
    if answer.tool is not None:
        output.append(
            {
                "id": f"fc_{MARK}_{index:04d}",
                "type": "function_call",
                "status": "completed",
                "call_id": answer.call_id,
                "name": answer.tool.name,
                "arguments": orjson.dumps(answer.tool.arguments).decode(),
            }
        )
    return {
        "id": exchange.response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model"),
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "usage": exchange.usage,
    }


def _next_answer(
    steps: list[Step], tools: set[Any], results: Mapping[str, str], index: int, id_prefix: str
) -> _Answer:
    """The main loop (it offers the script's first tool) gets its next step; anything else text."""
    if not steps or steps[0].name not in tools:
        return _Answer("side", text=SIDE_TEXT)
    done = sum(1 for call_id in results if f"_{MARK}_" in call_id)
    if done < len(steps):
        step = steps[done]
        if step.name in tools:
            return _Answer("tool", tool=step, call_id=f"{id_prefix}_{MARK}_{index:04d}")
    return _Answer("answer", text=FINAL_TEXT)


def _sse(event: Mapping[str, Any]) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _halves(text: str) -> list[str]:
    """Two deltas, so that reassembly has something to join."""
    cut = max(1, len(text) // 2)
    return [text[:cut], text[cut:]] if len(text) > 1 else [text]


def _message_events(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    usage = message["usage"]
    start_usage = {**usage, "output_tokens": 1}
    skeleton = {**message, "content": [], "stop_reason": None, "usage": start_usage}
    skeleton.pop("context_management", None)
    events: list[dict[str, Any]] = [{"type": "message_start", "message": skeleton}]
    events.append({"type": "ping"})
    for index, block in enumerate(message["content"]):
        start: dict[str, Any]
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": part} for part in _halves(block["text"])]
        else:
            start = {**block, "input": {}}
            arguments = orjson.dumps(block["input"]).decode()
            deltas = [
                {"type": "input_json_delta", "partial_json": part} for part in _halves(arguments)
            ]
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    delta: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": usage["output_tokens"]},
    }
    if "context_management" in message:
        # Sent at the event's top level, beside delta and usage, as the API does.
        delta["context_management"] = message["context_management"]
    events.append(delta)
    events.append({"type": "message_stop"})
    return events


def _response_events(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    skeleton = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": skeleton},
        {"type": "response.in_progress", "response": skeleton},
    ]
    for position, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": position}
        if item["type"] == "function_call":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": position,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            events += [
                {"type": "response.function_call_arguments.delta", **where, "delta": part}
                for part in _halves(item["arguments"])
            ]
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": item["arguments"],
                }
            )
        else:
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": position,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            events.append(
                {"type": "response.content_part.added", **where, "content_index": 0, "part": part}
            )
            events += [
                {
                    "type": "response.output_text.delta",
                    **where,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                }
                for piece in _halves(text)
            ]
            events.append(
                {
                    "type": "response.output_text.done",
                    **where,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                }
            )
            events.append(
                {
                    "type": "response.content_part.done",
                    **where,
                    "content_index": 0,
                    "part": {**part, "text": text},
                }
            )
        events.append({"type": "response.output_item.done", "output_index": position, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def _messages_tool_results(messages: list[Any]) -> dict[str, str]:
    results: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                results[str(block.get("tool_use_id"))] = _text_of(block.get("content"))
    return results


def _responses_tool_results(items: list[Any]) -> dict[str, str]:
    return {
        str(item.get("call_id")): _text_of(item.get("output"))
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def _text_of(content: Any) -> str:
    """A tool result's text, whether sent as a string or as content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text_of(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


@contextlib.asynccontextmanager
async def scripted_upstream(
    messages_steps: list[Step], responses_steps: list[Step], expected_key: str
) -> AsyncIterator[ScriptedUpstream]:
    """The upstream on a free port of 127.0.0.1, until the block ends."""
    upstream = ScriptedUpstream(messages_steps, responses_steps, expected_key)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    runner = web.AppRunner(upstream.app(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    upstream.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield upstream
    finally:
        await runner.cleanup()

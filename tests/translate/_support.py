"""Helpers for the translation tests: chat answers as streams, translator runs, SDK clients."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import orjson
from hypothesis import strategies as st

from rollcap.dialects import reassemble
from rollcap.sse import SSEDecoder, SSEEvent, encode_event
from rollcap.translate import (
    ChatToMessagesStream,
    ChatToResponsesStream,
    chat_response_to_messages,
    chat_response_to_responses,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CHAT_FIXTURES = sorted((FIXTURES / "chat").glob("*.sse"))

RESPONSES_REQUEST: dict[str, Any] = {"model": "policy", "input": "hi"}
MESSAGES_REQUEST: dict[str, Any] = {
    "model": "policy",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi"}],
    "stop_sequences": ["END", "###"],
}
# A plain tool beside a namespace of two: the chat side sees weather, crm__lookup and crm__update.
CRM_NAMESPACE: dict[str, Any] = {
    "type": "namespace",
    "name": "crm",
    "description": "Customer records.",
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "description": "Find a customer.",
            "parameters": {"type": "object", "properties": {"email": {"type": "string"}}},
        },
        {"type": "function", "name": "update", "parameters": {"type": "object"}, "strict": True},
    ],
}
NAMESPACED_REQUEST: dict[str, Any] = {
    "model": "policy",
    "input": "hi",
    "tools": [{"type": "function", "name": "weather", "parameters": {}}, CRM_NAMESPACE],
}
RESPONSE_ID = "resp_0123abcd"
CREATED_AT = 1_732_000_000
MESSAGE_ID = "msg_0123abcd"


def decode(raw: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return decoder.feed(raw) + decoder.flush(dispatch_unterminated=True)


def encode(events: Iterable[SSEEvent]) -> bytes:
    return b"".join(encode_event(event) for event in events)


def run(
    translator: ChatToResponsesStream | ChatToMessagesStream, events: Iterable[SSEEvent]
) -> list[SSEEvent]:
    out: list[SSEEvent] = []
    for event in events:
        out.extend(translator.feed(event))
    out.extend(translator.finish())
    return out


def to_responses(
    events: Iterable[SSEEvent], request: dict[str, Any] | None = None
) -> list[SSEEvent]:
    translator = ChatToResponsesStream(
        request or RESPONSES_REQUEST, response_id=RESPONSE_ID, created_at=CREATED_AT
    )
    return run(translator, events)


def to_messages(
    events: Iterable[SSEEvent], request: dict[str, Any] | None = None
) -> list[SSEEvent]:
    translator = ChatToMessagesStream(request or MESSAGES_REQUEST, message_id=MESSAGE_ID)
    return run(translator, events)


def with_stop_reason(chat: dict[str, Any], events: Iterable[SSEEvent]) -> dict[str, Any]:
    """The reassembled chat answer with vLLM's per-choice ``stop_reason``, which the chat
    reassembler does not rebuild, put back from the last chunk that carried it."""
    stop_reason = None
    for event in events:
        try:
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            continue
        for choice in chunk.get("choices") or () if isinstance(chunk, dict) else ():
            is_first = isinstance(choice, dict) and choice.get("index", 0) == 0
            if is_first and choice.get("stop_reason") is not None:
                stop_reason = choice["stop_reason"]
    if stop_reason is None or not chat.get("choices"):
        return chat
    first = dict(chat["choices"][0])
    first["stop_reason"] = stop_reason
    return {**chat, "choices": [first, *chat["choices"][1:]]}


def expected_responses(
    upstream: list[SSEEvent], request: dict[str, Any] | None = None
) -> dict[str, Any]:
    chat = reassemble("chat", [encode(upstream)]).response or {}
    return chat_response_to_responses(
        chat, request or RESPONSES_REQUEST, response_id=RESPONSE_ID, created_at=CREATED_AT
    )


def expected_messages(
    upstream: list[SSEEvent], request: dict[str, Any] | None = None
) -> dict[str, Any]:
    chat = reassemble("chat", [encode(upstream)]).response or {}
    chat = with_stop_reason(chat, upstream)
    return chat_response_to_messages(chat, request or MESSAGES_REQUEST, message_id=MESSAGE_ID)


# --- generated chat answers ----------------------------------------------------------------------


@dataclass
class Answer:
    """A chat answer and how its stream is cut; ``chunks()`` gives the upstream events."""

    reasoning: list[str] = field(default_factory=list)
    reasoning_key: str = "reasoning_content"
    content: list[str] = field(default_factory=list)
    late_content: list[str] = field(default_factory=list)  # sent after the tool calls
    refusal: list[str] = field(default_factory=list)
    tools: list[tuple[str | None, str, list[str]]] = field(default_factory=list)
    finish_reason: str | None = "stop"
    stop_reason: str | int | None = None
    usage: dict[str, Any] | None = None
    model: str = "Qwen/Qwen3-8B"
    second_choice: bool = False
    done: bool = True

    def _chunk(self, delta: dict[str, Any], index: int = 0, **extra: Any) -> SSEEvent:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        body = {
            "id": "chatcmpl-gen",
            "object": "chat.completion.chunk",
            "created": 1_732_000_123,
            "model": self.model,
            "choices": [choice],
        }
        return SSEEvent(data=orjson.dumps(body).decode())

    def chunks(self) -> list[SSEEvent]:
        out = [self._chunk({"role": "assistant", "content": ""})]
        if self.second_choice:
            out.append(self._chunk({"role": "assistant", "content": "other"}, index=1))
        out += [self._chunk({self.reasoning_key: piece}) for piece in self.reasoning]
        out += [self._chunk({"content": piece}) for piece in self.content]
        out += [self._chunk({"refusal": piece}) for piece in self.refusal]
        for index, (call_id, name, pieces) in enumerate(self.tools):
            head: dict[str, Any] = {"index": index, "type": "function"}
            if call_id is not None:
                head["id"] = call_id
            head["function"] = {"name": name, "arguments": pieces[0] if pieces else ""}
            out.append(self._chunk({"tool_calls": [head]}))
            for piece in pieces[1:]:
                fragment = {"index": index, "function": {"arguments": piece}}
                out.append(self._chunk({"tool_calls": [fragment]}))
        out += [self._chunk({"content": piece}) for piece in self.late_content]
        if self.second_choice:
            out.append(self._chunk({}, index=1, finish_reason="length"))
        extra: dict[str, Any] = {"finish_reason": self.finish_reason}
        if self.stop_reason is not None:
            extra["stop_reason"] = self.stop_reason
        out.append(self._chunk({}, **extra))
        if self.usage is not None:
            body = {
                "id": "chatcmpl-gen",
                "object": "chat.completion.chunk",
                "created": 1_732_000_123,
                "model": self.model,
                "choices": [],
                "usage": self.usage,
            }
            out.append(SSEEvent(data=orjson.dumps(body).decode()))
        if self.done:
            out.append(SSEEvent(data="[DONE]"))
        return out


_words = st.sampled_from(
    ["", " ", "\n", "\n\n", "Hello", " world", "é", "日本", '"q"', "\\", "{", "}", "a b", "\t"]
)
_texts = st.lists(_words | st.text(max_size=6), max_size=5)


def _split(text: str) -> st.SearchStrategy[list[str]]:
    cuts = st.lists(st.integers(0, len(text)), max_size=4).map(sorted)
    return cuts.map(lambda c: [text[a:b] for a, b in zip([0, *c], [*c, len(text)], strict=True)])


@st.composite
def _tool(draw: st.DrawFn, position: int) -> tuple[str | None, str, list[str]]:
    arguments = draw(
        st.sampled_from(
            [
                "",
                "{}",
                '{"location": "Paris, France"}',
                '{"a": [1, 2.5, null, true], "b": {"c": "d\\n"}}',
                ' {"x": 1}',
                "not json",
            ]
        )
    )
    call_id = draw(st.sampled_from([f"call_{position}", f"chatcmpl-tool-{position}ab"]))
    name = draw(st.sampled_from(["get_weather", "search", "run_code"]))
    return call_id, name, draw(_split(arguments))


_usage = st.fixed_dictionaries(
    {
        "prompt_tokens": st.integers(0, 5000),
        "completion_tokens": st.integers(0, 500),
    },
    optional={
        "total_tokens": st.integers(0, 6000),
        "prompt_tokens_details": st.none()
        | st.fixed_dictionaries({"cached_tokens": st.integers(0, 6000)}),
        "completion_tokens_details": st.none()
        | st.fixed_dictionaries({"reasoning_tokens": st.integers(0, 500)}),
    },
)


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    """Chat answers whose parts arrive in the order reasoning, text, tool calls."""
    reasoning = draw(_texts)
    content = draw(_texts)
    tools = [draw(_tool(i)) for i in range(draw(st.integers(0, 3)))]
    late: list[str] = []
    if tools and content and "".join(content).strip() and draw(st.booleans()):
        # Text may go on after a tool call once its part is open.
        late = content[draw(st.integers(1, len(content))) :]
        content = content[: len(content) - len(late)]
        if not "".join(content).strip():
            content, late = content + late, []
    return Answer(
        reasoning=reasoning,
        reasoning_key=draw(st.sampled_from(["reasoning_content", "reasoning"])),
        content=content,
        late_content=late,
        refusal=draw(st.just([]) | _texts),
        tools=tools,
        finish_reason=draw(
            st.sampled_from(["stop", "length", "tool_calls", "content_filter", None])
        ),
        stop_reason=draw(st.none() | st.sampled_from(["END", "###", "other"]) | st.just(151645)),
        usage=draw(st.none() | _usage),
        second_choice=draw(st.booleans()),
    )


@st.composite
def namespaced_answers(draw: st.DrawFn) -> Answer:
    """``answers()`` whose tool calls name ``NAMESPACED_REQUEST``'s tools, joined names or not."""
    answer = draw(answers())
    names = st.sampled_from(["crm__lookup", "crm__update", "weather", "crm__missing", "crm"])
    answer.tools = [(call_id, draw(names), pieces) for call_id, _name, pieces in answer.tools]
    return answer


# --- SDK clients over canned bytes ---------------------------------------------------------------


def _http_client(body: bytes) -> httpx2.Client:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def openai_client(body: bytes) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="test",
        base_url="http://upstream.test/v1",
        http_client=_http_client(body),
        max_retries=0,
    )


def anthropic_client(body: bytes) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="test",
        base_url="http://upstream.test",
        http_client=_http_client(body),
        max_retries=0,
    )

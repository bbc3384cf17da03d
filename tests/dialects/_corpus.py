"""A corpus of streams for the differential test: generated ones, and every fake-upstream scenario.

The generated streams are built from a seed, so a failure names the stream that shows it. They
carry what servers send and what a new API version may add: refusals, reasoning, parallel tool
calls, citations, several choices, logprobs, usage details, a cut before the end, and unknown keys
at every level (an event's top level, a delta, a content block, a choice, usage details). Every
unknown key is named ``x_probe_*`` so that the test can check each one reached the reassembly.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from rollcap.testing._knobs import (
    DIALECTS,
    HEADER_CACHED_TOKENS,
    HEADER_SCENARIO,
    HEADER_TOOL_TURNS,
)
from rollcap.testing._scenarios import answer
from tests.testing._support import COMPLETING

__all__ = ["PROBE_PREFIX", "Stream", "corpus"]

PROBE_PREFIX = "x_probe_"


@dataclass(frozen=True, slots=True)
class Stream:
    name: str
    dialect: str
    raw: bytes
    cut: bool  # closed before the dialect's terminal event


def _sse(data: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    body = data if isinstance(data, bytes) else orjson.dumps(data)
    return head + b"data: " + body + b"\n\n"


class _Gen:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.probes = 0

    def probe(self, where: str) -> tuple[str, str]:
        self.probes += 1
        return f"{PROBE_PREFIX}{where}", f"probe-{self.seed}-{self.probes}"

    def maybe(self, chance: float = 0.5) -> bool:
        return self.rng.random() < chance

    def pieces(self, text: str) -> list[str]:
        if not text:
            return [text]
        cuts = (
            sorted(self.rng.sample(range(1, len(text)), min(len(text) - 1, 3)))
            if len(text) > 1
            else []
        )
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in itertools.pairwise(bounds)]

    def words(self) -> str:
        vocab = ["Mars", "is", "red", "ünïcode", "naïve", "🚀", "tools", "\n", "42", '"quoted"']
        return " ".join(self.rng.choice(vocab) for _ in range(self.rng.randint(2, 8)))


# --- Chat Completions ----------------------------------------------------------------------------


def _chat(seed: int) -> Stream:
    g = _Gen(seed)
    n = 2 if g.maybe(0.25) else 1
    top: dict[str, Any] = {
        "id": f"chatcmpl-{seed}",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000 + seed,
        "model": "gpt-test",
        "system_fingerprint": "fp_1",
    }
    if g.maybe():
        top["service_tier"] = "default"
    usage_on_every = g.maybe(0.2)
    # vLLM with return_token_ids: the prompt's ids on the first chunk, each chunk's own ids.
    token_ids = g.maybe(0.2)
    if token_ids:
        top["prompt_token_ids"] = [1, 2, 3, seed]
    chunks: list[dict[str, Any]] = []

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> None:
        if token_ids:
            choices = [{**c, "token_ids": [len(chunks), len(chunks) + 1]} for c in choices]
        body = {**top, "choices": choices, **extra}
        if token_ids and chunks:
            del body["prompt_token_ids"]
        if usage_on_every:
            body["usage"] = {
                "prompt_tokens": 5,
                "completion_tokens": len(chunks),
                "total_tokens": 5 + len(chunks),
            }
        chunks.append(body)

    first_extra: dict[str, Any] = {}
    if g.maybe(0.7):
        key, value = g.probe("top")
        first_extra[key] = value
    first_choices = []
    for index in range(n):
        choice: dict[str, Any] = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        if g.maybe(0.4):
            key, value = g.probe("choice")
            choice[key] = value
        first_choices.append(choice)
    chunk(first_choices, **first_extra)
    finishes = {}
    with_logprobs = n == 1 and g.maybe(0.3)
    for index in range(n):
        kind = g.rng.choice(["text", "text", "refusal", "tools", "reasoning"])
        deltas: list[dict[str, Any]] = []
        if kind == "reasoning":
            field = g.rng.choice(["reasoning_content", "reasoning"])
            deltas += [{field: piece} for piece in g.pieces(g.words())]
        if kind in ("text", "reasoning"):
            deltas += [{"content": piece} for piece in g.pieces(g.words())]
            finishes[index] = g.rng.choice(["stop", "stop", "length"])
        elif kind == "refusal":
            deltas += [{"refusal": piece} for piece in g.pieces("I can't help with that.")]
            finishes[index] = "stop"
        else:
            for call in range(g.rng.randint(1, 2)):
                arguments = orjson.dumps({"city": g.words(), "n": call}).decode()
                head: dict[str, Any] = {
                    "index": call,
                    "id": f"call_{seed}_{call}",
                    "type": "function",
                    "function": {"name": f"tool_{call}", "arguments": ""},
                }
                if g.maybe(0.4):
                    key, value = g.probe("tool_call")
                    head[key] = value
                if g.maybe(0.3):
                    key, value = g.probe("function")
                    head["function"][key] = value
                deltas.append({"tool_calls": [head]})
                deltas += [
                    {"tool_calls": [{"index": call, "function": {"arguments": piece}}]}
                    for piece in g.pieces(arguments)
                ]
            finishes[index] = "tool_calls"
        if g.maybe(0.5):
            key, value = g.probe("delta")
            # An unknown string field, streamed in pieces like every text field.
            for position, piece in enumerate(g.pieces(value)):
                deltas.insert(min(position * 2, len(deltas)), {key: piece})
        if g.maybe(0.3):
            key, value = g.probe("delta_obj")
            deltas.insert(0, {key: {"id": value, "count": 1}})
        if kind == "text" and g.maybe(0.3):
            deltas.append(
                {
                    "annotations": [
                        {
                            "type": "url_citation",
                            "url_citation": {
                                "url": "https://example.com",
                                "title": "t",
                                "start_index": 0,
                                "end_index": 3,
                            },
                        }
                    ]
                }
            )
        for delta in deltas:
            choice = {"index": index, "delta": delta, "finish_reason": None}
            if with_logprobs and "content" in delta:
                choice["logprobs"] = {
                    "content": [
                        {
                            "token": delta["content"],
                            "logprob": -0.5,
                            "bytes": list(delta["content"].encode()),
                            "top_logprobs": [],
                        }
                    ],
                    "refusal": None,
                }
            else:
                choice["logprobs"] = None
            chunk([choice])
    for index in range(n):
        chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": finishes[index]}])
    if g.maybe(0.3):
        key, value = g.probe("late_top")
        chunks[-1][key] = value  # a top-level key only a later chunk sends
    if g.maybe(0.7):
        usage: dict[str, Any] = {
            "prompt_tokens": 11,
            "completion_tokens": 7,
            "total_tokens": 18,
            "prompt_tokens_details": {"cached_tokens": 3, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 2},
        }
        if g.maybe():
            key, value = g.probe("usage_detail")
            usage["completion_tokens_details"][key] = value
        chunk([], usage=usage)
    events = [_sse(body) for body in chunks]
    cut = g.maybe(0.15)
    if cut:
        events = events[: g.rng.randint(1, len(events))]
    else:
        events.append(b"data: [DONE]\n\n")
    return Stream(f"chat/gen-{seed}", "chat", b"".join(events), cut)


# --- Anthropic Messages --------------------------------------------------------------------------


def _messages(seed: int) -> Stream:
    g = _Gen(seed)
    events: list[bytes] = []

    def send(kind: str, **body: Any) -> None:
        events.append(_sse({"type": kind, **body}, event=kind))

    message: dict[str, Any] = {
        "id": f"msg_{seed}",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 12,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 4,
            "output_tokens": 1,
            "service_tier": "standard",
        },
    }
    if g.maybe():
        key, value = g.probe("message")
        message[key] = value
    start_extra = dict([g.probe("event_top")]) if g.maybe(0.3) else {}
    send("message_start", message=message, **start_extra)
    if g.maybe():
        send("ping")
    blocks = g.rng.sample(
        ["text", "thinking", "tool_use", "citations", "redacted"], g.rng.randint(1, 3)
    )
    for index, kind in enumerate(blocks):
        if kind == "thinking":
            send(
                "content_block_start",
                index=index,
                content_block={"type": "thinking", "thinking": "", "signature": ""},
            )
            for piece in g.pieces(g.words()):
                send(
                    "content_block_delta",
                    index=index,
                    delta={"type": "thinking_delta", "thinking": piece},
                )
            send(
                "content_block_delta",
                index=index,
                delta={"type": "signature_delta", "signature": f"sig{seed}=="},
            )
        elif kind == "redacted":
            send(
                "content_block_start",
                index=index,
                content_block={"type": "redacted_thinking", "data": f"opaque{seed}"},
            )
        elif kind == "tool_use":
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_{seed}",
                "name": "Bash",
                "input": {},
            }
            if g.maybe(0.3):
                key, value = g.probe("block")
                block[key] = value
            send("content_block_start", index=index, content_block=block)
            arguments = orjson.dumps({"command": g.words(), "timeout": 5}).decode()
            for piece in g.pieces(arguments):
                send(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": piece},
                )
        else:
            start: dict[str, Any] = {"type": "text", "text": ""}
            if kind == "citations":
                start["citations"] = None
            send("content_block_start", index=index, content_block=start)
            for piece in g.pieces(g.words()):
                delta: dict[str, Any] = {"type": "text_delta", "text": piece}
                extra: dict[str, Any] = {}
                if g.maybe(0.1):
                    key, value = g.probe("text_delta")
                    delta[key] = value
                if g.maybe(0.1):
                    key, value = g.probe("delta_event_top")
                    extra[key] = value
                send("content_block_delta", index=index, delta=delta, **extra)
            if kind == "citations":
                citation = {
                    "type": "char_location",
                    "cited_text": "Mars",
                    "document_index": 0,
                    "document_title": "doc",
                    "start_char_index": 0,
                    "end_char_index": 4,
                }
                send(
                    "content_block_delta",
                    index=index,
                    delta={"type": "citations_delta", "citation": citation},
                )
        stop_extra = dict([g.probe("block_stop")]) if g.maybe(0.1) else {}
        send("content_block_stop", index=index, **stop_extra)
    if g.maybe(0.2):
        index = len(blocks)
        key, value = g.probe("block_type")
        send("content_block_start", index=index, content_block={"type": "x_probe_kind", key: value})
        dkey, dvalue = g.probe("delta_type")
        send(
            "content_block_delta",
            index=index,
            delta={"type": "x_probe_kind_delta", dkey: dvalue, "payload": "ab"},
        )
        send(
            "content_block_delta",
            index=index,
            delta={"type": "x_probe_kind_delta", "payload": "cd"},
        )
        send("content_block_stop", index=index)
    delta_body: dict[str, Any] = {
        "stop_reason": "tool_use" if "tool_use" in blocks else "end_turn",
        "stop_sequence": None,
    }
    if g.maybe(0.3):
        key, value = g.probe("message_delta")
        delta_body[key] = value
    usage = {"output_tokens": 9}
    if g.maybe(0.5):
        usage.update(input_tokens=12, cache_read_input_tokens=4)
    if g.maybe(0.2):
        key, value = g.probe("usage")
        usage[key] = value  # type: ignore[assignment]
    top: dict[str, Any] = {}
    if g.maybe(0.6):
        # Claude Code's context-management beta: reported beside delta and usage.
        top["context_management"] = {
            "applied_edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "cleared_tool_uses": seed % 3,
                    "cleared_input_tokens": 120,
                }
            ]
        }
    if g.maybe(0.2):
        key, value = g.probe("message_delta_top")
        top[key] = value
    send("message_delta", delta=delta_body, usage=usage, **top)
    send("message_stop")
    cut = g.maybe(0.15)
    if cut:
        events = events[: g.rng.randint(1, len(events) - 1)]
    return Stream(f"messages/gen-{seed}", "messages", b"".join(events), cut)


# --- Responses -----------------------------------------------------------------------------------


def _responses(seed: int) -> Stream:
    g = _Gen(seed)
    events: list[bytes] = []
    sequence = 0

    def send(kind: str, **body: Any) -> None:
        nonlocal sequence
        events.append(_sse({"type": kind, "sequence_number": sequence, **body}, event=kind))
        sequence += 1

    base: dict[str, Any] = {
        "id": f"resp_{seed}",
        "object": "response",
        "created_at": 1_700_000_000,
        "model": "gpt-test",
        "status": "in_progress",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    send("response.created", response=base)
    output: list[dict[str, Any]] = []
    for index, kind in enumerate(
        g.rng.sample(["message", "function_call", "reasoning", "refusal"], g.rng.randint(1, 3))
    ):
        item_id = f"item_{seed}_{index}"
        if kind == "function_call":
            arguments = orjson.dumps({"path": g.words()}).decode()
            item: dict[str, Any] = {
                "type": "function_call",
                "id": item_id,
                "call_id": f"call_{seed}",
                "name": "read",
                "arguments": "",
                "status": "in_progress",
            }
            send("response.output_item.added", output_index=index, item=item)
            for piece in g.pieces(arguments):
                send(
                    "response.function_call_arguments.delta",
                    output_index=index,
                    item_id=item_id,
                    delta=piece,
                )
            send(
                "response.function_call_arguments.done",
                output_index=index,
                item_id=item_id,
                arguments=arguments,
            )
            done: dict[str, Any] = {**item, "arguments": arguments, "status": "completed"}
        elif kind == "reasoning":
            text = g.words()
            item = {"type": "reasoning", "id": item_id, "summary": []}
            send("response.output_item.added", output_index=index, item=item)
            send(
                "response.reasoning_summary_part.added",
                output_index=index,
                item_id=item_id,
                summary_index=0,
                part={"type": "summary_text", "text": ""},
            )
            for piece in g.pieces(text):
                send(
                    "response.reasoning_summary_text.delta",
                    output_index=index,
                    item_id=item_id,
                    summary_index=0,
                    delta=piece,
                )
            send(
                "response.reasoning_summary_text.done",
                output_index=index,
                item_id=item_id,
                summary_index=0,
                text=text,
            )
            done = {**item, "summary": [{"type": "summary_text", "text": text}]}
        else:
            field, part_type = (
                ("refusal", "refusal") if kind == "refusal" else ("text", "output_text")
            )
            text = "No." if kind == "refusal" else g.words()
            item = {
                "type": "message",
                "id": item_id,
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            send("response.output_item.added", output_index=index, item=item)
            empty: dict[str, Any] = {"type": part_type, field: ""}
            if part_type == "output_text":
                empty |= {"annotations": [], "logprobs": []}
            send(
                "response.content_part.added",
                output_index=index,
                item_id=item_id,
                content_index=0,
                part=empty,
            )
            delta_kind = (
                "response.refusal.delta" if kind == "refusal" else "response.output_text.delta"
            )
            for piece in g.pieces(text):
                extra: dict[str, Any] = {"logprobs": []} if part_type == "output_text" else {}
                send(
                    delta_kind,
                    output_index=index,
                    item_id=item_id,
                    content_index=0,
                    delta=piece,
                    **extra,
                )
            part = {**empty, field: text}
            if g.maybe(0.3):
                key, value = g.probe("part")
                part[key] = value
            send(
                "response.content_part.done",
                output_index=index,
                item_id=item_id,
                content_index=0,
                part=part,
            )
            done = {**item, "status": "completed", "content": [part]}
        if g.maybe(0.3):
            key, value = g.probe("item")
            done[key] = value
        send("response.output_item.done", output_index=index, item=done)
        output.append(done)
    usage: dict[str, Any] = {
        "input_tokens": 20,
        "input_tokens_details": {"cached_tokens": 8},
        "output_tokens": 6,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 26,
    }
    if g.maybe(0.3):
        key, value = g.probe("usage_detail")
        usage["output_tokens_details"][key] = value
    final: dict[str, Any] = {**base, "status": "completed", "output": output, "usage": usage}
    if g.maybe(0.4):
        key, value = g.probe("response")
        final[key] = value
    if g.maybe(0.25):
        # Some servers send the completed response without its output.
        if g.maybe():
            final["output"] = None
        else:
            del final["output"]
    send("response.completed", response=final)
    return Stream(f"responses/gen-{seed}", "responses", b"".join(events), False)


_GENERATORS = {"chat": _chat, "messages": _messages, "responses": _responses}


# --- the fake upstream's scenarios ---------------------------------------------------------------


def _request(dialect: str, scenario: str) -> dict[str, Any]:
    tools_chat = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    if dialect == "chat":
        return {
            "model": scenario,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "What is on Mars?"}],
            "tools": tools_chat,
        }
    if dialect == "messages":
        return {
            "model": scenario,
            "stream": True,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "What is on Mars?"}],
            "tools": [
                {
                    "name": "lookup",
                    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
                }
            ],
        }
    return {
        "model": scenario,
        "stream": True,
        "input": "What is on Mars?",
        "tools": [
            {
                "type": "function",
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            }
        ],
    }


def _fake_streams() -> Iterator[Stream]:
    for dialect in DIALECTS:
        for scenario in COMPLETING:
            for cached in ("0", "7"):
                headers = {
                    HEADER_SCENARIO: scenario,
                    HEADER_CACHED_TOKENS: cached,
                    HEADER_TOOL_TURNS: "2",
                }
                body = _request(dialect, scenario)
                if dialect == "messages" and cached != "0":
                    body["context_management"] = {"edits": [{"type": "clear_tool_uses_20250919"}]}
                reply = answer(
                    dialect,
                    orjson.dumps(body),
                    headers,
                    request_id=f"req_{scenario}",
                )
                yield Stream(
                    f"{dialect}/fake-{scenario}-cached{cached}",
                    dialect,
                    b"".join(reply.events),
                    False,
                )


def corpus(per_dialect: int = 120) -> list[Stream]:
    """``per_dialect`` generated streams of each dialect, then every fake-upstream scenario."""
    streams = [_GENERATORS[d](seed) for d in DIALECTS for seed in range(per_dialect)]
    streams.extend(_fake_streams())
    return streams

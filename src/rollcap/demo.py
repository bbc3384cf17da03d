"""``make demo`` until the model server lands: capture three replayed streams, one per dialect.

Each stream is fed chunk by chunk through the SSE decoder and its dialect's reassembler, exactly
as the model server will do with an upstream's bytes; the record goes through ``CaptureStore``;
then the rollout is read back, normalized and aggregated, as collection will do.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson

from rollcap.dialects import StreamOutcome, get_dialect
from rollcap.records import RawRecord, error_category, model_ref, new_model_call_id
from rollcap.sse import SSEDecoder, SSEEvent, encode_event
from rollcap.store import CaptureStore, capture_attachment


def _sse(events: list[tuple[str | None, dict[str, Any] | str]]) -> bytes:
    return b"".join(
        encode_event(SSEEvent(data=d if isinstance(d, str) else orjson.dumps(d).decode(), event=e))
        for e, d in events
    )


def _responses_stream() -> bytes:
    resp = {"id": "resp_demo1", "object": "response", "model": "demo-model", "output": []}
    msg = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    text = {"type": "output_text", "text": "The answer is B.", "annotations": []}
    usage = {"input_tokens": 42, "output_tokens": 6, "total_tokens": 48}
    done = {**resp, "status": "completed", "output": [{**msg, "content": [text]}], "usage": usage}
    return _sse(
        [
            ("response.created", {"type": "response.created", "response": resp}),
            ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "B"}),
            ("response.completed", {"type": "response.completed", "response": done}),
        ]
    )


def _chat_stream() -> bytes:
    base = {"id": "chatcmpl-demo", "object": "chat.completion.chunk", "model": "demo-model"}
    call = {"index": 0, "id": "call_1", "type": "function"}
    return _sse(
        [
            (None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
            (
                None,
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {**call, "function": {"name": "lookup", "arguments": '{"q":'}}
                                ]
                            },
                        }
                    ],
                },
            ),
            (
                None,
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [{"index": 0, "function": {"arguments": '"B"}'}}]
                            },
                            "finish_reason": "tool_calls",
                        }
                    ],
                },
            ),
            (None, {**base, "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 9}}),
            (None, "[DONE]"),
        ]
    )


def _messages_stream(*, truncated: bool) -> bytes:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_demo",
            "type": "message",
            "role": "assistant",
            "model": "demo-model",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 25, "cache_read_input_tokens": 10, "output_tokens": 1},
        },
    }
    events: list[tuple[str | None, dict[str, Any] | str]] = [
        ("message_start", start),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "B"},
            },
        ),
    ]
    if not truncated:
        events += [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": 4},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
    return _sse(events)


def _capture(store: CaptureStore, rollout_id: str, dialect: str, raw: bytes) -> None:
    started_at = time.time()
    t0 = time.perf_counter()
    decoder = SSEDecoder()
    reassembler = get_dialect(dialect).new_reassembler()
    ttft: float | None = None
    for i in range(0, len(raw), 37):  # odd-sized chunks, as a socket would hand them over
        if ttft is None:
            ttft = (time.perf_counter() - t0) * 1000
        for event in decoder.feed(raw[i : i + 37]):
            reassembler.feed(event)
    for event in decoder.flush(dispatch_unterminated=True):
        reassembler.feed(event)
    result = reassembler.finish()
    category = error_category(
        200,
        stream_error=result.outcome is StreamOutcome.ERROR,
        incomplete=result.outcome is StreamOutcome.INCOMPLETE,
        truncated=result.truncated,
    )
    store.append(
        rollout_id,
        RawRecord(
            model_call_id=new_model_call_id(),
            dialect=dialect,
            model_ref=model_ref("policy_model"),
            started_at=started_at,
            completed_at=time.time(),
            latency_ms=(time.perf_counter() - t0) * 1000,
            latency_ttft_ms=ttft,
            status_code=200,
            error_category=category,
            request={"model": "demo-model", "stream": True},
            response=result.response,
            response_raw=raw.decode("utf-8", errors="replace"),
        ),
    )


def main() -> int:
    directory = Path("results/demo-model-calls").resolve()
    store = CaptureStore(directory)
    for rollout_id in ("0-0", "1-0"):
        store.clear(rollout_id)
    _capture(store, "0-0", "responses", _responses_stream())
    _capture(store, "0-0", "chat", _chat_stream())
    _capture(store, "0-0", "messages", _messages_stream(truncated=False))
    _capture(store, "1-0", "messages", _messages_stream(truncated=True))

    print("rollcap demo: 4 replayed model-call streams captured into 2 rollouts\n")
    for rollout_id in store.rollout_ids():
        attachment = capture_attachment(store, rollout_id, payloads=False)
        print(f"rollout {rollout_id}: metrics {orjson.dumps(attachment['metrics']).decode()}")
        for call in attachment["calls"]:
            print(
                f"  call {call['call_index']}: {call['dialect']:<9} model={call['model']}"
                f" tokens_in={call['tokens_in']} tokens_out={call['tokens_out']}"
                f" finish={call['finish_reason']} error={call['error_category']}"
                f" tool_calls={orjson.dumps(call['tool_calls']).decode()}"
            )
        for gap in attachment.get("gaps", []):
            print(f"  gap: {gap['code']}")
    print(f"\ncapture files: {directory}/")
    for rollout_id in store.rollout_ids():
        print(f"  {store.path_for(rollout_id)}")
    print(f"inspect one:   .venv/bin/rollcap capture show {directory} 0-0 --no-payloads")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reassembly and normalization never raise, whatever arrives, and chunking never matters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollcap.dialects import DIALECT_NAMES, StreamOutcome, get_dialect, reassemble
from rollcap.sse import SSEEvent, encode_event

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GOLDEN = sorted((d, p.read_bytes()) for d in DIALECT_NAMES for p in (FIXTURES / d).glob("*.sse"))

# Names the three dialects really use, so the fuzzer reaches deep into each reassembler.
EVENT_NAMES = [
    "response.created", "response.in_progress", "response.output_item.added",
    "response.output_item.done", "response.content_part.added", "response.content_part.done",
    "response.output_text.delta", "response.output_text.done",
    "response.function_call_arguments.delta", "response.function_call_arguments.done",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta", "response.refusal.delta", "response.completed",
    "response.incomplete", "response.failed", "error", "message_start", "content_block_start",
    "content_block_delta", "content_block_stop", "message_delta", "message_stop", "ping",
]  # fmt: skip
KEYS = [
    "type", "response", "item", "output_index", "content_index", "item_index", "index", "delta",
    "text", "part", "id", "call_id", "name", "arguments", "output", "status", "usage", "error",
    "choices", "message", "content", "content_block", "tool_calls", "function", "role",
    "finish_reason", "stop_reason", "partial_json", "thinking", "input", "input_tokens",
    "output_tokens", "prompt_tokens", "completion_tokens", "reasoning_content", "refusal",
    "summary", "summary_index", "logprobs", "model", "object",
]  # fmt: skip

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-5, max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.sampled_from(EVENT_NAMES + KEYS + ["", "{", '{"a":'])
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS), children, max_size=6)
    ),
    max_leaves=25,
)
events = st.builds(
    SSEEvent,
    data=st.one_of(
        st.just("[DONE]"),
        st.text(max_size=20),
        st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6).map(
            lambda d: orjson.dumps(d).decode()
        ),
    ),
    event=st.none() | st.sampled_from(EVENT_NAMES),
    id=st.none(),  # written back out as SSE, where only single-line ids exist
    retry=st.none(),
)


def _check(dialect: str, response: Any) -> None:
    if response is not None:
        assert isinstance(response, dict)
        orjson.dumps(response)  # it goes into a record: it must stay JSON
        get_dialect(dialect).normalize(response)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(DIALECT_NAMES), st.lists(events, max_size=25))
def test_structured_garbage_never_raises(dialect: str, stream: list[SSEEvent]) -> None:
    reassembler = get_dialect(dialect).new_reassembler()
    for event in stream:
        reassembler.feed(event)
        get_dialect(dialect).is_terminal_event(event)
    result = reassembler.finish()
    assert isinstance(result.outcome, StreamOutcome)
    _check(dialect, result.response)


@settings(max_examples=200)
@given(st.sampled_from(DIALECT_NAMES), st.binary(max_size=600))
def test_random_bytes_never_raise(dialect: str, raw: bytes) -> None:
    _check(dialect, reassemble(dialect, [raw]).response)


@settings(max_examples=300)
@given(st.sampled_from(DIALECT_NAMES), json_values)
def test_normalize_any_json_never_raises(dialect: str, value: Any) -> None:
    if isinstance(value, dict):
        get_dialect(dialect).normalize(value)


@settings(max_examples=200)
@given(st.sampled_from(GOLDEN), st.lists(st.integers(min_value=0), max_size=12))
def test_golden_streams_any_chunking(case: tuple[str, bytes], cuts: list[int]) -> None:
    dialect, raw = case
    points = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert reassemble(dialect, chunks) == reassemble(dialect, [raw])


@settings(max_examples=100)
@given(st.sampled_from(GOLDEN), st.data())
def test_golden_streams_with_garbage_injected_never_raise(
    case: tuple[str, bytes], data: st.DataObject
) -> None:
    dialect, raw = case
    at = data.draw(st.integers(min_value=0, max_value=len(raw)))
    junk = encode_event(data.draw(events))
    _check(dialect, reassemble(dialect, [raw[:at], junk, raw[at:]]).response)

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rollcap.dialects import DIALECT_NAMES, reassemble
from rollcap.metrics import METRIC_KEYS, aggregate, aggregate_raw
from rollcap.records import ModelCallRecord


def _messages_record(index: int, **usage: Any) -> ModelCallRecord:
    raw = {
        "model_call_id": f"id{index}",
        "dialect": "messages",
        "model_ref": {"type": "responses_api_models", "name": "policy_model"},
        "latency_ms": 0.1,
        "status_code": 200,
        "response": {"id": f"msg_{index}", "type": "message", "usage": usage},
    }
    return ModelCallRecord.from_raw(raw, index)


def test_aggregate_sums_known_values_and_keeps_unknown_as_none() -> None:
    records = [
        _messages_record(0, input_tokens=10, output_tokens=5, cache_read_input_tokens=3),
        _messages_record(1, input_tokens=1, output_tokens=2),
        _messages_record(2),
    ]
    metrics = aggregate(records)
    assert list(metrics) == list(METRIC_KEYS)
    assert metrics == {
        "tokens_in": 14,
        "tokens_out": 7,
        "tokens_reasoning": None,  # Anthropic reports none: unknown, not zero
        "tokens_total": 21,
        "cached_tokens": 3,
        "latency_total_ms": 0.3,  # 0.1 + 0.1 + 0.1 rounded, not 0.30000000000000004
        "num_calls": 3,
    }


def test_aggregate_of_nothing() -> None:
    assert aggregate([]) == {**dict.fromkeys(METRIC_KEYS), "num_calls": 0}


FIXTURES = Path(__file__).resolve().parent / "fixtures"

counts = st.none() | st.booleans() | st.integers(min_value=-3, max_value=10**6) | st.floats(0, 9)
usages = st.dictionaries(
    st.sampled_from(
        [
            "input_tokens", "output_tokens", "total_tokens", "prompt_tokens", "completion_tokens",
            "cache_read_input_tokens", "cache_creation_input_tokens", "cached_input_tokens",
            "reasoning_output_tokens",
        ]
    ),
    counts,
)  # fmt: skip
# A response of any dialect's shape, or none: a record without a known dialect is read by it.
shapes = st.sampled_from(
    [{}, {"output": []}, {"choices": []}, {"content": []}, {"object": "response"},
     {"object": "chat.completion"}, {"type": "message"}]
)  # fmt: skip
raws: st.SearchStrategy[dict[str, Any]] = st.builds(
    dict,
    dialect=st.sampled_from([*DIALECT_NAMES, "other", None]),
    latency_ms=st.none() | st.floats(0, 1e6),
    response=st.builds(lambda shape, usage: {**shape, "usage": usage}, shapes, usages) | st.none(),
)


@given(st.lists(raws, max_size=8))
def test_aggregate_raw_equals_aggregate_of_normalized_records(
    records: list[dict[str, Any]],
) -> None:
    normalized = [ModelCallRecord.from_raw(raw, i) for i, raw in enumerate(records)]
    assert aggregate_raw(records) == aggregate(normalized)


def test_aggregate_raw_on_every_golden_stream() -> None:
    records = []
    for dialect in DIALECT_NAMES:
        for sse in sorted((FIXTURES / dialect).glob("*.sse")):
            response = reassemble(dialect, [sse.read_bytes()]).response
            records.append({"dialect": dialect, "latency_ms": 1.5, "response": response})
    normalized = [ModelCallRecord.from_raw(raw, i) for i, raw in enumerate(records)]
    assert aggregate_raw(records) == aggregate(normalized)
    assert aggregate_raw(records)["tokens_in"] is not None


def test_a_record_without_a_dialect_is_aggregated_as_its_shape_reads() -> None:
    raws: list[dict[str, Any]] = [
        {
            "latency_ms": 1.0,
            "response": {"object": "chat.completion", "usage": {"prompt_tokens": 3}},
        },
        {"response": {"output": [], "usage": {"input_tokens": 4, "cached_input_tokens": 2}}},
        {"dialect": "gemini", "response": {"type": "message", "usage": {"input_tokens": 5}}},
    ]
    metrics = aggregate_raw(raws)
    assert (metrics["tokens_in"], metrics["cached_tokens"], metrics["num_calls"]) == (12, 2, 3)
    assert metrics == aggregate([ModelCallRecord.from_raw(raw, i) for i, raw in enumerate(raws)])

from __future__ import annotations

from typing import Any

from rollcap.metrics import METRIC_KEYS, Gap, aggregate, build_attachment
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


def test_attachment_shape_and_gap_omission() -> None:
    records = [_messages_record(0, input_tokens=1, output_tokens=1)]
    attachment = build_attachment("0-0", records)
    assert list(attachment) == ["rollout_id", "metrics", "calls"]
    assert attachment["calls"][0]["call_index"] == 0
    assert "request" in attachment["calls"][0]
    with_gap = build_attachment(
        "0-0",
        records,
        [Gap("model_call_capture_incomplete"), Gap("x", "count=2")],
        payloads=False,
    )
    assert with_gap["gaps"] == [
        {"code": "model_call_capture_incomplete"},
        {"code": "x", "detail": "count=2"},
    ]
    assert "request" not in with_gap["calls"][0]

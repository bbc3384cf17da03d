from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from rollcap.evidence import (
    CaptureRead,
    capture_object,
    merge_model_call_capture,
    payloads_redacted,
)
from tests.evidence.conftest import (
    bundle,
    by_id,
    calls_of,
    canonical,
    gap,
    invocation,
    responses_raw,
)


def test_redaction_is_found_by_code_in_either_evidence_object() -> None:
    redacted = {"code": "multimodal_history_redacted", "invocation_id": "x", "detail": "y"}
    assert payloads_redacted({"ng_trajectory": {"gaps": [redacted]}})
    assert payloads_redacted({"ng_agent_observations": {"gaps": ["junk", redacted]}})
    assert not payloads_redacted({"ng_trajectory": {"gaps": [{"code": "other"}]}})
    assert not payloads_redacted(
        {"ng_trajectory": {"gaps": {"code": "multimodal_history_redacted"}}}
    )
    assert not payloads_redacted({"gaps": [redacted]})


def test_capture_object_key_order_and_unrounded_metrics() -> None:
    calls = calls_of(
        responses_raw(0, latency_ms=0.1),
        responses_raw(1, latency_ms=0.1),
        responses_raw(2, latency_ms=0.1),
    )
    out = capture_object("0-0", calls, [], include_payloads=False)
    assert list(out) == ["rollout_id", "metrics", "calls"]
    assert list(out["metrics"]) == [
        "tokens_in",
        "tokens_out",
        "tokens_reasoning",
        "tokens_total",
        "cached_tokens",
        "latency_total_ms",
        "num_calls",
    ]
    # The float sum as the additions give it, as NeMo Gym writes it.
    assert orjson.dumps(out["metrics"]["latency_total_ms"]) == b"0.30000000000000004"
    assert "request" not in out["calls"][0]
    negative = capture_object(
        "0-0", calls_of(responses_raw(0, latency_ms=-5.0)), [], include_payloads=True
    )
    assert negative["metrics"]["latency_total_ms"] == -5.0
    assert "request" in negative["calls"][0]


def test_merge_joins_the_bundle_in_place_of_the_agents() -> None:
    record: dict[str, Any] = {
        "response": {},
        "ng_agent_observations": bundle(invocation("root", by_id(0))),
        "reward": 1,
    }
    read = CaptureRead(store_found=True, calls=tuple(calls_of(responses_raw(0))))
    merge_model_call_capture(record, "0-0", read, include_payloads=True)
    assert list(record) == ["response", "ng_agent_observations", "reward", "ng_model_call_capture"]
    assert record["ng_agent_observations"]["records"][0]["model_calls"] == [canonical(0)]
    assert "gaps" not in record["ng_model_call_capture"]


@pytest.mark.parametrize(
    "observations",
    [
        {"source": "x", "records": [{"kind": "turn"}]},
        {"source": "x", "records": [], "gaps": [{"code": "g", "extra": 1}]},
        "not an object",
        [],
    ],
)
def test_a_bundle_that_cannot_be_joined_stays_as_sent(observations: Any) -> None:
    sent = copy.deepcopy(observations)
    record: dict[str, Any] = {"ng_agent_observations": observations}
    read = CaptureRead(store_found=True, calls=tuple(calls_of(responses_raw(0))))
    merge_model_call_capture(record, "0-0", read, include_payloads=True)
    assert record["ng_agent_observations"] == sent
    assert record["ng_model_call_capture"]["gaps"] == [{"code": "agent_observation_join_failed"}]


def test_a_null_bundle_is_not_joined() -> None:
    record: dict[str, Any] = {"ng_agent_observations": None}
    merge_model_call_capture(record, "0-0", CaptureRead(store_found=False), include_payloads=True)
    assert record["ng_agent_observations"] is None
    assert record["ng_model_call_capture"]["gaps"] == [{"code": "model_call_capture_no_records"}]


def test_capture_read_gaps_follow_the_precedence() -> None:
    assert (
        CaptureRead(store_found=True, incomplete=True).gaps()[0].code
        == "model_call_capture_incomplete"
    )
    assert [g.to_dict() for g in CaptureRead(store_found=True, bad_lines=2).gaps()] == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=2"}
    ]
    assert gap("x") == {"code": "x", "invocation_id": None, "detail": None}


def test_a_failing_compaction_association_is_a_gap_of_the_bundle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rollcap.evidence._capture as capture_module

    def fail(*_: object) -> None:
        raise RuntimeError("association broke")

    monkeypatch.setattr(capture_module, "associate_compaction_calls", fail)
    record: dict[str, Any] = {"ng_agent_observations": {**bundle(), "source": "claude_code"}}
    read = CaptureRead(store_found=True, calls=tuple(calls_of(responses_raw(0))))
    merge_model_call_capture(record, "0-0", read, include_payloads=False)
    assert record["ng_agent_observations"]["gaps"] == [
        gap("compaction_model_call_join_failed"),
        gap("model_call_ownership_unavailable", f"capture:{'0' * 32}:call_index=0"),
    ]
    assert "gaps" not in record["ng_model_call_capture"]

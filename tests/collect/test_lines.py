"""The lines collection writes: rollout and failure lines, the trajectory projection."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rollcap.attachment import build_attachment
from rollcap.collect import (
    CAPTURE_KEY,
    TRAJECTORY_KEY,
    AgentAnswerError,
    ProjectionError,
    Rollout,
    check_agent_answer,
    failure_line,
    project_trajectory,
    rollout_line,
    with_trajectory,
)
from rollcap.records import GAP_TRAJECTORY_PROJECTION_FAILED, ModelCallRecord
from tests.collect.conftest import fake_record

ROLLOUT = Rollout(3, 1, 1, {"question": "q?", "reward": "task's", "_ng_task_index": 99})


def test_rollout_line_key_order_and_reserved_keys() -> None:
    answer = {"reward": 0.5, "rollout_id": "spoof", "response": {"text": "A"}, "extra": 1}
    line = rollout_line(ROLLOUT, answer, {CAPTURE_KEY: {"x": 1}, TRAJECTORY_KEY: {"y": 2}})
    assert list(line) == [
        "question",
        "_ng_task_index",
        "_ng_rollout_index",
        "_ng_attempt_index",
        "rollout_id",
        "response",
        "reward",
        "extra",
        CAPTURE_KEY,
        TRAJECTORY_KEY,
    ]
    assert line["rollout_id"] == "3-1-a1"
    assert line["_ng_task_index"] == 3
    assert line["reward"] == 0.5
    assert line["response"] == {"text": "A"}


def test_failure_line() -> None:
    line = failure_line(ROLLOUT, "agent_error", "HTTP 500", status=500)
    assert line == {
        "_ng_task_index": 3,
        "_ng_rollout_index": 1,
        "_ng_attempt_index": 1,
        "rollout_id": "3-1-a1",
        "error": {"kind": "agent_error", "message": "HTTP 500", "status": 500},
    }


@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"reward": 1.0},
        {"response": 1},
        {"response": 1, "reward": True},
        {"response": 1, "reward": "1"},
    ],
)
def test_check_agent_answer_refuses(answer: Any) -> None:
    with pytest.raises(AgentAnswerError):
        check_agent_answer(answer)


def _attachment(*records: dict[str, Any]) -> dict[str, Any]:
    calls = [ModelCallRecord.from_raw(raw, i) for i, raw in enumerate(records)]
    return build_attachment("3-1-a1", calls)


def test_with_trajectory_moves_payloads_into_the_trajectory() -> None:
    raws = [fake_record("3-1-a1", 0), fake_record("3-1-a1", 1)]
    attachment = _attachment(*raws)
    metrics = dict(attachment["metrics"])
    before = copy.deepcopy(attachment)
    out = with_trajectory(ROLLOUT, attachment)
    assert attachment == before  # the payloads moved in the line, not in the argument
    capture, trajectory = out[CAPTURE_KEY], out[TRAJECTORY_KEY]
    assert capture["metrics"] == metrics
    assert "gaps" not in capture
    for call in capture["calls"]:
        assert not {"request", "response", "request_raw", "response_raw"} & set(call)
    assert trajectory["schema_version"] == 1
    assert (trajectory["task_index"], trajectory["rollout_id"]) == (3, "3-1-a1")
    assert [c["call_index"] for c in trajectory["calls"]] == [0, 1]
    step = trajectory["calls"][1]
    assert step["request"] == raws[1]["request"]
    assert step["response"] == raws[1]["response"]
    assert step["response_metadata"] == {
        "id": "resp_3-1-a1_1",
        "model": "fake-model-2025",
        "status": "completed",
        "status_code": 200,
        "finish_reason": None,
    }
    assert step["tokens"] == {
        "tokens_in": 11,
        "tokens_out": 5,
        "tokens_reasoning": None,
        "tokens_total": 16,
        "cached_tokens": None,
    }


def test_with_trajectory_keeps_payloads_when_projection_fails() -> None:
    attachment = _attachment(fake_record("3-1-a1", 0, request=False))
    out = with_trajectory(ROLLOUT, attachment)
    assert TRAJECTORY_KEY not in out
    capture = out[CAPTURE_KEY]
    assert capture["gaps"][-1]["code"] == GAP_TRAJECTORY_PROJECTION_FAILED
    assert capture["calls"][0]["response"]["id"] == "resp_3-1-a1_0"
    assert "request" in capture["calls"][0]


def test_projection_orders_calls_and_refuses_duplicates() -> None:
    a = ModelCallRecord.from_raw(fake_record("x", 0), 0).to_dict()
    b = ModelCallRecord.from_raw(fake_record("x", 1), 1).to_dict()
    assert [c["call_index"] for c in project_trajectory(ROLLOUT, [b, a])["calls"]] == [0, 1]
    with pytest.raises(ProjectionError, match="two calls"):
        project_trajectory(ROLLOUT, [a, a])
    raw_only = dict(a, request=None, request_raw="not json")
    assert project_trajectory(ROLLOUT, [raw_only])["calls"][0]["request_raw"] == "not json"

"""The lines collection writes: rollout lines with their evidence, failure lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap.collect import (
    AgentAnswerError,
    Rollout,
    check_agent_answer,
    failure_line,
    has_evidence,
    rollout_line,
)
from rollcap.evidence import attach
from rollcap.store import CaptureStore
from tests.collect.conftest import fake_record

ROLLOUT = Rollout(3, 1, 1, {"question": "q?", "reward": "task's", "_ng_task_index": 99})
CAPTURE, TRAJECTORY, PERF = "ng_model_call_capture", "ng_trajectory", "ng_perf"


def test_rollout_line_key_order_and_reserved_keys() -> None:
    answer = {"reward": 0.5, "rollout_id": "spoof", "response": {"text": "A"}, "extra": 1}
    line = rollout_line(ROLLOUT, answer)
    assert list(line) == [
        "question",
        "_ng_task_index",
        "_ng_rollout_index",
        "_ng_attempt_index",
        "rollout_id",
        "response",
        "reward",
        "extra",
    ]
    assert line["rollout_id"] == "3-1-a1"
    assert line["_ng_task_index"] == 3
    assert line["reward"] == 0.5
    assert line["response"] == {"text": "A"}


def test_a_task_cannot_bring_evidence_an_agent_can() -> None:
    rollout = Rollout(0, 0, 0, {"q": 1, TRAJECTORY: {"from": "the task"}, PERF: {"x": 1}})
    plain = rollout_line(rollout, {"response": {}, "reward": 1.0})
    assert TRAJECTORY not in plain
    assert PERF not in plain
    bundle = {"source": "harness", "records": [], "gaps": []}
    line = rollout_line(rollout, {"response": {}, "reward": 1.0, "ng_agent_observations": bundle})
    # Evidence of the agent's own: the trajectory is built from it, capture on or off.
    assert list(line)[-2:] == ["ng_agent_observations", TRAJECTORY]
    assert line["ng_agent_observations"] == bundle  # not joined: capture was off
    assert [g["code"] for g in line[TRAJECTORY]["gaps"]] == [
        "model_calls_unavailable",
        "turns_unavailable",
        "conversation_unavailable",
    ]


def _capture(tmp_path: Path, rollout_id: str, *records: dict[str, Any]) -> Path:
    directory = tmp_path / "calls"
    with CaptureStore(directory) as store:
        store.reset(rollout_id)
        for record in records:
            store.append(rollout_id, record)
    return directory


def test_the_line_is_attach_of_the_run_body_and_the_answer(tmp_path: Path) -> None:
    rollout = Rollout(2, 0, 0, {"question": "q"})
    directory = _capture(tmp_path, "2-0", fake_record("2-0", 0), fake_record("2-0", 1))
    # The agent names its one invocation; the calls name it back (x-session-id).
    bundle = {"source": "harness", "records": [{"kind": "agent_invocation", "invocation_id": "s"}]}
    answer = {"response": {"output_text": "A"}, "reward": 1.0, "ng_agent_observations": bundle}
    line = rollout_line(
        rollout,
        answer,
        capture_dirs=[directory],
        observability_enabled=True,
        rollout_latency_ms=12.5,
    )
    assert list(line)[-4:] == ["ng_agent_observations", CAPTURE, TRAJECTORY, PERF]
    assert line["response"] == answer["response"]  # additive: response and reward unchanged
    assert line["reward"] == 1.0
    expected = attach(
        rollout.run_body(),
        {
            "question": "q",
            "_ng_task_index": 2,
            "_ng_rollout_index": 0,
            "_ng_attempt_index": 0,
            "rollout_id": "2-0",
            **answer,
        },
        capture_dirs=[directory],
        observability_enabled=True,
        rollout_latency_ms=12.5,
    )
    assert orjson.dumps(line) == orjson.dumps(expected)
    # The payloads moved into the trajectory; the attachment keeps the rest of each call.
    assert [c["request"] for c in line[TRAJECTORY]["model_calls"]] == [
        fake_record("2-0", i)["request"] for i in range(2)
    ]
    assert all("request" not in call for call in line[CAPTURE]["calls"])
    (invocation,) = line["ng_agent_observations"]["records"]
    assert [ref["model_call_id"] for ref in invocation["model_calls"]] == [
        fake_record("2-0", i)["model_call_id"] for i in range(2)
    ]
    assert line[PERF] == {
        "num_turns": 2,
        "num_tool_calls": 0,
        "token_observability_coverage": 1.0,
        "prompt_tokens": 21,
        "completion_tokens": 10,
        "total_latency_ms": 12.5,
    }


def test_without_agent_evidence_there_is_no_perf(tmp_path: Path) -> None:
    directory = _capture(tmp_path, "0-0", fake_record("0-0", 0))
    line = rollout_line(
        Rollout(0, 0, 0, {}),
        {"response": {}, "reward": 0.0},
        capture_dirs=[directory],
        observability_enabled=True,
        rollout_latency_ms=3.0,
    )
    # The calls alone make a trajectory without invocations, which ng_perf cannot read.
    assert list(line)[-2:] == [CAPTURE, TRAJECTORY]
    assert line[TRAJECTORY]["invocations"] == []


def test_capture_off_reads_nothing(tmp_path: Path) -> None:
    directory = _capture(tmp_path, "0-0", fake_record("0-0", 0))
    line = rollout_line(
        Rollout(0, 0, 0, {}), {"response": {}, "reward": 0.0}, capture_dirs=[directory]
    )
    assert CAPTURE not in line
    assert TRAJECTORY not in line


def test_has_evidence() -> None:
    assert not has_evidence({"response": {}, "reward": 1})
    for key in (CAPTURE, TRAJECTORY, PERF, "ng_agent_observations"):
        assert has_evidence({key: None})


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

from __future__ import annotations

import copy
from typing import Any

import pytest

from rollcap.evidence import attach_trajectory_record, build_trajectory, trajectory_identity
from rollcap.evidence._trajectory import turn_content
from tests.evidence.conftest import (
    bundle,
    by_id,
    call_id,
    calls_of,
    canonical,
    gap,
    invocation,
    responses_raw,
)

ROW = {"_ng_task_index": 3, "_ng_rollout_index": 1}


def capture(*raws: dict[str, Any], gaps: list[Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rollout_id": "3-1",
        "metrics": {},
        "calls": [call.to_dict() for call in calls_of(*raws)],
    }
    if gaps is not None:
        out["gaps"] = gaps
    return out


def codes(trajectory: dict[str, Any]) -> list[str]:
    return [g["code"] for g in trajectory["gaps"]]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({**ROW, "task_id": 7, "problem_id": "p"}, ("7", "3-1")),
        ({**ROW, "task_id": None, "problem_id": "p"}, ("p", "3-1")),
        ({**ROW, "instance_id": "django-1"}, ("django-1", "3-1")),
        ({**ROW, "_ng_attempt_index": 2}, ("3", "3-1-a2")),
        ({**ROW, "_ng_rollout_id": "run.x", "_ng_attempt_index": 1}, ("3", "run.x-a1")),
    ],
)
def test_identity(row: dict[str, Any], expected: tuple[str, str]) -> None:
    assert trajectory_identity(row) == expected


def test_no_evidence_gives_the_three_unavailable_gaps() -> None:
    trajectory = build_trajectory(ROW, {"ng_agent_observations": None})
    assert trajectory["schema_version"] == "1.0"
    assert (trajectory["task_id"], trajectory["rollout_id"]) == ("3", "3-1")
    assert trajectory["gaps"] == [
        gap("model_calls_unavailable"),
        gap("turns_unavailable"),
        gap("conversation_unavailable"),
    ]


def test_turns_from_responses_calls_in_capture_order() -> None:
    tool_call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    reasoning = {"type": "reasoning", "id": "rs", "summary": []}
    raws = (
        responses_raw(0, output=[reasoning, tool_call, dict(tool_call, call_id="d")]),
        responses_raw(1),
        responses_raw(2),  # nobody's: no turn
    )
    result = {
        "resolved": True,
        "ng_agent_observations": bundle(
            invocation(
                "root", canonical(0), canonical(1), conversation=[{"role": "user", "content": "q"}]
            )
        ),
        "ng_model_call_capture": capture(*raws),
    }
    trajectory = build_trajectory(ROW, result)
    turns = trajectory["turns"]
    assert [(t["invocation_id"], t["turn_no"], t["step_count"]) for t in turns] == [
        ("root", 1, 0),
        ("root", 2, 2),
    ]
    assert turns[0]["timestamp"] == 1000.0
    assert turns[0]["question"] == [{"type": "message", "role": "user", "content": "q0"}]
    assert list(turns[0]["question"][0]) == ["type", "role", "content"]
    assert turns[0]["reasoning_content"] == [reasoning]
    assert turns[0]["answer"] == [tool_call, dict(tool_call, call_id="d")]
    assert turns[0]["model_calls"] == [canonical(0)]
    assert [t["resolved"] for t in turns] == [None, True]
    assert trajectory["gaps"] == []
    assert [c["model_call_id"] for c in trajectory["model_calls"]] == [call_id(n) for n in range(3)]


def test_turn_content_of_chat_messages_and_raw_text() -> None:
    chat = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "x",
                    "reasoning": "why",
                    "tool_calls": [{"id": "t1"}, {"id": "t2"}],
                }
            }
        ]
    }
    question, answer, reasoning, tools = turn_content({"messages": [{"role": "user"}]}, chat)
    assert question == [{"role": "user"}]
    assert answer == {
        "role": "assistant",
        "content": "x",
        "tool_calls": [{"id": "t1"}, {"id": "t2"}],
    }
    assert (reasoning, tools) == ("why", 2)
    messages = {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
    assert turn_content({"messages": []}, messages) == ([], None, None, 0)
    assert turn_content("raw request text", "raw body") == ("raw request text", None, None, 0)
    responses = {"output": [{"type": "message"}, "junk"]}
    assert turn_content({"input": "hi"}, responses) == ("hi", [{"type": "message"}], None, 0)


def test_the_projection_folds_raw_text_and_keeps_exact_counts_only() -> None:
    raw = responses_raw(0, usage={"input_tokens": 3, "output_tokens": 2.0, "total_tokens": True})
    call = calls_of(raw)[0].to_dict()
    call.update(
        response=None,
        response_raw="event: error\n\n",
        response_status=None,
        tokens_out=2.0,
        tokens_total=True,
        upstream_attempted=True,
        response_source="upstream",
        upstream_status_code=502,
    )
    trajectory = build_trajectory(ROW, {"ng_model_call_capture": {"calls": [call, "junk"]}})
    projected = trajectory["model_calls"][0]
    assert projected["response"] == "event: error\n\n"
    assert projected["duration_ms"] == 500.25
    assert projected["token_stats"] == {
        "prompt_tokens": 3,
        "completion_tokens": None,
        "reasoning_tokens": None,
        "total_tokens": None,
        "cached_tokens": None,
    }
    meta = projected["response_metadata"]
    assert (meta["upstream_attempted"], meta["response_source"]) == (True, "upstream")
    assert meta["upstream_status_code"] == 502
    assert meta["response_status"] is None  # the raw body is no object with a status
    call = calls_of(responses_raw(1))[0].to_dict()
    call["response_status"] = None
    trajectory = build_trajectory(ROW, {"ng_model_call_capture": {"calls": [call]}})
    assert trajectory["model_calls"][0]["response_metadata"]["response_status"] == "completed"


def producer(**fields: Any) -> dict[str, Any]:
    return {"task_id": "3", "rollout_id": "3-1", **fields}


def turn(invocation_id: str, turn_no: int, timestamp: float, **fields: Any) -> dict[str, Any]:
    return {
        "invocation_id": invocation_id,
        "task_id": fields.pop("task_id", "3"),
        "rollout_id": fields.pop("rollout_id", "3-1"),
        "turn_no": turn_no,
        "timestamp": timestamp,
        **fields,
    }


def test_a_producer_trajectory_owns_the_turns_and_absorbs_its_captured_call() -> None:
    own = producer(
        invocations=[invocation("root", by_id(0), conversation=[{"role": "user", "content": "q"}])],
        turns=[turn("root", 2, 5.0), turn("root", 1, 5.0), turn("sub", 1, 1.0)],
        model_calls=[
            {"model_call_id": call_id(0), "request": "mine", "token_stats": {"cached_tokens": 4}}
        ],
        tool_calls=[
            {"invocation_id": "root", "tool_call_id": "c", "status": "completed", "output": "old"}
        ],
        gaps=[gap("resolution_unavailable")],
    )
    result = {
        "ng_trajectory": own,
        "ng_model_call_capture": capture(responses_raw(0), responses_raw(1)),
    }
    trajectory = build_trajectory(ROW, result)
    assert [(t["invocation_id"], t["turn_no"]) for t in trajectory["turns"]] == [
        ("sub", 1),
        ("root", 1),
        ("root", 2),
    ]
    first, second = trajectory["model_calls"]
    assert first["request"] == responses_raw(0)["request"]  # the capture's non-null wins
    assert first["token_stats"]["cached_tokens"] == 4  # the producer's where capture has null
    assert first["token_stats"]["prompt_tokens"] == 10
    assert second["model_call_id"] == call_id(1)
    assert trajectory["tool_calls"][0]["output"] == "old"  # no observations: untouched
    assert trajectory["invocations"][0]["model_calls"] == [
        {"model_call_id": call_id(0), "model_ref": None, "response_id": None}
    ]  # a producer's refs are not joined
    assert codes(trajectory) == ["resolution_unavailable"]


def test_a_producer_with_another_identity_is_restamped() -> None:
    own = producer(
        task_id="x", rollout_id="y", turns=[turn("root", 1, 0.0, task_id="x", rollout_id="y")]
    )
    trajectory = build_trajectory(ROW, {"ng_trajectory": own})
    assert trajectory["gaps"][0] == gap(
        "producer_trajectory_identity_mismatch", "task_id,rollout_id"
    )
    assert (trajectory["turns"][0]["task_id"], trajectory["turns"][0]["rollout_id"]) == ("3", "3-1")
    only_rollout = build_trajectory(ROW, {"ng_trajectory": producer(rollout_id="y")})
    assert only_rollout["gaps"][0] == gap("producer_trajectory_identity_mismatch", "rollout_id")


def test_an_invalid_producer_still_owns_the_turns() -> None:
    result = {
        "ng_trajectory": {"task_id": "3", "rollout_id": "3-1", "calls": []},
        "ng_agent_observations": bundle(invocation("root", canonical(0))),
        "ng_model_call_capture": capture(responses_raw(0)),
    }
    trajectory = build_trajectory(ROW, result)
    assert trajectory["turns"] == []
    assert codes(trajectory) == [
        "producer_trajectory_invalid",
        "turns_unavailable",
        "conversation_unavailable",
    ]
    assert trajectory["gaps"][0]["detail"] == "ValidationError"


def test_a_producer_sending_no_turns_is_believed() -> None:
    trajectory = build_trajectory(ROW, {"ng_trajectory": producer(turns=[])})
    assert "turns_unavailable" not in codes(trajectory)


def test_observed_tool_calls_overlay_the_producers_and_take_the_conversation_output() -> None:
    conversation = [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "first"},
        {"type": "function_call_output", "call_id": "c", "output": "last"},
    ]
    own = producer(
        invocations=[invocation("root", conversation=conversation)],
        tool_calls=[
            {
                "invocation_id": "root",
                "tool_call_id": "c",
                "status": "failed",
                "tool_name": "f",
                "output": "p",
            },
            {"invocation_id": "root", "tool_call_id": "gone", "output": "kept"},
        ],
    )
    observed = bundle(
        invocation("root", conversation=[{"role": "user", "content": "ignored: producer wins"}]),
        invocation(
            "sub", conversation=[{"type": "function_call_output", "call_id": "s", "output": "o"}]
        ),
        {
            "kind": "tool_call",
            "invocation_id": "root",
            "tool_call_id": "c",
            "duration_ms": 2,
            "status": "unknown",
        },
        {"kind": "tool_call", "invocation_id": "sub", "tool_call_id": "s", "status": "completed"},
        {"kind": "tool_call", "invocation_id": "sub", "tool_call_id": "silent"},
    )
    trajectory = build_trajectory(ROW, {"ng_trajectory": own, "ng_agent_observations": observed})
    tools = {(t["invocation_id"], t["tool_call_id"]): t for t in trajectory["tool_calls"]}
    assert list(tools) == [("root", "c"), ("root", "gone"), ("sub", "s"), ("sub", "silent")]
    merged = tools[("root", "c")]
    assert (merged["status"], merged["tool_name"], merged["duration_ms"]) == ("failed", "f", 2.0)
    assert merged["output"] == "last"
    assert tools[("root", "gone")]["output"] == "kept"
    assert tools[("sub", "s")]["output"] == "o"
    assert tools[("sub", "silent")]["output"] is None
    assert [inv["invocation_id"] for inv in trajectory["invocations"]] == ["root", "sub"]
    assert trajectory["invocations"][0]["conversation"][0]["type"] == "function_call"


def test_an_invalid_bundle_and_a_failing_tool_merge_are_agent_observations_invalid() -> None:
    trajectory = build_trajectory(ROW, {"ng_agent_observations": {"source": "x", "bogus": 1}})
    assert trajectory["gaps"][0] == gap("agent_observations_invalid", "ValidationError")
    # A producer tool whose timing the observation contradicts: the merge raises midway.
    own = producer(
        tool_calls=[{"invocation_id": "r", "tool_call_id": "t", "started_at": 10.0}],
    )
    observed = bundle(
        invocation("r"),
        {"kind": "tool_call", "invocation_id": "r", "tool_call_id": "ok", "status": "completed"},
        {"kind": "tool_call", "invocation_id": "r", "tool_call_id": "t", "completed_at": 5.0},
        gaps=[gap("from_bundle")],
    )
    trajectory = build_trajectory(ROW, {"ng_trajectory": own, "ng_agent_observations": observed})
    assert codes(trajectory)[:2] == ["from_bundle", "agent_observations_invalid"]
    assert [t["tool_call_id"] for t in trajectory["tool_calls"]] == ["t", "ok"]
    assert [i["invocation_id"] for i in trajectory["invocations"]] == ["r"]


def test_capture_gaps_are_copied_and_bad_ones_replaced() -> None:
    gaps = [
        {"code": "model_call_capture_incomplete"},
        {"code": "model_call_capture_records_unreadable", "detail": "count=2"},
        {"detail": "no code"},
        {"code": "x", "extra": 1},
        "not a dict",
    ]
    trajectory = build_trajectory(ROW, {"ng_model_call_capture": capture(gaps=gaps)})
    assert trajectory["gaps"][:3] == [
        gap("model_call_capture_incomplete"),
        gap("model_call_capture_records_unreadable", "count=2"),
        gap("model_call_capture_gap_invalid"),
    ]
    assert codes(trajectory).count("model_call_capture_gap_invalid") == 1  # deduplicated


@pytest.mark.parametrize(
    "change",
    [
        {"latency_total_ms": -1.0},
        {"latency_ttft_ms": -0.5},
    ],
)
def test_a_negative_latency_fails_the_projection(change: dict[str, Any]) -> None:
    call = calls_of(responses_raw(0))[0].to_dict()
    call.update(change)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        build_trajectory(ROW, {"ng_model_call_capture": {"calls": [call]}})


def test_projection_failure_keeps_payloads_and_records_the_class_name() -> None:
    cap = capture(responses_raw(0), responses_raw(0))  # one id twice
    result: dict[str, Any] = {
        "reward": 1,
        "ng_trajectory": producer(),
        "ng_model_call_capture": cap,
    }
    assert attach_trajectory_record(ROW, result) is False
    assert "ng_trajectory" not in result  # the agent's own is gone too
    calls = result["ng_model_call_capture"]["calls"]
    assert all("request" in call and "response" in call for call in calls)
    assert result["ng_model_call_capture"]["gaps"] == [
        {"code": "trajectory_projection_failed", "detail": "ValidationError"}
    ]


def test_failure_with_a_gaps_value_that_is_no_list_leaves_a_minimal_trajectory() -> None:
    sent = bundle(invocation("r"))
    calls = capture(responses_raw(0), responses_raw(0))["calls"]  # one id twice: fails
    result: dict[str, Any] = {
        "ng_agent_observations": sent,
        "ng_model_call_capture": {"calls": calls, "gaps": "not a list"},
    }
    assert attach_trajectory_record(ROW, result) is False
    assert result["ng_trajectory"] == {
        "schema_version": "1.0",
        "task_id": "3",
        "rollout_id": "3-1",
        "invocations": [],
        "turns": [],
        "model_calls": [],
        "tool_calls": [],
        "gaps": [gap("trajectory_projection_failed", "ValidationError")],
    }
    assert result["ng_agent_observations"] is sent  # the capture object was the target
    assert result["ng_model_call_capture"]["gaps"] == "not a list"


def test_failure_without_a_capture_object_appends_to_the_bundles_gaps() -> None:
    sent = bundle(invocation("r"), gaps=[gap("mine")])
    before = copy.deepcopy(sent)
    row = {"_ng_rollout_index": 1}  # no task index: the identity cannot be made
    result: dict[str, Any] = {"ng_agent_observations": sent}
    assert attach_trajectory_record(row, result) is False
    assert result["ng_agent_observations"]["gaps"] == [
        gap("mine"),
        {"code": "trajectory_projection_failed", "detail": "KeyError"},
    ]
    assert sent == before  # the agent's object is not changed


def test_success_moves_the_payloads_into_the_trajectory() -> None:
    cap = capture(responses_raw(0))
    result: dict[str, Any] = {"ng_model_call_capture": cap}
    assert attach_trajectory_record(ROW, result) is True
    assert "request" not in result["ng_model_call_capture"]["calls"][0]
    assert "request" in cap["calls"][0]  # a copy was changed, not the object given
    assert result["ng_trajectory"]["model_calls"][0]["request"] == responses_raw(0)["request"]
    assert list(result) == ["ng_model_call_capture", "ng_trajectory"]

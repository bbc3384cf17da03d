from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from rollcap.evidence import (
    AgentInvocation,
    AgentObservationBundle,
    ContextCompactionObservation,
    ModelCallRef,
    SandboxObservation,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryToolCall,
    TrajectoryTurn,
)
from rollcap.evidence._models import dump, gap_from_json
from rollcap.records import Gap
from tests.evidence.conftest import POLICY, bundle, invocation

# A tool call that completed before it started: refused (the why and the words are tested apart).
BACKWARDS_TOOL_CALL = bundle(
    {
        "kind": "tool_call",
        "invocation_id": "a",
        "tool_call_id": "t",
        "started_at": 2.0,
        "completed_at": 1.0,
    }
)

# Declaration order of every model (EVIDENCE.md sections 2 and 5.1).
KEYS: dict[type[BaseModel], list[str]] = {
    ModelCallRef: ["model_call_id", "model_ref", "response_id"],
    AgentInvocation: [
        "kind",
        "invocation_id",
        "parent_invocation_id",
        "spawned_by_tool_call_id",
        "status",
        "duration_ms",
        "error_type",
        "model_calls",
        "conversation",
    ],
    ToolCallObservation: [
        "kind",
        "invocation_id",
        "tool_call_id",
        "sandbox_id",
        "tool_name",
        "started_at",
        "completed_at",
        "duration_ms",
        "timing_source",
        "status",
        "error_type",
    ],
    ContextCompactionObservation: [
        "kind",
        "invocation_id",
        "observed_at",
        "trigger",
        "tokens_before",
        "tokens_after",
        "outcome",
        "summary",
        "first_kept_item_id",
        "before_model_call",
        "model_calls",
        "after_model_call",
    ],
    SandboxObservation: [
        "kind",
        "role",
        "provider",
        "sandbox_id",
        "outcome",
        "exit_code",
        "wall_time_s",
        "cpu_time_s",
        "peak_memory_mib",
        "resource_usage_source",
        "error_type",
    ],
    AgentObservationBundle: ["source", "records", "gaps"],
    TrajectoryTurn: [
        "invocation_id",
        "task_id",
        "rollout_id",
        "turn_no",
        "timestamp",
        "question",
        "answer",
        "reasoning_content",
        "resolved",
        "step_count",
        "model_calls",
    ],
    TrajectoryModelCall: [
        "model_call_id",
        "started_at",
        "completed_at",
        "duration_ms",
        "request",
        "response",
        "response_metadata",
        "token_stats",
    ],
    TrajectoryRecord: [
        "schema_version",
        "task_id",
        "rollout_id",
        "invocations",
        "turns",
        "model_calls",
        "tool_calls",
        "gaps",
    ],
}
MINIMAL: dict[type[BaseModel], dict[str, Any]] = {
    ModelCallRef: {"model_call_id": "a"},
    AgentInvocation: {"invocation_id": "i"},
    ToolCallObservation: {"invocation_id": "i", "tool_call_id": "t"},
    ContextCompactionObservation: {"invocation_id": "i"},
    SandboxObservation: {"role": "agent"},
    AgentObservationBundle: {"source": "s"},
    TrajectoryTurn: {
        "invocation_id": "i",
        "task_id": "t",
        "rollout_id": "r",
        "turn_no": 1,
        "timestamp": 0,
    },
    TrajectoryModelCall: {},
    TrajectoryRecord: {"task_id": "t", "rollout_id": "r"},
}


@pytest.mark.parametrize("model", list(KEYS), ids=lambda m: m.__name__)
def test_a_dump_has_every_field_in_declaration_order(model: type[BaseModel]) -> None:
    dumped = dump(model.model_validate(MINIMAL[model]))
    assert list(dumped) == KEYS[model]
    assert model.model_validate(dumped) == model.model_validate(MINIMAL[model])


def test_nested_dumps_are_whole_too() -> None:
    call = dump(TrajectoryModelCall())
    assert list(call["response_metadata"]) == [
        "response_id",
        "model_ref",
        "model",
        "dialect",
        "status_code",
        "response_status",
        "finish_reason",
        "upstream_attempted",
        "response_source",
        "upstream_status_code",
        "local_response_reason",
        "error_category",
        "latency_ttft_ms",
    ]
    assert set(call["response_metadata"].values()) == {None}
    assert list(call["token_stats"]) == [
        "prompt_tokens",
        "completion_tokens",
        "reasoning_tokens",
        "total_tokens",
        "cached_tokens",
    ]
    tool = dump(TrajectoryToolCall(invocation_id="i", tool_call_id="t"))
    assert list(tool) == [*KEYS[ToolCallObservation], "output"]
    record = dump(TrajectoryRecord(task_id="t", rollout_id="r"))
    assert record["schema_version"] == "1.0"


@pytest.mark.parametrize(
    "ref",
    [
        {"model_call_id": "a"},
        {"model_ref": POLICY, "response_id": "r"},
        {"model_call_id": "a", "model_ref": POLICY},
        {"model_call_id": "", "model_ref": POLICY, "response_id": "r"},
    ],
)
def test_a_ref_needs_an_id_or_a_server_and_a_response_id(ref: dict[str, Any]) -> None:
    ModelCallRef.model_validate(ref)


@pytest.mark.parametrize(
    "ref",
    [
        {},
        {"response_id": "r"},
        {"model_ref": POLICY},
        {"model_call_id": ""},
        {"model_ref": POLICY, "response_id": ""},
        {"model_ref": {"type": "resources_servers", "name": "x"}, "response_id": "r"},
        {"model_ref": {"type": "responses_api_models"}, "response_id": "r"},
        {"model_call_id": "a", "extra": 1},
        {"model_call_id": 7},
    ],
)
def test_a_ref_without_a_key_is_invalid(ref: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ModelCallRef.model_validate(ref)


def test_a_server_ref_drops_keys_beyond_type_and_name() -> None:
    ref = ModelCallRef.model_validate({"model_ref": {**POLICY, "port": 1}, "response_id": "r"})
    assert dump(ref)["model_ref"] == POLICY


def test_lax_mode_coerces_integral_floats_and_ints() -> None:
    compaction = ContextCompactionObservation.model_validate(
        {"invocation_id": "i", "tokens_before": 3.0, "observed_at": 5}
    )
    assert compaction.tokens_before == 3
    assert type(dump(compaction)["tokens_before"]) is int
    assert dump(compaction)["observed_at"] == 5.0
    with pytest.raises(ValidationError):
        ContextCompactionObservation.model_validate({"invocation_id": "i", "tokens_before": 3.5})
    with pytest.raises(ValidationError):
        ContextCompactionObservation.model_validate({"invocation_id": "i", "tokens_before": -1})


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({**bundle(invocation("a")), "x": 1}, "extra"),
        (bundle({"kind": "turn", "invocation_id": "a"}), "legacy kind"),
        (bundle({"invocation_id": "a"}), "no kind"),
        (bundle(invocation("a"), invocation("a")), "duplicate id"),
        (bundle(invocation("a", parent_invocation_id="a")), "self parent"),
        (
            bundle(
                invocation("a", parent_invocation_id="b"),
                invocation("b", parent_invocation_id="c"),
                invocation("c", parent_invocation_id="a"),
            ),
            "cycle",
        ),
        (bundle(invocation("a", surprise=True)), "unknown key in a record"),
        (
            bundle({"kind": "tool_call", "invocation_id": "a", "tool_call_id": "t", "output": "o"}),
            "tool output",
        ),
        (
            BACKWARDS_TOOL_CALL,
            "completed before started",
        ),
        (bundle(invocation("a", duration_ms=-1)), "negative duration"),
        (bundle(invocation("a", status="done")), "status outside the literals"),
        (bundle(invocation("a", conversation=[{"role": "tool"}])), "item that fits nothing"),
        (bundle(gaps=[{"invocation_id": "a"}]), "gap without code"),
        (bundle(gaps=[{"code": "g", "why": "x"}]), "gap with unknown key"),
        ({"records": []}, "no source"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_invalid_bundles(value: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValidationError):
        AgentObservationBundle.model_validate(value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (
            bundle(invocation("a", parent_invocation_id="a")),
            "parent_invocation_id must not form a cycle",
        ),
        (
            bundle(
                invocation("a", parent_invocation_id="b"),
                invocation("b", parent_invocation_id="a"),
            ),
            "parent_invocation_id must not form a cycle",
        ),
        (
            bundle(invocation("a"), invocation("a")),
            "invocation_id must be unique within an observation bundle",
        ),
        (
            BACKWARDS_TOOL_CALL,
            "completed_at must not precede started_at",
        ),
    ],
)
def test_bundle_errors_are_worded_as_nemo_gym_words_them(value: dict[str, Any], words: str) -> None:
    # Code written for NeMo Gym's models matches on these words.
    with pytest.raises(ValidationError, match=words):
        AgentObservationBundle.model_validate(value)


def test_a_parent_outside_the_bundle_is_a_legal_partial_tree() -> None:
    parsed = AgentObservationBundle.model_validate(
        bundle(invocation("child", parent_invocation_id="elsewhere"), invocation("root"))
    )
    assert [inv.invocation_id for inv in parsed.invocations()] == ["child", "root"]


def test_the_gap_type_is_the_projects_gap() -> None:
    parsed = AgentObservationBundle.model_validate(bundle(gaps=[{"code": "g", "detail": "d"}]))
    assert parsed.gaps == [Gap("g", "d")]
    assert dump(parsed)["gaps"] == [{"code": "g", "invocation_id": None, "detail": "d"}]
    assert gap_from_json(Gap("x")) == Gap("x")
    with pytest.raises(ValueError, match="string"):
        gap_from_json({"code": "g", "detail": 3})
    with pytest.raises(ValueError, match="object"):
        gap_from_json("g")


def test_assignment_is_validated() -> None:
    inv = AgentInvocation(invocation_id="i")
    with pytest.raises(ValidationError):
        inv.status = "nope"  # type: ignore[assignment]


def _turn(**fields: Any) -> dict[str, Any]:
    return {**MINIMAL[TrajectoryTurn], **fields}


@pytest.mark.parametrize(
    "record",
    [
        {"task_id": "t", "rollout_id": "r", "invocations": [{"invocation_id": "a"}] * 2},
        {"task_id": "t", "rollout_id": "r", "model_calls": [{"model_call_id": "x"}] * 2},
        {"task_id": "t", "rollout_id": "r", "turns": [_turn(task_id="t", rollout_id="other")]},
        {
            "task_id": "t",
            "rollout_id": "r",
            "turns": [_turn(task_id="t", rollout_id="r")] * 2,
        },
        {
            "task_id": "t",
            "rollout_id": "r",
            "turns": [_turn(task_id="t", rollout_id="r", turn_no=0)],
        },
        {"task_id": "t", "rollout_id": "r", "schema_version": 1},
        {"task_id": "t", "rollout_id": "r", "calls": []},
        {"task_id": "t", "rollout_id": "r", "model_calls": [{"duration_ms": -1}]},
        {"rollout_id": "r"},
    ],
)
def test_invalid_trajectories(record: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TrajectoryRecord.model_validate(record)


@pytest.mark.parametrize(
    ("record", "words"),
    [
        (
            {"task_id": "t", "rollout_id": "r", "invocations": [{"invocation_id": "a"}] * 2},
            "invocation_id must be unique within a trajectory",
        ),
        (
            {"task_id": "t", "rollout_id": "r", "model_calls": [{"model_call_id": "x"}] * 2},
            "model_call_id must be unique within a trajectory",
        ),
        (
            {"task_id": "t", "rollout_id": "r", "turns": [_turn(task_id="t", rollout_id="o")]},
            "turn identity must match the trajectory",
        ),
        (
            {"task_id": "t", "rollout_id": "r", "turns": [_turn(task_id="t", rollout_id="r")] * 2},
            "turn number must be unique within an invocation",
        ),
    ],
)
def test_trajectory_errors_are_worded_as_nemo_gym_words_them(
    record: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValidationError, match=words):
        TrajectoryRecord.model_validate(record)


def test_calls_without_an_id_may_repeat() -> None:
    record = TrajectoryRecord.model_validate(
        {"task_id": "t", "rollout_id": "r", "model_calls": [{}, {"model_call_id": ""}, {}]}
    )
    assert len(record.model_calls) == 3

"""``ng_trajectory``: built from the agent's evidence and the captured calls (pure).

``build_trajectory(row, result)`` follows EVIDENCE.md section 5.3, in order: the agent's own
(producer) trajectory, then its observation bundle, turns sorted, the captured calls
projected, the capture gaps copied, turns built from the calls when the agent sent no
trajectory, the final gaps; the record is validated and dumped whole. It raises when the
evidence cannot make a valid record (a negative latency, two calls with one id, ...).

``attach_trajectory_record(row, result)`` puts the trajectory on the line and moves the
payloads there: the attachment's calls drop theirs. When building raises, there is no
trajectory, the payloads stay, and ``trajectory_projection_failed`` (with the exception's
class name) goes to the capture gaps, else the bundle's, else a minimal trajectory (section 6).
``attach_trajectory`` does the same and returns the record it dumped, and takes the bundle a
merge joined as the model it is: what the pipeline built itself is read as built, never
validated again from its dump; the agent's own evidence always is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from rollcap.evidence._codes import (
    CAPTURE_KEY,
    GAP_AGENT_OBSERVATIONS_INVALID,
    GAP_CAPTURE_GAP_INVALID,
    GAP_CONVERSATION_UNAVAILABLE,
    GAP_MODEL_CALLS_UNAVAILABLE,
    GAP_PRODUCER_IDENTITY_MISMATCH,
    GAP_PRODUCER_TRAJECTORY_INVALID,
    GAP_TURNS_UNAVAILABLE,
    OBSERVATIONS_KEY,
    PAYLOAD_KEYS,
    TRAJECTORY_KEY,
)
from rollcap.evidence._join import dedupe_gaps
from rollcap.evidence._models import (
    SCHEMA_VERSION,
    AgentInvocation,
    AgentObservationBundle,
    ModelCallRef,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryToolCall,
    TrajectoryTurn,
    dump,
    gap_from_json,
)
from rollcap.ids import record_rollout_id
from rollcap.records import GAP_TRAJECTORY_PROJECTION_FAILED, Gap

__all__ = [
    "attach_trajectory",
    "attach_trajectory_record",
    "build_trajectory",
    "trajectory_identity",
    "turn_content",
]

_TASK_ID_KEYS = ("task_id", "problem_id", "instance_id")
_METADATA_KEYS = (
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
)
_TOKEN_KEYS = (
    ("tokens_in", "prompt_tokens"),
    ("tokens_out", "completion_tokens"),
    ("tokens_reasoning", "reasoning_tokens"),
    ("tokens_total", "total_tokens"),
    ("cached_tokens", "cached_tokens"),
)


def trajectory_identity(row: Mapping[str, Any]) -> tuple[str, str]:
    """``(task_id, rollout_id)`` of the trajectory of ``row`` (section 5.2).

    ``task_id``: the first non-null of the row's ``task_id``, ``problem_id``, ``instance_id``,
    else its task index, as a string. ``rollout_id``: the row's capture rollout id.
    """
    task_id = next((row[key] for key in _TASK_ID_KEYS if row.get(key) is not None), None)
    if task_id is None:
        task_id = row["_ng_task_index"]
    rollout_id = record_rollout_id(row)
    if rollout_id is None:
        rollout_id = f"{row.get('_ng_task_index')}-{row.get('_ng_rollout_index')}"
    return str(task_id), rollout_id


def _class_name(exc: BaseException) -> str:
    return type(exc).__name__


def _non_null(model: BaseModel) -> dict[str, Any]:
    return {key: value for key, value in dump(model).items() if value is not None}


def _merge_tool(
    base: dict[str, Any], observed: ToolCallObservation, invocations: list[AgentInvocation]
) -> TrajectoryToolCall:
    """The producer's tool call (or nothing) overlaid with the observed one, and its output."""
    for key, value in _non_null(observed).items():
        if key == "status" and value == "unknown" and base.get("status") not in (None, "unknown"):
            continue
        base[key] = value
    output = None
    for invocation in invocations:
        if invocation.invocation_id != observed.invocation_id:
            continue
        for item in invocation.conversation:
            if (
                item.get("type") == "function_call_output"
                and item.get("call_id") == observed.tool_call_id
            ):
                output = item.get("output")
    base["output"] = output
    return TrajectoryToolCall.model_validate(base)


def _project_call(call: Mapping[str, Any]) -> TrajectoryModelCall:
    metadata = {key: call[key] for key in _METADATA_KEYS if call.get(key) is not None}
    response = call.get("response")
    if response is None:
        response = call.get("response_raw")
    request = call.get("request")
    if request is None:
        request = call.get("request_raw")
    if (
        "response_status" not in metadata
        and isinstance(response, dict)
        and isinstance(response.get("status"), str)
    ):
        metadata["response_status"] = response["status"]
    tokens = {}
    for source, target in _TOKEN_KEYS:
        value = call.get(source)
        tokens[target] = value if type(value) is int and value >= 0 else None
    return TrajectoryModelCall.model_validate(
        {
            "model_call_id": call.get("model_call_id"),
            "started_at": call.get("started_at"),
            "completed_at": call.get("completed_at"),
            "duration_ms": call.get("latency_total_ms"),
            "request": request,
            "response": response,
            "response_metadata": metadata,
            "token_stats": tokens,
        }
    )


def _absorb(producer: TrajectoryModelCall, projected: TrajectoryModelCall) -> TrajectoryModelCall:
    merged = dump(producer)
    merged["response_metadata"].update(_non_null(projected.response_metadata))
    merged["token_stats"].update(_non_null(projected.token_stats))
    for key, value in _non_null(projected).items():
        if key not in ("response_metadata", "token_stats"):
            merged[key] = value
    return TrajectoryModelCall.model_validate(merged)


def turn_content(request: Any, response: Any) -> tuple[Any, Any, Any, int]:
    """``(question, answer, reasoning_content, tool_count)`` of one call (section 5.4)."""
    if isinstance(request, dict):
        if "input" in request:
            question = request["input"]
            if isinstance(question, list):
                question = [
                    {"type": "message", **item}
                    if isinstance(item, dict) and "role" in item and "type" not in item
                    else item
                    for item in question
                ]
        else:
            question = request.get("messages")
    else:
        question = request
    if isinstance(response, dict) and isinstance(response.get("output"), list):
        items = [item for item in response["output"] if isinstance(item, dict)]
        reasoning = [item for item in items if item.get("type") == "reasoning"]
        answer = [item for item in items if item.get("type") != "reasoning"]
        tools = sum(1 for item in answer if item.get("type") == "function_call")
        return question, answer, reasoning or None, tools
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        if not isinstance(message, dict):
            message = {}
        reasoning_text = message.get("reasoning_content") or message.get("reasoning")
        answer_message = {
            key: value
            for key, value in message.items()
            if key not in ("reasoning_content", "reasoning")
        }
        tool_calls = message.get("tool_calls")
        tools = len(tool_calls) if isinstance(tool_calls, list) else 0
        return question, answer_message, reasoning_text, tools
    return question, None, None, 0


def _turns_from_calls(
    invocations: list[AgentInvocation],
    model_calls: list[TrajectoryModelCall],
    task_id: str,
    rollout_id: str,
) -> list[TrajectoryTurn]:
    by_call: dict[str, str] = {}
    by_response: dict[str, str] = {}
    for invocation in invocations:
        for ref in invocation.model_calls:
            if ref.model_call_id:
                by_call[ref.model_call_id] = invocation.invocation_id
            if ref.response_id:
                by_response[ref.response_id] = invocation.invocation_id
    turns: list[TrajectoryTurn] = []
    count: dict[str, int] = {}
    steps: dict[str, int] = {}
    for call in model_calls:
        if call.response is None:
            continue
        owner = by_call.get(call.model_call_id) if call.model_call_id else None
        response_id = call.response_metadata.response_id
        if owner is None and response_id:
            owner = by_response.get(response_id)
        if owner is None:
            continue
        question, answer, reasoning, tools = turn_content(call.request, call.response)
        count[owner] = count.get(owner, 0) + 1
        turns.append(
            TrajectoryTurn(
                invocation_id=owner,
                task_id=task_id,
                rollout_id=rollout_id,
                turn_no=count[owner],
                timestamp=call.started_at or call.completed_at or 0.0,
                question=question,
                answer=answer,
                reasoning_content=reasoning,
                step_count=steps.get(owner, 0),
                model_calls=[
                    ModelCallRef(
                        model_call_id=call.model_call_id,
                        model_ref=call.response_metadata.model_ref,
                        response_id=response_id,
                    )
                ],
            )
        )
        steps[owner] = steps.get(owner, 0) + tools
    return turns


def build_trajectory(row: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ng_trajectory`` dump of a rollout (section 5.3); raises when it cannot be made."""
    return dump(_build(row, result, None))


def _build(
    row: Mapping[str, Any], result: Mapping[str, Any], joined: AgentObservationBundle | None
) -> TrajectoryRecord:
    """``build_trajectory``'s record; ``joined``, when given, is the bundle that
    ``result["ng_agent_observations"]`` was dumped from, read instead of its dump."""
    task_id, rollout_id = trajectory_identity(row)
    gaps: list[Gap] = []
    invocations: list[AgentInvocation] = []
    turns: list[TrajectoryTurn] = []
    tools: list[TrajectoryToolCall] = []
    model_calls: list[TrajectoryModelCall] = []
    producer_valid = False

    # A. The agent's own trajectory.
    producer = result.get(TRAJECTORY_KEY)
    if isinstance(producer, dict):
        try:
            record = TrajectoryRecord.model_validate(producer)
        except Exception as exc:
            gaps.append(Gap(GAP_PRODUCER_TRAJECTORY_INVALID, _class_name(exc)))
        else:
            producer_valid = True
            differ = [
                name
                for name, ours in (("task_id", task_id), ("rollout_id", rollout_id))
                if getattr(record, name) != ours
            ]
            if differ:
                gaps.append(Gap(GAP_PRODUCER_IDENTITY_MISMATCH, ",".join(differ)))
                for turn in record.turns:
                    turn.task_id = task_id
                    turn.rollout_id = rollout_id
            gaps.extend(record.gaps)
            invocations = list(record.invocations)
            turns = list(record.turns)
            tools = list(record.tool_calls)
            model_calls = list(record.model_calls)

    # B. The agent's observations (the joined bundle, after a merge).
    observations = result.get(OBSERVATIONS_KEY)
    if observations is not None:
        try:
            bundle = (
                AgentObservationBundle.model_validate(observations) if joined is None else joined
            )
        except Exception as exc:
            gaps.append(Gap(GAP_AGENT_OBSERVATIONS_INVALID, _class_name(exc)))
        else:
            gaps.extend(bundle.gaps)
            known = {invocation.invocation_id for invocation in invocations}
            for invocation in bundle.invocations():
                if invocation.invocation_id not in known:
                    invocations.append(invocation)
                    known.add(invocation.invocation_id)
            try:
                for observed in bundle.records:
                    if not isinstance(observed, ToolCallObservation):
                        continue
                    key = (observed.invocation_id, observed.tool_call_id)
                    at = next(
                        (
                            i
                            for i, tool in enumerate(tools)
                            if (tool.invocation_id, tool.tool_call_id) == key
                        ),
                        None,
                    )
                    base = {} if at is None else dump(tools[at])
                    merged = _merge_tool(base, observed, invocations)
                    if at is None:
                        tools.append(merged)
                    else:
                        tools[at] = merged
            except Exception as exc:
                gaps.append(Gap(GAP_AGENT_OBSERVATIONS_INVALID, _class_name(exc)))

    # C. The producer's turns, in time order.
    turns.sort(key=lambda turn: (turn.timestamp, turn.invocation_id, turn.turn_no))

    # D. The captured calls, merged into the producer's calls of the same id.
    capture = result.get(CAPTURE_KEY)
    calls = capture.get("calls") if isinstance(capture, dict) else None
    if isinstance(calls, list):
        producer_at = {
            call.model_call_id: i for i, call in enumerate(model_calls) if call.model_call_id
        }
        absorbed: set[int] = set()
        for call in calls:
            if not isinstance(call, dict):
                continue
            projected = _project_call(call)
            at = producer_at.get(projected.model_call_id) if projected.model_call_id else None
            if at is not None and at not in absorbed:
                absorbed.add(at)
                model_calls[at] = _absorb(model_calls[at], projected)
            else:
                model_calls.append(projected)

    # E. The capture gaps.
    capture_gaps = capture.get("gaps") if isinstance(capture, dict) else None
    if isinstance(capture_gaps, list):
        for gap in capture_gaps:
            if not isinstance(gap, dict):
                continue
            try:
                gaps.append(gap_from_json(gap))
            except ValueError:
                gaps.append(Gap(GAP_CAPTURE_GAP_INVALID))

    # F. Turns from the calls, unless the agent sent a trajectory (even an invalid one).
    if not isinstance(producer, dict):
        turns = _turns_from_calls(invocations, model_calls, task_id, rollout_id)
        resolved = result.get("resolved")
        if isinstance(resolved, bool) and turns:
            turns[-1].resolved = resolved

    # G. What is missing.
    if not model_calls:
        gaps.append(Gap(GAP_MODEL_CALLS_UNAVAILABLE))
    if not turns and not producer_valid:
        gaps.append(Gap(GAP_TURNS_UNAVAILABLE))
    if not any(invocation.conversation for invocation in invocations):
        gaps.append(Gap(GAP_CONVERSATION_UNAVAILABLE))

    # H. One valid record.
    return TrajectoryRecord(
        task_id=task_id,
        rollout_id=rollout_id,
        invocations=invocations,
        turns=turns,
        model_calls=model_calls,
        tool_calls=tools,
        gaps=dedupe_gaps(gaps),
    )


def attach_trajectory_record(row: Mapping[str, Any], result: dict[str, Any]) -> bool:
    """Set ``result["ng_trajectory"]`` and drop the attached calls' payloads (section 6).

    Returns whether a trajectory was built. A failure keeps the payloads and records
    ``trajectory_projection_failed``; the agent's own ``ng_trajectory`` is gone either way.
    """
    return attach_trajectory(row, result) is not None


def attach_trajectory(
    row: Mapping[str, Any],
    result: dict[str, Any],
    *,
    joined: AgentObservationBundle | None = None,
) -> TrajectoryRecord | None:
    """``attach_trajectory_record``, returning the record it dumped to ``ng_trajectory``
    (``None``: none was built). ``joined``: the bundle a merge dumped to
    ``result["ng_agent_observations"]``, built on as it is instead of validating its dump."""
    try:
        record = _build(row, result, joined)
        trajectory = dump(record)
    except Exception as exc:
        _record_failure(row, result, _class_name(exc))
        return None
    result[TRAJECTORY_KEY] = trajectory
    capture = result.get(CAPTURE_KEY)
    calls = capture.get("calls") if isinstance(capture, dict) else None
    if isinstance(capture, dict) and isinstance(calls, list):
        # Copies, in place of the originals: an agent's own objects are never changed.
        result[CAPTURE_KEY] = {
            **capture,
            "calls": [
                {k: v for k, v in call.items() if k not in PAYLOAD_KEYS}
                if isinstance(call, dict)
                else call
                for call in calls
            ],
        }
    return record


def _record_failure(row: Mapping[str, Any], result: dict[str, Any], name: str) -> None:
    result.pop(TRAJECTORY_KEY, None)
    gap = Gap(GAP_TRAJECTORY_PROJECTION_FAILED, name)
    for key in (CAPTURE_KEY, OBSERVATIONS_KEY):
        target = result.get(key)
        if not isinstance(target, dict):
            continue
        gaps = target.get("gaps", [])
        if isinstance(gaps, list):
            # A copy: the agent's own objects are never changed under it.
            result[key] = {**target, "gaps": [*gaps, gap.to_dict()]}
            return
        break
    try:
        task_id, rollout_id = trajectory_identity(row)
    except Exception:
        task_id = str(row.get("_ng_task_index"))
        rollout_id = f"{row.get('_ng_task_index')}-{row.get('_ng_rollout_index')}"
    result[TRAJECTORY_KEY] = {
        "schema_version": SCHEMA_VERSION,
        "task_id": task_id,
        "rollout_id": rollout_id,
        "invocations": [],
        "turns": [],
        "model_calls": [],
        "tool_calls": [],
        "gaps": [gap.dump()],
    }

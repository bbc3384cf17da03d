"""The evidence models: agent observations and the trajectory record (pure).

Field names, types, defaults and order are EVIDENCE.md's (sections 2 and 5.1). Validation is
pydantic's lax mode: an ``int`` field takes ``3.0``, a ``float`` field takes ``3``. Every
model refuses unknown keys and re-validates on assignment. ``dump`` writes every field, nulls
and defaults included, in declaration order; a failure is a ``pydantic.ValidationError``,
whose class name is what a gap's ``detail`` reports.

A gap is ``rollcap.records.Gap``, the project's one gap type, validated here as an object with
``code`` (required), ``invocation_id`` and ``detail`` (strings or null) and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    model_validator,
)

from rollcap.evidence._items import ConversationItem
from rollcap.records import MODEL_REF_TYPE, Gap

__all__ = [
    "SCHEMA_VERSION",
    "AgentInvocation",
    "AgentObservationBundle",
    "ContextCompactionObservation",
    "ModelCallRef",
    "ModelServerRef",
    "ObservationGap",
    "ObservationRecord",
    "SandboxObservation",
    "ToolCallObservation",
    "TrajectoryModelCall",
    "TrajectoryRecord",
    "TrajectoryResponseMetadata",
    "TrajectoryTokenStats",
    "TrajectoryToolCall",
    "TrajectoryTurn",
    "dump",
    "gap_from_json",
    "server_ref_key",
]

SCHEMA_VERSION: Literal["1.0"] = "1.0"

_GAP_KEYS = frozenset(("code", "invocation_id", "detail"))


def gap_from_json(value: object) -> Gap:
    """A gap from its JSON object; ``ValueError`` when it is not one."""
    if isinstance(value, Gap):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"a gap is a JSON object, not {type(value).__name__}")
    unknown = set(value) - _GAP_KEYS
    if unknown:
        raise ValueError(f"a gap has no {', '.join(sorted(map(str, unknown)))}")
    code = value.get("code")
    if not isinstance(code, str):
        raise ValueError("a gap needs a string code")
    optional = [value.get("invocation_id"), value.get("detail")]
    if any(v is not None and not isinstance(v, str) for v in optional):
        raise ValueError("a gap's invocation_id and detail are strings or null")
    return Gap(code, detail=optional[1], invocation_id=optional[0])


def _dump_gap(gap: Gap) -> dict[str, str | None]:
    return gap.dump()


ObservationGap: TypeAlias = Annotated[
    Gap, PlainValidator(gap_from_json), PlainSerializer(_dump_gap, return_type=dict[str, Any])
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelServerRef(BaseModel):
    """``{type: "responses_api_models", name}``: which model server answered a call.

    Keys beyond the two are dropped, as a server reference elsewhere in a config is read.
    """

    type: Literal["responses_api_models"]
    name: str


class ModelCallRef(_Model):
    """An exact reference to one captured call: its id, or its server and response id."""

    model_call_id: str | None = None
    model_ref: ModelServerRef | None = None
    response_id: str | None = None

    @model_validator(mode="after")
    def _has_a_key(self) -> Self:
        if not self.model_call_id and not (self.model_ref is not None and self.response_id):
            raise ValueError("model_call_id or both model_ref and response_id are required")
        return self

    def key(self) -> tuple[str | None, tuple[str, str] | None, str | None]:
        """``(model_call_id, (type, name), response_id)``, comparable with a call's."""
        ref = None if self.model_ref is None else (self.model_ref.type, self.model_ref.name)
        return (self.model_call_id, ref, self.response_id)


class AgentInvocation(_Model):
    """One root agent or subagent conversation."""

    kind: Literal["agent_invocation"] = "agent_invocation"
    invocation_id: str
    parent_invocation_id: str | None = None
    spawned_by_tool_call_id: str | None = None
    status: Literal["completed", "failed", "incomplete", "unknown"] = "unknown"
    duration_ms: float | None = Field(default=None, ge=0)
    error_type: str | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    conversation: list[ConversationItem] = Field(default_factory=list)


class ToolCallObservation(_Model):
    """Timing and outcome of one tool call; its output belongs to the conversation."""

    kind: Literal["tool_call"] = "tool_call"
    invocation_id: str
    tool_call_id: str
    sandbox_id: str | None = None
    tool_name: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: float | None = Field(default=None, ge=0)
    timing_source: Literal["executor", "artifact", "harness"] | None = None
    status: Literal["completed", "failed", "timeout", "cancelled", "incomplete", "unknown"] = (
        "unknown"
    )
    error_type: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if (
            self.started_at is not None
            and self.completed_at is not None
            and self.completed_at < self.started_at
        ):
            raise ValueError("completed_at must not precede started_at")
        return self


class ContextCompactionObservation(_Model):
    """One compaction of an invocation's context, and the calls around and inside it."""

    kind: Literal["context_compaction"] = "context_compaction"
    invocation_id: str
    observed_at: float | None = None
    trigger: str | None = None
    tokens_before: int | None = Field(default=None, ge=0)
    tokens_after: int | None = Field(default=None, ge=0)
    outcome: Literal["completed", "failed", "aborted", "unknown"] = "unknown"
    summary: str | None = None
    first_kept_item_id: str | None = None
    before_model_call: ModelCallRef | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    after_model_call: ModelCallRef | None = None


class SandboxObservation(_Model):
    """Outcome and measured resource use of one sandbox."""

    kind: Literal["sandbox"] = "sandbox"
    role: Literal["agent", "verifier", "environment"]
    provider: str | None = None
    sandbox_id: str | None = None
    outcome: Literal[
        "completed", "failed", "timeout", "oom", "sandbox_error", "cancelled", "unknown"
    ] = "unknown"
    exit_code: int | None = None
    wall_time_s: float | None = Field(default=None, ge=0)
    cpu_time_s: float | None = Field(default=None, ge=0)
    peak_memory_mib: float | None = Field(default=None, ge=0)
    resource_usage_source: str | None = None
    error_type: str | None = None


ObservationRecord: TypeAlias = Annotated[
    AgentInvocation | ToolCallObservation | ContextCompactionObservation | SandboxObservation,
    Field(discriminator="kind"),
]


# The validation messages start with NeMo Gym's words for the same failure: code written for
# its models matches on them.


def _check_unique_ids(invocations: list[AgentInvocation], within: str) -> None:
    ids = [invocation.invocation_id for invocation in invocations]
    if len(ids) != len(set(ids)):
        raise ValueError(f"invocation_id must be unique within {within}")


def _check_invocations(invocations: list[AgentInvocation]) -> None:
    """Unique ids, and no invocation its own ancestor (a parent outside the list is fine)."""
    _check_unique_ids(invocations, "an observation bundle")
    parents = {inv.invocation_id: inv.parent_invocation_id for inv in invocations}
    for start in parents:
        seen = {start}
        parent = parents[start]
        while parent is not None and parent in parents:
            if parent in seen:
                raise ValueError(
                    f"parent_invocation_id must not form a cycle: invocation {start!r} is its "
                    "own ancestor"
                )
            seen.add(parent)
            parent = parents[parent]


class AgentObservationBundle(_Model):
    """What an agent observed of its own rollout (``ng_agent_observations``)."""

    source: str
    records: list[ObservationRecord] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _invocation_graph(self) -> Self:
        _check_invocations(self.invocations())
        return self

    def invocations(self) -> list[AgentInvocation]:
        return [record for record in self.records if isinstance(record, AgentInvocation)]


class TrajectoryTurn(_Model):
    """One model turn of an invocation."""

    invocation_id: str
    task_id: str
    rollout_id: str
    turn_no: int = Field(ge=1)
    timestamp: float
    question: Any = None
    answer: Any = None
    reasoning_content: Any = None
    resolved: bool | None = None
    step_count: int = Field(default=0, ge=0)
    model_calls: list[ModelCallRef] = Field(default_factory=list)


class TrajectoryResponseMetadata(_Model):
    response_id: str | None = None
    model_ref: ModelServerRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    upstream_attempted: bool | None = None
    response_source: Literal["upstream", "local"] | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None
    error_category: str | None = None
    latency_ttft_ms: float | None = Field(default=None, ge=0)


class TrajectoryTokenStats(_Model):
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)


class TrajectoryModelCall(_Model):
    """One captured call as the trajectory keeps it: payloads, metadata, token counts."""

    model_call_id: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: float | None = Field(default=None, ge=0)
    request: Any = None
    response: Any = None
    response_metadata: TrajectoryResponseMetadata = Field(
        default_factory=TrajectoryResponseMetadata
    )
    token_stats: TrajectoryTokenStats = Field(default_factory=TrajectoryTokenStats)


class TrajectoryToolCall(ToolCallObservation):
    """A tool call's observation and the output the model saw."""

    output: Any = None


class TrajectoryRecord(_Model):
    """``ng_trajectory``: one rollout's invocations, turns, model calls, tool calls and gaps."""

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    task_id: str
    rollout_id: str
    invocations: list[AgentInvocation] = Field(default_factory=list)
    turns: list[TrajectoryTurn] = Field(default_factory=list)
    model_calls: list[TrajectoryModelCall] = Field(default_factory=list)
    tool_calls: list[TrajectoryToolCall] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        _check_unique_ids(self.invocations, "a trajectory")
        ids = [call.model_call_id for call in self.model_calls if call.model_call_id]
        if len(ids) != len(set(ids)):
            raise ValueError("model_call_id must be unique within a trajectory")
        turn_keys = set()
        for turn in self.turns:
            if (turn.task_id, turn.rollout_id) != (self.task_id, self.rollout_id):
                raise ValueError(
                    "turn identity must match the trajectory: a turn's task_id and rollout_id "
                    "are the record's"
                )
            key = (turn.invocation_id, turn.turn_no)
            if key in turn_keys:
                raise ValueError(
                    f"turn number must be unique within an invocation: two turns {turn.turn_no} "
                    f"in invocation {turn.invocation_id!r}"
                )
            turn_keys.add(key)
        return self


def dump(model: BaseModel) -> dict[str, Any]:
    """Every field, nulls and defaults included, in declaration order, as JSON values."""
    out: dict[str, Any] = model.model_dump(mode="json")
    return out


def server_ref_key(value: object) -> tuple[str, str] | None:
    """``(type, name)`` of a call's ``model_ref`` dict, ``None`` when it names no server."""
    if not isinstance(value, Mapping):
        return None
    name = value.get("name")
    if value.get("type") != MODEL_REF_TYPE or not isinstance(name, str):
        return None
    return (MODEL_REF_TYPE, name)

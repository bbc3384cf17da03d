"""Rollout evidence: what a finished rollout's line says about how it ran (spec/EVIDENCE.md).

One entry point, ``attach(row, answer, *, capture_dirs, observability_enabled,
rollout_latency_ms)``, turns the agent's answer into the rollout line::

    answer ──(row's identity keys)──────────────────────────────────────► line
    capture dir ─► read_capture ─► CaptureRead ─┐
                                                ├─► merge ──► ng_model_call_capture
    answer.ng_agent_observations ──► join ──────┘          └► ng_agent_observations (joined)
    answer.ng_trajectory (producer) ─┐
    line's evidence keys ────────────┴─► build_trajectory ─► ng_trajectory
                                                             └► ng_perf ─► perf_summary

Everything but ``attach`` and ``read_capture`` is pure: it takes values and returns values.
Nothing changes ``response`` or ``reward``, and damaged evidence is never an exception: it
is a gap on the line. ``rollout_for_export`` is the line as experiment trackers get it.
"""

from __future__ import annotations

from rollcap.attachment import CaptureRead
from rollcap.evidence._attach import CaptureDir, attach, read_capture
from rollcap.evidence._capture import (
    capture_object,
    merge_model_call_capture,
    payloads_redacted,
)
from rollcap.evidence._codes import CAPTURE_KEY, OBSERVATIONS_KEY, PERF_KEY, TRAJECTORY_KEY
from rollcap.evidence._compaction import associate_compaction_calls
from rollcap.evidence._export import rollout_for_export
from rollcap.evidence._join import join_model_call_observations
from rollcap.evidence._models import (
    SCHEMA_VERSION,
    AgentInvocation,
    AgentObservationBundle,
    ContextCompactionObservation,
    ModelCallRef,
    ModelServerRef,
    ObservationGap,
    SandboxObservation,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryResponseMetadata,
    TrajectoryTokenStats,
    TrajectoryToolCall,
    TrajectoryTurn,
)
from rollcap.evidence._perf import (
    aggregate_metrics_entry,
    aggregate_request_row,
    attach_ng_perf,
    build_ng_perf,
    ng_perf_of,
    perf_summary,
)
from rollcap.evidence._trajectory import (
    attach_trajectory,
    attach_trajectory_record,
    build_trajectory,
    trajectory_identity,
    turn_content,
)

__all__ = [
    "CAPTURE_KEY",
    "OBSERVATIONS_KEY",
    "PERF_KEY",
    "SCHEMA_VERSION",
    "TRAJECTORY_KEY",
    "AgentInvocation",
    "AgentObservationBundle",
    "CaptureDir",
    "CaptureRead",
    "ContextCompactionObservation",
    "ModelCallRef",
    "ModelServerRef",
    "ObservationGap",
    "SandboxObservation",
    "ToolCallObservation",
    "TrajectoryModelCall",
    "TrajectoryRecord",
    "TrajectoryResponseMetadata",
    "TrajectoryTokenStats",
    "TrajectoryToolCall",
    "TrajectoryTurn",
    "aggregate_metrics_entry",
    "aggregate_request_row",
    "associate_compaction_calls",
    "attach",
    "attach_ng_perf",
    "attach_trajectory",
    "attach_trajectory_record",
    "build_ng_perf",
    "build_trajectory",
    "capture_object",
    "join_model_call_observations",
    "merge_model_call_capture",
    "ng_perf_of",
    "payloads_redacted",
    "perf_summary",
    "read_capture",
    "rollout_for_export",
    "trajectory_identity",
    "turn_content",
]

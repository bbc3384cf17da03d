"""The evidence keys of a rollout line and the gap codes the pipeline emits (pure).

Capture's own codes (``model_call_capture_*``, ``trajectory_projection_failed``) live with the
capture records in ``rollcap.records``; producers' codes are free-form and pass through.
"""

from __future__ import annotations

__all__ = [
    "CAPTURE_KEY",
    "GAP_AGENT_OBSERVATIONS_INVALID",
    "GAP_CAPTURE_GAP_INVALID",
    "GAP_COMPACTION_JOIN_FAILED",
    "GAP_COMPACTION_MATCH_AMBIGUOUS",
    "GAP_CONVERSATION_UNAVAILABLE",
    "GAP_JOIN_FAILED",
    "GAP_MODEL_CALLS_UNAVAILABLE",
    "GAP_MULTIMODAL_HISTORY_REDACTED",
    "GAP_OWNERSHIP_UNAVAILABLE",
    "GAP_PRODUCER_IDENTITY_MISMATCH",
    "GAP_PRODUCER_TRAJECTORY_INVALID",
    "GAP_REFERENCE_AMBIGUOUS",
    "GAP_REFERENCE_CONFLICT",
    "GAP_REFERENCE_UNMATCHED",
    "GAP_TURNS_UNAVAILABLE",
    "OBSERVATIONS_KEY",
    "PAYLOAD_KEYS",
    "PERF_KEY",
    "TRAJECTORY_KEY",
]

CAPTURE_KEY = "ng_model_call_capture"
OBSERVATIONS_KEY = "ng_agent_observations"
TRAJECTORY_KEY = "ng_trajectory"
PERF_KEY = "ng_perf"

# A call's payloads: what the trajectory keeps and the attachment's calls give up.
PAYLOAD_KEYS = ("request", "response", "request_raw", "response_raw")

# The merge.
GAP_JOIN_FAILED = "agent_observation_join_failed"
GAP_COMPACTION_JOIN_FAILED = "compaction_model_call_join_failed"
GAP_COMPACTION_MATCH_AMBIGUOUS = "compaction_model_call_match_ambiguous"
# The join.
GAP_REFERENCE_UNMATCHED = "model_call_reference_unmatched"
GAP_REFERENCE_AMBIGUOUS = "model_call_reference_ambiguous"
GAP_REFERENCE_CONFLICT = "model_call_reference_conflict"
GAP_OWNERSHIP_UNAVAILABLE = "model_call_ownership_unavailable"
# The trajectory.
GAP_PRODUCER_TRAJECTORY_INVALID = "producer_trajectory_invalid"
GAP_PRODUCER_IDENTITY_MISMATCH = "producer_trajectory_identity_mismatch"
GAP_AGENT_OBSERVATIONS_INVALID = "agent_observations_invalid"
GAP_CAPTURE_GAP_INVALID = "model_call_capture_gap_invalid"
GAP_MODEL_CALLS_UNAVAILABLE = "model_calls_unavailable"
GAP_TURNS_UNAVAILABLE = "turns_unavailable"
GAP_CONVERSATION_UNAVAILABLE = "conversation_unavailable"
# A producer's: its presence makes the merge leave the payloads out.
GAP_MULTIMODAL_HISTORY_REDACTED = "multimodal_history_redacted"

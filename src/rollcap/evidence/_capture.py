"""The merge: ``ng_model_call_capture`` and the joined ``ng_agent_observations`` (pure).

``merge_model_call_capture(record, rollout_id, read, include_payloads=...)`` takes what a
tolerant read of the rollout's capture found (``CaptureRead``) and writes, in place:

- ``ng_agent_observations``, when the record has one, as the bundle joined with the calls
  (section 4); an invalid bundle, or a join that raises, leaves the agent's value exactly as
  sent and adds ``agent_observation_join_failed`` to the capture gaps;
- ``ng_model_call_capture``: ``{rollout_id, metrics, calls[, gaps]}``, the calls without
  their payloads unless ``include_payloads``, the gaps without null keys and only when there
  are some (EVIDENCE.md section 3.1).

The join always sees the calls' payloads; ``include_payloads`` only decides the dump. The
joined bundle comes back as the model it was dumped from, for the trajectory to build on
without validating its own dump again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollcap.attachment import CaptureRead, build_attachment
from rollcap.evidence._codes import (
    CAPTURE_KEY,
    GAP_COMPACTION_JOIN_FAILED,
    GAP_JOIN_FAILED,
    GAP_MULTIMODAL_HISTORY_REDACTED,
    OBSERVATIONS_KEY,
    TRAJECTORY_KEY,
)
from rollcap.evidence._compaction import CLAUDE_CODE_SOURCE, associate_compaction_calls
from rollcap.evidence._join import join_model_call_observations
from rollcap.evidence._models import AgentObservationBundle, dump
from rollcap.records import Gap, ModelCallRecord

__all__ = [
    "capture_object",
    "merge_model_call_capture",
    "payloads_redacted",
]


def payloads_redacted(answer: Mapping[str, Any]) -> bool:
    """Whether the agent's own evidence says it redacted multimodal history (section 7).

    Looked for by code alone, in the ``gaps`` list of the answer's ``ng_trajectory`` and
    ``ng_agent_observations`` objects; the merge then leaves every payload out.
    """
    for key in (TRAJECTORY_KEY, OBSERVATIONS_KEY):
        evidence = answer.get(key)
        if not isinstance(evidence, dict):
            continue
        gaps = evidence.get("gaps")
        if isinstance(gaps, list) and any(
            isinstance(gap, dict) and gap.get("code") == GAP_MULTIMODAL_HISTORY_REDACTED
            for gap in gaps
        ):
            return True
    return False


def capture_object(
    rollout_id: str,
    calls: Sequence[ModelCallRecord],
    gaps: Sequence[Gap],
    *,
    include_payloads: bool,
) -> dict[str, Any]:
    """``{rollout_id, metrics, calls[, gaps]}``; ``gaps`` only when there are some."""
    return build_attachment(rollout_id, calls, gaps, payloads=include_payloads, rounded=False)


def merge_model_call_capture(
    record: dict[str, Any],
    rollout_id: str,
    read: CaptureRead,
    *,
    include_payloads: bool,
) -> AgentObservationBundle | None:
    """Write the joined bundle and ``ng_model_call_capture`` into ``record``; never raises
    for what the agent sent. Returns the joined bundle whose dump it wrote (``None``: the
    record's ``ng_agent_observations``, if any, is the agent's value as sent)."""
    gaps = read.gaps()
    observations = record.get(OBSERVATIONS_KEY)
    joined = None
    if observations is not None:
        try:
            joined = _join(observations, read.calls)
            record[OBSERVATIONS_KEY] = dump(joined)
        except Exception:  # an invalid bundle included: the agent's value stays as sent
            joined = None
            gaps.append(Gap(GAP_JOIN_FAILED))
    record[CAPTURE_KEY] = capture_object(
        rollout_id, read.calls, gaps, include_payloads=include_payloads
    )
    return joined


def _join(observations: object, calls: Sequence[ModelCallRecord]) -> AgentObservationBundle:
    # The agent's bundle is validated here, and nobody else holds the model: joined in place.
    bundle = AgentObservationBundle.model_validate(observations)
    if bundle.source == CLAUDE_CODE_SOURCE:
        try:
            bundle = associate_compaction_calls(bundle, calls)
        except Exception:
            bundle.gaps = [*bundle.gaps, Gap(GAP_COMPACTION_JOIN_FAILED)]
    return join_model_call_observations(bundle, calls, copy=False)
